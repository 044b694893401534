"""Command-line options of the recurnmt translation models, and their translation to stacks.

fairseq's own transformer flags keep their meaning (``--encoder-layers`` is the number of
levels N, ``--encoder-embed-dim`` the width, ...). The options below add the depth plan and
the per-level parts. Every option reaches the built model: :func:`stack_configs` is the only
place that reads them, and the tests check that each one changes the model.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from typing import Any

import torch

from recurnmt.modules.config import (
    ATTN_SIGNAL_PLACES,
    FFN_SIGNAL_PLACES,
    SHARING_SCHEMES,
    SIGNAL_KINDS,
    ConfigError,
    SignalConfig,
    StackConfig,
)

LAYER_NORM_PLACES = ("per-level", "per-block")


def add_recurrent_args(parser: argparse.ArgumentParser) -> None:
    """Adds recurnmt's options; defaults come from the registered architectures."""
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


# fairseq transformer options that the recurrent models do not implement: refusing them
# beats silently training something else.
_UNSUPPORTED = {
    "adaptive_softmax_cutoff": "adaptive softmax",
    "encoder_layers_to_keep": "layer pruning",
    "decoder_layers_to_keep": "layer pruning",
    "cross_self_attention": "cross+self attention",
    "no_cross_attention": "decoders without cross-attention",
    "checkpoint_activations": "activation checkpointing",
    "offload_activations": "activation offloading",
    "quant_noise_pq": "quantization noise",
    "encoder_layerdrop": "LayerDrop",
    "decoder_layerdrop": "LayerDrop",
    "tie_adaptive_weights": "adaptive input/softmax",
    "adaptive_input": "adaptive input",
}


def check_supported(args: Any) -> None:
    """Raises :class:`ConfigError` for settings that cannot work.

    Covers fairseq options the recurrent models do not implement, and ``--fp16``/``--bf16``
    without a CUDA device (fairseq fails on those much later with unrelated-looking errors).
    """
    for name, what in _UNSUPPORTED.items():
        value = getattr(args, name, None)
        if value not in (None, False, 0, 0.0, ""):
            flag = "--" + name.replace("_", "-")
            raise ConfigError(f"{flag}={value!r}: {what} is not supported by recurnmt models")
    for flag in ("fp16", "bf16", "memory_efficient_fp16", "memory_efficient_bf16"):
        if getattr(args, flag, False) and (
            getattr(args, "cpu", False) or not torch.cuda.is_available()
        ):
            raise ConfigError(
                f"--{flag.replace('_', '-')} needs a CUDA device; none is available "
                "(or --cpu is set). Drop the flag to train in float32."
            )


def stack_configs(args: Any) -> tuple[StackConfig, StackConfig]:
    """Encoder and decoder :class:`StackConfig` from fairseq arguments.

    Raises:
        ConfigError: an impossible setting, named in the message.
    """
    check_supported(args)
    signal = SignalConfig(
        kind=args.level_signal,
        rank=args.level_signal_rank,
        attn=args.attn_signal,
        ffn=args.ffn_signal,
    )
    activation = getattr(args, "activation_fn", "relu")
    if activation not in ("relu", "gelu"):
        raise ConfigError(f"--activation-fn={activation}: recurnmt models support relu, gelu")
    if args.layer_norms not in LAYER_NORM_PLACES:
        raise ConfigError(
            f"--layer-norms={args.layer_norms!r}: choose one of {', '.join(LAYER_NORM_PLACES)}"
        )
    common = dict(
        norms_per_level=args.layer_norms == "per-level",
        sharing=args.sharing_scheme,
        signal=signal,
        dropout=args.dropout,
        attention_dropout=args.attention_dropout,
        activation_dropout=args.activation_dropout,
        activation=activation,
    )
    encoder = _named(
        "encoder",
        lambda: StackConfig(
            embed_dim=args.encoder_embed_dim,
            ffn_dim=args.encoder_ffn_embed_dim,
            num_heads=args.encoder_attention_heads,
            num_levels=args.encoder_layers,
            num_unique=args.encoder_unique_layers,
            normalize_before=args.encoder_normalize_before,
            **common,
        ),
    )
    if args.decoder_embed_dim != args.encoder_embed_dim:
        raise ConfigError(
            f"--decoder-embed-dim={args.decoder_embed_dim} must equal "
            f"--encoder-embed-dim={args.encoder_embed_dim} (cross-attention reads the encoder)"
        )
    decoder = _named(
        "decoder",
        lambda: StackConfig(
            embed_dim=args.decoder_embed_dim,
            ffn_dim=args.decoder_ffn_embed_dim,
            num_heads=args.decoder_attention_heads,
            num_levels=args.decoder_layers,
            num_unique=args.decoder_unique_layers,
            normalize_before=args.decoder_normalize_before,
            cross_attention=True,
            **common,
        ),
    )
    return encoder, decoder


_FLAG_OF_FIELD = {
    "embed_dim": "--{side}-embed-dim",
    "ffn_dim": "--{side}-ffn-embed-dim",
    "num_heads": "--{side}-attention-heads",
    "num_levels": "--{side}-layers",
    "num_unique": "--{side}-unique-layers",
    "signal rank": "--level-signal-rank",
    "sharing": "--sharing-scheme",
    "attention_dropout": "--attention-dropout",
    "activation_dropout": "--activation-dropout",
    "dropout": "--dropout",
}


def _named(side: str, build: Callable[[], StackConfig]) -> StackConfig:
    """Builds a stack config, rewriting field names in errors to the CLI flags."""
    try:
        return build()
    except ConfigError as err:
        message = str(err)
        for name, flag in _FLAG_OF_FIELD.items():
            message = re.sub(rf"(?<![\w-]){name}=", flag.format(side=side) + "=", message)
        raise ConfigError(message) from None
