"""Settings that two front ends share are declared once (recurnmt/flags.py) and taken with the
same spelling, values and defaults: the run modes (compilation, mixed depth, checkpoint
segments) by fairseq-train's parser and the image trainer's, the conversion settings by both
converters."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from recurnmt.flags import CONVERSION_FLAGS, RUN_MODES, is_on, spell
from recurnmt.modules import ConfigError
from recurnmt.nmt.build import arch_train_args
from recurnmt.vision.training.arguments import parse_args as vision_args
from recurnmt.vision.training.setup import set_grad_checkpointing
from tests.test_vision_models import build_small, stacks_of

ROOT = Path(__file__).resolve().parent.parent
SPELLINGS = [
    [],
    ["--compile"],
    ["--compile", "aot_eager", "--compile-mode", "max-autotune"],
    ["--mixed-depth"],
    ["--mixed-depth", "on"],
    ["--mixed-depth", "off"],
    ["--checkpoint-segment", "sqrt"],
]


@pytest.mark.parametrize("argv", SPELLINGS, ids=lambda a: " ".join(a) or "defaults")
def test_both_front_ends_read_a_run_mode_alike(argv):
    nmt = arch_train_args("ringformer_tiny", argv)
    vision = vision_args(argv)
    for flag in RUN_MODES:
        assert getattr(nmt, flag.dest) == getattr(vision, flag.dest), spell(flag)
    assert is_on(vision.mixed_depth) == ("--mixed-depth" in argv and "off" not in argv)


def test_a_bad_value_is_refused_by_both(capsys):
    with pytest.raises(SystemExit):
        vision_args(["--mixed-depth", "maybe"])
    with pytest.raises(SystemExit):
        arch_train_args("ringformer_tiny", ["--mixed-depth", "maybe"])
    assert "--mixed-depth: invalid choice: 'maybe'" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv", [[], ["--unique-layers", "2", "--init", "average", "--level-lora-rank", "full"]]
)
def test_both_converters_read_a_setting_alike(argv):
    from recurnmt.nmt.convert import build_parser as nmt_parser
    from recurnmt.vision.convert import build_parser as vision_parser

    nmt = nmt_parser().parse_args(["a.pt", "b.pt", *argv])
    vision = vision_parser().parse_args(["a.pt", "b.pt", *argv])
    for flag in CONVERSION_FLAGS:
        assert getattr(nmt, flag.dest) == getattr(vision, flag.dest), spell(flag)


def test_no_front_end_declares_a_shared_flag_again():
    """The flags of RUN_MODES and CONVERSION_FLAGS appear in an add_argument call nowhere in
    recurnmt/."""
    names = "|".join(re.escape(spell(f)) for f in (*RUN_MODES, *CONVERSION_FLAGS))
    pattern = re.compile(rf"add_argument\(\s*\"({names})\"")
    found = [
        f"{path.relative_to(ROOT)}: {m.group(1)}"
        for path in sorted((ROOT / "recurnmt").rglob("*.py"))
        for m in pattern.finditer(path.read_text(encoding="utf-8"))
    ]
    assert not found, found


@pytest.mark.parametrize(
    "name", ["ringformer_vit_mini_patch4", "sret_mini", "dvt_ringformer_vit_mini_patch2"]
)
def test_image_models_checkpoint_segments_of_levels(name):
    """The image trainer's --checkpoint-activations (its --grad-checkpointing) takes
    --checkpoint-segment as fairseq-train does: every stack of the model checkpoints segments."""
    args = vision_args(["--checkpoint-activations", "--checkpoint-segment", "2"])
    assert args.grad_checkpointing
    model = build_small(name)
    set_grad_checkpointing(model, 2)
    assert [s.checkpoint_segment for s in stacks_of(model)] == [2] * len(stacks_of(model))
    assert all(s.grad_checkpointing for s in stacks_of(model))


def test_a_model_without_levels_refuses_segments_naming_the_flag():
    model = build_small("mrla_light_resnet50")
    with pytest.raises(ConfigError, match="--checkpoint-segment.*checkpoints per block only"):
        set_grad_checkpointing(model, "sqrt")
    set_grad_checkpointing(model, 0)  # per block, as before


def test_segments_without_checkpointing_are_refused_by_both(tmp_path):
    from tests.nmt_helpers import build
    from tests.test_vision_train import train

    with pytest.raises(ConfigError, match="--checkpoint-segment.*needs --checkpoint-activations"):
        build("ringformer_tiny", "--checkpoint-segment", "2")
    build("ringformer_tiny", "--checkpoint-segment", "2", "--checkpoint-activations")
    with pytest.raises(ConfigError, match="--checkpoint-segment.*needs --checkpoint-activations"):
        train(tmp_path, "--checkpoint-segment", "2")


def test_elastic_depth_is_one_declaration_spelt_alike_everywhere():
    """Translation's model flags, the image evaluator and the export's config keys name elastic
    depth by one declaration (:func:`recurnmt.flags.levels_flag`)."""
    from recurnmt.export import elastic_depth
    from recurnmt.flags import levels_flag
    from recurnmt.hf.configuration import RecurnmtConfig
    from recurnmt.vision.training.evaluate import build_parser as vision_evaluator

    nmt = arch_train_args("ringformer_tiny", ["--encoder-levels", "3", "--decoder-levels", "2"])
    assert (nmt.encoder_levels, nmt.decoder_levels) == (3, 2)
    config = RecurnmtConfig(**elastic_depth(nmt))
    assert (config.encoder_levels, config.decoder_levels) == (3, 2)
    image = vision_evaluator().parse_args(["ckpt.pt", "--encoder-levels", "4"])
    assert getattr(image, levels_flag("encoder").dest) == 4
    assert vision_evaluator().parse_args(["ckpt.pt", "--levels", "4"]) == image  # before
    pattern = re.compile(
        r"add_argument\(\s*\"--(encoder|decoder)-levels\""
    )  # plain --levels: a size
    for path in (ROOT / "recurnmt").rglob("*.py"):
        assert not pattern.search(path.read_text(encoding="utf-8")), path
