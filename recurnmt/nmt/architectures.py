"""Named architectures: a family (how levels share weights) times a size.

Sizes are fairseq's standard transformer sizes; RingFormer A.1 uses the ``wmt_en_de`` and
``wmt_en_de_big`` ones (512/2048/8 heads and 1024/4096/16 heads, 6 levels).

``fairseq-train --arch ringformer_wmt_en_de`` = the ``ringformer`` family at the
``wmt_en_de`` size. Explicit command-line flags always win over these defaults.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from recurnmt.nmt.model import MODEL_NAME, recurrent_base_architecture
from recurnmt.nmt.registry import register_arch_once

ArchFn = Callable[[Any], None]


def _set_defaults(args: Any, **defaults: Any) -> None:
    for name, value in defaults.items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)


def _sized(embed: int, ffn: int, heads: int, levels: int = 6, **extra: Any) -> ArchFn:
    def apply(args: Any) -> None:
        _set_defaults(
            args,
            encoder_embed_dim=embed,
            encoder_ffn_embed_dim=ffn,
            encoder_attention_heads=heads,
            encoder_layers=levels,
            decoder_embed_dim=embed,
            decoder_ffn_embed_dim=ffn,
            decoder_attention_heads=heads,
            decoder_layers=levels,
            **extra,
        )

    return apply


SIZES: dict[str, ArchFn] = {
    "tiny": _sized(64, 128, 4, levels=3),
    "iwslt_de_en": _sized(512, 1024, 4),
    "wmt_en_de": _sized(512, 2048, 8),
    "wmt_en_de_big": _sized(1024, 4096, 16, dropout=0.3),
}


def ringformer(args: Any) -> None:
    """RingFormer (RingFormer sec. 3): one shared block per side, per-level norms, low-rank
    level signals on Q/K/V (after projection) and on the FFN input, rank H/16, GELU."""
    _set_defaults(
        args,
        encoder_unique_layers=1,
        decoder_unique_layers=1,
        layer_norms="per-level",
        level_signal="lowrank",
        attn_signal="after",
        ffn_signal="input",
        activation_fn="gelu",
    )


def vanilla(args: Any) -> None:
    """A plain Transformer built from recurnmt's blocks (one block per level)."""


def universal_transformer(args: Any) -> None:
    """Universal Transformer (Dehghani et al. 2019) as compared in RingFormer Table 1: one
    shared block per side, sinusoidal level + position embeddings at every level, GELU."""
    _set_defaults(
        args,
        encoder_unique_layers=1,
        decoder_unique_layers=1,
        layer_norms="per-block",
        level_signal="static",
        positions="every-level",
        activation_fn="gelu",
    )


def universal_transformer_act(args: Any) -> None:
    """Universal Transformer with Adaptive Computation Time halting (UT sec. 2.2); the
    levels are the maximum number of steps. Needs the recurrent criterion."""
    _set_defaults(args, act="on", criterion="recurrent_label_smoothed_cross_entropy")
    universal_transformer(args)


def one_wide_ffn(args: Any) -> None:
    """One Wide FFN (Pires et al. 2023, as in RingFormer Table 1): attention per layer, one
    FFN shared by all encoder layers, no decoder FFN, GELU."""
    _set_defaults(
        args,
        encoder_ffn_sharing="shared",
        decoder_ffn_sharing="none",
        level_signal="none",
        activation_fn="gelu",
    )


def sret(args: Any) -> None:
    """SReT for translation (SReT sec. 3, Table 9 setting): each of the six blocks per side
    looped twice in a row (internal loop, eq. 6: 12 levels), a non-shared NLL after every
    loop (eq. 5, ratio 1), learnable residual coefficients on every residual (eq. 9-10)."""
    _set_defaults(
        args,
        encoder_unique_layers=6,
        decoder_unique_layers=6,
        encoder_layers=12,
        decoder_layers=12,
        sharing_scheme="sequence",
        nll_ratio=1.0,
        lrc="both",
        share_decoder_input_output_embed=True,
    )


FAMILIES: dict[str, ArchFn] = {
    "ringformer": ringformer,
    "recurrent_transformer": vanilla,
    "universal_transformer": universal_transformer,
    "universal_transformer_act": universal_transformer_act,
    "owf": one_wide_ffn,
    "sret": sret,
}


# depth of a family at a size, where it differs from the family's own default
FAMILY_SIZE_DEPTH: dict[tuple[str, str], dict[str, int]] = {
    ("sret", "tiny"): dict(
        encoder_unique_layers=2, decoder_unique_layers=2, encoder_layers=4, decoder_layers=4
    ),
}


def _register(family: str, size: str | None) -> None:
    name = family if size is None else f"{family}_{size}"
    family_fn = FAMILIES[family]
    size_fn = SIZES["wmt_en_de" if size is None else size]
    depth = FAMILY_SIZE_DEPTH.get((family, size or "wmt_en_de"), {})

    def arch(args: Any) -> None:
        _set_defaults(args, **depth)
        family_fn(args)
        size_fn(args)
        recurrent_base_architecture(args)

    arch.__name__ = name
    arch.__doc__ = f"{family} family at the {size or 'wmt_en_de'} size."
    register_arch_once(MODEL_NAME, name)(arch)


for _family in FAMILIES:
    _register(_family, None)
    for _size in SIZES:
        _register(_family, _size)
