"""Every recurnmt flag reaches the built model; impossible settings fail naming the flag."""

from __future__ import annotations

import pytest

from recurnmt.modules import ConfigError
from recurnmt.parameters import parameter_report
from tests.nmt_helpers import build


def _signature(model) -> tuple:
    """Parameter names and shapes, plus the stack configs and depth plans."""
    params = tuple((n, tuple(p.shape)) for n, p in model.named_parameters())
    stacks = (model.encoder.stack, model.decoder.stack)
    return params, tuple((s.cfg, s.plan) for s in stacks)


BASE = _signature(build("ringformer_tiny")[0])


@pytest.mark.parametrize(
    "flags",
    [
        ("--encoder-unique-layers", "3"),
        ("--decoder-unique-layers", "3"),
        (
            "--encoder-unique-layers",
            "2",
            "--decoder-unique-layers",
            "2",
            "--sharing-scheme",
            "sequence",
        ),
        ("--layer-norms", "per-block"),
        ("--level-signal", "full"),
        ("--level-signal", "static"),
        ("--level-signal", "none"),
        ("--level-signal-rank", "8"),
        ("--attn-signal", "before"),
        ("--attn-signal", "none"),
        ("--ffn-signal", "inter"),
        ("--ffn-signal", "none"),
        ("--encoder-layers", "5"),
        ("--encoder-embed-dim", "128", "--decoder-embed-dim", "128"),
        ("--activation-fn", "relu"),
        ("--encoder-normalize-before",),
    ],
)
def test_flag_changes_the_built_model(flags):
    model, _, _ = build("ringformer_tiny", *flags)
    assert _signature(model) != BASE


def test_sharing_scheme_reaches_the_plan():
    model, _, _ = build(
        "recurrent_transformer_tiny",
        "--encoder-layers",
        "4",
        "--encoder-unique-layers",
        "2",
        "--sharing-scheme",
        "sequence",
    )
    assert model.encoder.stack.plan.block_of_level == (0, 0, 1, 1)


def test_rank_flag_sets_the_signal_rank():
    model, _, _ = build("ringformer_tiny", "--level-signal-rank", "8")
    assert model.encoder.stack.levels[0].attn_signal.rank == 8


def test_default_rank_is_width_over_16():
    model, args, _ = build("ringformer_wmt_en_de")
    assert model.encoder.stack.levels[0].attn_signal.rank == 512 // 16
    assert args.activation_fn == "gelu"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--level-signal-rank", "65"), "--level-signal-rank=65"),
        (("--level-signal-rank", "0"), "--level-signal-rank=0"),
        (("--encoder-layers", "0"), "--encoder-layers=0"),
        (("--decoder-layers", "-2"), "--decoder-layers=-2"),
        (
            ("--encoder-attention-heads", "5"),
            "--encoder-attention-heads=5 does not divide --encoder-embed-dim=64",
        ),
        (("--decoder-unique-layers", "4"), "--decoder-unique-layers=4"),
        (("--activation-fn", "tanh"), "--activation-fn=tanh"),
        (("--decoder-embed-dim", "32"), "--decoder-embed-dim=32"),
        (("--encoder-layerdrop", "0.1"), "--encoder-layerdrop"),
        (("--adaptive-softmax-cutoff", "10,20"), "--adaptive-softmax-cutoff"),
    ],
)
def test_impossible_settings_fail_naming_the_flag(flags, message):
    with pytest.raises(ConfigError, match=message):
        build("ringformer_tiny", *flags)


@pytest.mark.parametrize("flag", ["--fp16", "--bf16"])
def test_half_precision_without_cuda_is_refused(flag):
    with pytest.raises(ConfigError, match=f"{flag} needs (a )?CUDA"):
        build("ringformer_tiny", flag, "--cpu")


def test_bad_choices_are_refused_by_the_parser():
    with pytest.raises(SystemExit):
        build("ringformer_tiny", "--sharing-scheme", "spiral")


def test_parameter_count_changes_with_rank():
    small = parameter_report(build("ringformer_tiny", "--level-signal-rank", "2")[0]).p_star
    large = parameter_report(build("ringformer_tiny", "--level-signal-rank", "8")[0]).p_star
    # 3 levels x 2 sides x 4 signals x 2 factors x 64 x (8 - 2)
    assert large - small == 3 * 2 * 4 * 2 * 64 * 6
