"""Command-line options of the recurnmt translation models, and their translation to stacks.

fairseq's own transformer flags keep their meaning (``--encoder-layers`` is the number of
levels N, ``--encoder-embed-dim`` the width, ...). The options below add the depth plan and
the per-level parts. Every option reaches the built model: :func:`stack_configs` is the only
place that reads them, and the tests check that each one changes the model.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from recurnmt.modules.config import (
    ATTN_SIGNAL_PLACES,
    FFN_SHARING,
    FFN_SIGNAL_PLACES,
    LRC_MODES,
    SHARING_SCHEMES,
    SIGNAL_DOWN_INITS,
    SIGNAL_KINDS,
    ConfigError,
    SignalConfig,
    StackConfig,
)
from recurnmt.nmt.embedding_layout import add_embedding_layout_args

LAYER_NORM_PLACES = ("per-level", "per-block")
POSITION_PLACES = ("input", "every-level")


def _int_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None


def add_recurrent_args(parser: argparse.ArgumentParser) -> None:
    """Adds recurnmt's options; their defaults are in :mod:`recurnmt.nmt.defaults`."""
    group = parser  # fairseq hands models an argument group already
    group.add_argument(
        "--encoder-unique-layers",
        type=int,
        metavar="M",
        help="unique encoder blocks M over the N = --encoder-layers levels "
        "(1: fully recurrent; N: vanilla)",
    )
    group.add_argument(
        "--decoder-unique-layers",
        type=int,
        metavar="M",
        help="unique decoder blocks M over the N = --decoder-layers levels",
    )
    group.add_argument(
        "--sharing-scheme",
        choices=SHARING_SCHEMES,
        help="order in which levels visit the unique blocks (Takase & Kiyono 2021)",
    )
    group.add_argument(
        "--layer-norms",
        choices=LAYER_NORM_PLACES,
        help="every level owns its layer norms (RingFormer) or every block does",
    )
    group.add_argument(
        "--level-signal",
        choices=SIGNAL_KINDS,
        help="level signals: lowrank (RingFormer eq. 5), full (d x d), static "
        "(sinusoidal level embedding, Universal Transformer) or none",
    )
    group.add_argument(
        "--level-signal-rank",
        type=int,
        metavar="R",
        help="rank of the low-rank level signals (default: embed dim // 16)",
    )
    group.add_argument(
        "--level-signal-down-init",
        choices=SIGNAL_DOWN_INITS,
        help="how the low-rank signals' down factors start (their up factors start at zero): "
        "normal, N(0, S^2) with S = --level-signal-down-std, as RingFormer's code (the "
        "default), or kaiming, LoRA's code (Kaiming-uniform)",
    )
    group.add_argument(
        "--level-signal-down-std",
        type=float,
        metavar="S",
        help="standard deviation of --level-signal-down-init normal (RingFormer's code: 1e-6)",
    )
    group.add_argument(
        "--attn-signal",
        choices=ATTN_SIGNAL_PLACES,
        help="attention level signals after the Q/K/V projections (RingFormer eq. 6), "
        "before them, or none",
    )
    group.add_argument(
        "--ffn-signal",
        choices=FFN_SIGNAL_PLACES,
        help="FFN level signal on the FFN input (RingFormer eq. 7), on the intermediate "
        "activation (inter), or none",
    )
    group.add_argument(
        "--level-lora-rank",
        metavar="R",
        help="relaxed recursion (Relaxed Recursive Transformers eq. 3): every level owns a "
        "LoRA of rank R (and bias deltas) on every linear of its shared block; 0: plain "
        "sharing, full: the full rank (the embed dim)",
    )
    group.add_argument(
        "--block-bias",
        choices=("on", "off"),
        help="biases in the attention (Q, K, V, output) and FFN projections of both stacks: "
        "on as fairseq's transformer, off as RingFormer's code (its P* in Table 1); the "
        "ringformer architectures default to off",
    )
    group.add_argument(
        "--encoder-ffn-sharing",
        choices=FFN_SHARING,
        help="encoder FFNs: one per block, one shared by all blocks (One Wide FFN), or none",
    )
    group.add_argument(
        "--decoder-ffn-sharing",
        choices=FFN_SHARING,
        help="decoder FFNs: one per block, one shared by all blocks, or none (OWF default)",
    )
    group.add_argument(
        "--positions",
        choices=POSITION_PLACES,
        help="add position embeddings at the input only, or at every level together with "
        "the level embedding (Universal Transformer coordinate embedding)",
    )
    group.add_argument(
        "--coordinate-scale",
        type=float,
        help="scale of the coordinate embedding added at every level (level embedding, and "
        "positions with --positions every-level); 1 is the UT paper's full sinusoid",
    )
    group.add_argument(
        "--checkpoint-segment",
        metavar="K",
        help="with --checkpoint-activations: also checkpoint every K levels as one segment "
        "(Chen et al. 2016), K a number or 'sqrt' for ceil(sqrt(levels)): memory grows as "
        "sqrt(levels) instead of linearly, for one more forward pass; 0 (default) "
        "checkpoints each level only",
    )
    group.add_argument(
        "--act",
        choices=("on", "off"),
        help="Adaptive Computation Time halting over the levels (Universal Transformer); "
        "train with --criterion recurrent_label_smoothed_cross_entropy for the ponder cost",
    )
    group.add_argument("--act-threshold", type=float, help="ACT halting threshold 1 - eps")
    group.add_argument("--act-bias-init", type=float, help="initial halting unit bias")
    group.add_argument(
        "--lrc",
        choices=LRC_MODES,
        help="learnable residual coefficients (SReT eq. 9-10) on both branches, the identity "
        "branch, the main branch, or none",
    )
    group.add_argument(
        "--nll-ratio",
        type=float,
        metavar="R",
        help="SReT non-linear projection layer after every level with hidden ratio R "
        "(SReT eq. 5); 0 = none",
    )
    group.add_argument(
        "--encoder-attn-groups",
        type=_int_list,
        metavar="G1,G2,...",
        help="sliced group self-attention in the encoder: groups at loop 1, 2, ... of each "
        "block (SReT sec. 4); empty = global attention",
    )
    group.add_argument(
        "--mixed-depth",
        choices=("on", "off"),
        help="SReT mixed-depth training (appendix B): also train the shallow branch (every "
        "block once) under the same loss; needs the recurrent criterion",
    )
    group.add_argument(
        "--compile",
        nargs="?",
        const="inductor",
        metavar="BACKEND",
        help="torch.compile the encoder and decoder stacks (training and full passes; "
        "incremental decoding stays eager) with BACKEND (default inductor; aot_eager "
        "compiles without generating code)",
    )
    group.add_argument(
        "--compile-mode",
        help="torch.compile mode with --compile (default, reduce-overhead, max-autotune)",
    )
    for side in ("encoder", "decoder"):
        group.add_argument(
            f"--{side}-levels",
            type=int,
            metavar="K",
            help=f"run the {side} at K levels instead of --{side}-layers (elastic depth of a "
            "trained shared model, e.g. fairseq-generate --model-overrides "
            f"\"{{'{side}_levels': K}}\"); K beyond the built depth needs parameter-free "
            "level parts (Universal Transformer)",
        )
    add_embedding_layout_args(group)


# fairseq transformer options that the recurrent models do not implement: refusing them
# beats silently training something else.
_UNSUPPORTED = {
    "adaptive_softmax_cutoff": "adaptive softmax",
    "encoder_layers_to_keep": "layer pruning",
    "decoder_layers_to_keep": "layer pruning",
    "cross_self_attention": "cross+self attention",
    "no_cross_attention": "decoders without cross-attention",
    "quant_noise_pq": "quantization noise",
    "encoder_layerdrop": "LayerDrop",
    "decoder_layerdrop": "LayerDrop",
    "tie_adaptive_weights": "adaptive input/softmax",
    "adaptive_input": "adaptive input",
}


def check_supported(args: Any) -> None:
    """Raises :class:`ConfigError` for settings that cannot work.

    Covers fairseq options the recurrent models do not implement. Half precision without
    CUDA and multi-process mistakes are refused by :func:`recurnmt.nmt.distributed_checks.check_distributed`.
    """
    for name, what in _UNSUPPORTED.items():
        value = getattr(args, name, None)
        if value not in (None, False, 0, 0.0, ""):
            raise ConfigError(_flag(name), value, f"{what} is not supported by recurnmt models")


# StackConfig field -> the fairseq argument that sets it ({side}: encoder or decoder); the
# fields not listed are fixed for translation models (see _side_config)
ARG_OF_FIELD: dict[str, str] = {
    "embed_dim": "{side}_embed_dim",
    "ffn_dim": "{side}_ffn_embed_dim",
    "num_heads": "{side}_attention_heads",
    "num_levels": "{side}_layers",
    "num_unique": "{side}_unique_layers",
    "normalize_before": "{side}_normalize_before",
    "ffn_sharing": "{side}_ffn_sharing",
    "sharing": "sharing_scheme",
    "norms_per_level": "layer_norms",
    "signal.kind": "level_signal",
    "signal.rank": "level_signal_rank",
    "signal.attn": "attn_signal",
    "signal.ffn": "ffn_signal",
    "signal.down_init": "level_signal_down_init",
    "signal.down_std": "level_signal_down_std",
    "bias": "block_bias",
    "dropout": "dropout",
    "attention_dropout": "attention_dropout",
    "activation_dropout": "activation_dropout",
    "activation": "activation_fn",
    "lrc": "lrc",
    "nll_ratio": "nll_ratio",
    "attn_groups": "encoder_attn_groups",
    "positions_every_level": "positions",
    "coordinate_scale": "coordinate_scale",
    "act": "act",
    "act_threshold": "act_threshold",
    "act_bias_init": "act_bias_init",
    "lora_rank": "level_lora_rank",
}


def _flag(arg: str) -> str:
    """The command-line flag of a fairseq argument: ``encoder_layers`` -> ``--encoder-layers``."""
    return "--" + arg.replace("_", "-")


def flags_of_fields(side: str) -> dict[str, str]:
    """StackConfig field -> command-line flag, for the ``side`` stack."""
    return {field: _flag(arg.format(side=side)) for field, arg in ARG_OF_FIELD.items()}


def stack_configs(args: Any) -> tuple[StackConfig, StackConfig]:
    """Encoder and decoder :class:`StackConfig` from fairseq arguments.

    Raises:
        ConfigError: an impossible setting, named by its command-line flag.
    """
    check_supported(args)
    if args.layer_norms not in LAYER_NORM_PLACES:
        raise ConfigError(
            "--layer-norms", args.layer_norms, f"choose one of {', '.join(LAYER_NORM_PLACES)}"
        )
    if args.decoder_embed_dim != args.encoder_embed_dim:
        raise ConfigError(
            "--decoder-embed-dim",
            args.decoder_embed_dim,
            "must equal {--encoder-embed-dim} (cross-attention reads the encoder)",
            {"--encoder-embed-dim": args.encoder_embed_dim},
        )
    encoder = _side_config(args, "encoder")
    decoder = _side_config(args, "decoder")
    return encoder, decoder


def _side_config(args: Any, side: str) -> StackConfig:
    """The stack of one side; every field is given here, none is left to StackConfig."""

    def arg(field: str) -> Any:
        return getattr(args, ARG_OF_FIELD[field].format(side=side))

    decoder = side == "decoder"
    normalize_before = arg("normalize_before")
    with flags_in_errors(side):
        return StackConfig(
            embed_dim=arg("embed_dim"),
            ffn_dim=arg("ffn_dim"),
            num_heads=arg("num_heads"),
            num_levels=arg("num_levels"),
            num_unique=arg("num_unique"),
            sharing=arg("sharing"),
            norms_per_level=arg("norms_per_level") == "per-level",
            normalize_before=normalize_before,
            signal=SignalConfig(
                kind=arg("signal.kind"),
                rank=arg("signal.rank"),
                attn=arg("signal.attn"),
                ffn=arg("signal.ffn"),
                down_init=arg("signal.down_init"),
                down_std=arg("signal.down_std"),
            ),
            cross_attention=decoder,
            causal=decoder,
            dropout=arg("dropout"),
            attention_dropout=arg("attention_dropout"),
            activation_dropout=arg("activation_dropout"),
            activation=arg("activation"),
            bias=_on_off("bias", arg("bias")),
            ffn_sharing=arg("ffn_sharing"),
            lrc=arg("lrc"),
            nll_ratio=arg("nll_ratio"),
            # sliced group attention is for the encoder only (a causal stack refuses it)
            attn_groups=() if decoder else tuple(arg("attn_groups") or ()),
            positions_every_level=arg("positions_every_level") == "every-level",
            coordinate_scale=arg("coordinate_scale"),
            act=arg("act") == "on",
            act_threshold=arg("act_threshold"),
            act_bias_init=arg("act_bias_init"),
            drop_path=0.0,
            level_drop_path=(),
            final_norm=normalize_before,  # as fairseq's transformer: after pre-LN stacks only
            norm_eps=1e-5,  # fairseq's LayerNorm
            # sliced encoder attention as SReT Algorithm 1: contiguous slices at a block's
            # first loop, permuted (and inverted) at later loops
            attn_permute=(),
            lora_rank=lora_rank(arg("lora_rank"), arg("embed_dim")),
        )


def lora_rank(value: Any, embed_dim: int) -> int:
    """``--level-lora-rank``: a rank >= 0, or ``full`` (the width, the full rank of every
    linear of the block).

    Raises:
        ConfigError: anything else, naming the field (renamed to its flag by the caller).
    """
    if str(value).strip() == "full":
        return embed_dim
    try:
        return int(str(value).strip())
    except ValueError:
        raise ConfigError("lora_rank", value, "choose a rank >= 0 or full") from None


def _on_off(field: str, value: Any) -> bool:
    """An ``on`` / ``off`` option as a bool.

    Raises:
        ConfigError: anything else, naming the field (renamed to its flag by the caller).
    """
    if value not in ("on", "off"):
        raise ConfigError(field, value, "choose on or off")
    return value == "on"


@contextmanager
def flags_in_errors(side: str) -> Iterator[None]:
    """Re-raises a :class:`ConfigError` about a stack field naming its ``side`` flag instead.

    Wraps whatever validates a side's stack: its config, and building the stack (plan-level
    checks such as one ``--encoder-attn-groups`` entry per loop).
    """
    try:
        yield
    except ConfigError as err:
        raise err.renamed(flags_of_fields(side)) from None


def checkpoint_segment(value: Any) -> int | str:
    """``--checkpoint-segment``: a number of levels >= 0, or ``"sqrt"``.

    Raises:
        ConfigError: anything else, naming the flag.
    """
    text = str(value).strip()
    if text == "sqrt":
        return text
    if text.isdigit():
        return int(text)
    raise ConfigError("--checkpoint-segment", value, "must be a number of levels >= 0 or 'sqrt'")
