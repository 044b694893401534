"""Every recurnmt flag reaches the built model; impossible settings fail naming the flag."""

from __future__ import annotations

import re

import pytest
import torch

from recurnmt.modules import ConfigError, StackConfig
from recurnmt.modules.config import option_declarations
from recurnmt.nmt import flags as nmt_flags
from recurnmt.parameters import parameter_report
from tests.nmt_helpers import build


def _signature(model) -> tuple:
    """Parameter names and shapes, plus the stack configs and depth plans."""
    params = tuple((n, tuple(p.shape)) for n, p in model.named_parameters())
    sides = (model.encoder, model.decoder)
    return params, tuple((side.stack_cfg, side.stack.plan) for side in sides)


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
        ("--coordinate-scale", "0.5"),
        ("--block-bias", "on"),
        ("--level-signal-down-init", "kaiming"),
        ("--level-signal-down-std", "0.01"),
        ("--level-lora-rank", "4"),
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
        (
            ("--level-signal-rank", "65"),
            "--level-signal-rank=65: must lie between 1 and --encoder-embed-dim=64",
        ),
        (("--level-signal-rank", "0"), "--level-signal-rank=0: must lie between 1 and"),
        (("--encoder-layers", "0"), "--encoder-layers=0: must be a positive integer"),
        (("--decoder-layers", "-2"), "--decoder-layers=-2: must be a positive integer"),
        (
            ("--encoder-attention-heads", "5"),
            "--encoder-attention-heads=5: does not divide --encoder-embed-dim=64",
        ),
        (
            ("--decoder-unique-layers", "4"),
            "--decoder-unique-layers=4: must not exceed --decoder-layers=3",
        ),
        (("--activation-fn", "tanh"), "--activation-fn='tanh': choose one of relu, gelu"),
        (
            ("--decoder-embed-dim", "32"),
            "--decoder-embed-dim=32: must equal --encoder-embed-dim=64",
        ),
        (
            ("--level-signal", "full", "--decoder-ffn-sharing", "none"),
            "--decoder-ffn-sharing='none': removes the FFN, so it cannot carry the FFN level "
            "signal --ffn-signal='input'",
        ),
        (("--level-signal-down-std", "-1"), "--level-signal-down-std=-1.0: must be >= 0"),
        (("--encoder-layerdrop", "0.1"), "--encoder-layerdrop=0.1: LayerDrop is not supported"),
        (
            ("--level-lora-rank", "65"),
            "--level-lora-rank=65: must lie between 0 (no relaxation) and "
            "--encoder-embed-dim=64 (the full rank)",
        ),
        (("--level-lora-rank", "big"), "--level-lora-rank='big': choose a rank >= 0 or full"),
        (
            ("--level-lora-rank", "2", "--attn-signal", "before"),
            "--level-lora-rank=2: a level LoRA reads the input of the Q/K/V projection, which "
            "--attn-signal='before' changes",
        ),
        (
            ("--adaptive-softmax-cutoff", "10,20"),
            "--adaptive-softmax-cutoff=[10, 20]: adaptive softmax",
        ),
    ],
)
def test_impossible_settings_fail_naming_the_flag(flags, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        build("ringformer_tiny", *flags)


def test_errors_from_building_a_stack_name_the_flag():
    message = "--encoder-attn-groups=(2,): gives a setting for 1 loop(s)"
    with pytest.raises(ConfigError, match=re.escape(message)):
        build("sret_tiny", "--encoder-attn-groups", "2")  # every block loops twice


def test_config_errors_carry_the_flag_and_value():
    with pytest.raises(ConfigError) as err:
        build("ringformer_tiny", "--encoder-unique-layers", "4")
    assert (err.value.setting, err.value.value) == ("--encoder-unique-layers", 4)
    assert err.value.related == {"--encoder-layers": 3}


def test_every_stack_config_field_is_set_from_the_arguments(monkeypatch):
    """StackConfig's own defaults never decide a translation model."""
    args = build("ringformer_tiny")[1]
    given = []

    def record(values):
        given.append(set(values))
        return StackConfig.from_options(**values)

    monkeypatch.setattr(nmt_flags, "stack_config", record)
    nmt_flags.stack_configs(args)
    fields = set(option_declarations())
    assert given == [fields, fields]


def test_every_flag_of_a_stack_field_is_an_option():
    """The field -> flag table names real fairseq arguments (errors name existing flags)."""
    _, args, _ = build("ringformer_tiny")
    for side in ("encoder", "decoder"):
        for field, flag in nmt_flags.flags_of_fields(side).items():
            assert hasattr(args, flag[2:].replace("-", "_")), (field, flag)


@pytest.mark.parametrize(("flag", "needs"), [("--fp16", "CUDA"), ("--bf16", "a TPU")])
def test_half_precision_without_cuda_is_refused(flag, needs):
    with pytest.raises(ConfigError, match=f"{flag} needs {needs}"):
        build("ringformer_tiny", flag, "--cpu")


def test_bad_choices_are_refused_by_the_parser():
    with pytest.raises(SystemExit):
        build("ringformer_tiny", "--sharing-scheme", "spiral")


def test_full_lora_rank_is_the_width():
    model, _, _ = build("relaxed_transformer_tiny", "--level-lora-rank", "full")
    assert model.decoder.stack.levels[0].lora["cross_kv"].rank == 64
    assert model.encoder.stack_cfg.lora.rank == 64


def test_parameter_count_changes_with_rank():
    small = parameter_report(build("ringformer_tiny", "--level-signal-rank", "2")[0]).p_star
    large = parameter_report(build("ringformer_tiny", "--level-signal-rank", "8")[0]).p_star
    # 3 levels x 2 sides x 4 signals x 2 factors x 64 x (8 - 2)
    assert large - small == 3 * 2 * 4 * 2 * 64 * 6


def _projections(model) -> list:
    """Every Linear of the blocks (Q, K, V, output, FFN), cross-attention included."""
    return [
        m
        for side in (model.encoder, model.decoder)
        for m in side.stack.blocks.modules()
        if isinstance(m, torch.nn.Linear)
    ]


@pytest.mark.parametrize(
    ("arch", "biased"),
    [
        ("ringformer_tiny", False),  # the authors' code: "bias": 0 in its config.json
        ("universal_transformer_tiny", True),  # fairseq's transformer, as before
        ("recurrent_transformer_tiny", True),
        ("owf_tiny", True),
        ("sret_tiny", True),
    ],
)
def test_block_bias_defaults_and_flag(arch, biased):
    linears = _projections(build(arch)[0])
    assert linears and all((m.bias is not None) == biased for m in linears)
    flipped = _projections(build(arch, "--block-bias", "off" if biased else "on")[0])
    assert all((m.bias is not None) != biased for m in flipped)


def test_level_signal_down_init_reaches_every_signal():
    def downs(*flags):
        model = build("ringformer_tiny", *flags)[0]
        return [p for n, p in model.named_parameters() if n.endswith("signal.down")]

    assert all(p.abs().max() < 1e-5 for p in downs())  # N(0, 1e-6^2), the authors' code
    assert all(p.abs().max() > 1e-3 for p in downs("--level-signal-down-init", "kaiming"))
    assert all(p.std() > 1e-3 for p in downs("--level-signal-down-std", "0.01"))
