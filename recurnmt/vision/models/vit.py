"""Vision Transformers on a recurrent stack: ViT/DeiT, naive recursion, RingFormer-ViT, UiT.

One class, :class:`VisionTransformer`, turns an image into patch tokens (ViT eq. 1), runs them
through a level stack from :mod:`recurnmt.modules` and classifies from the class token (ViT
eq. 4) or the average token. The architectures differ only in the stack they are given:

=========================  ==================================================================
ViT / DeiT                 N levels, N unique pre-LN blocks (Dosovitskiy et al. 2021; DeiT)
naive recursive ViT        every block looped R times in a row (SReT eq. 4, Table 1)
RingFormer-ViT             one block, per-level LNs and low-rank signals (RingFormer eq. 5-7)
UiT                        one block; sinusoidal position + level (coordinate) embedding added
                           at every step (UT sec. 2.1; RingFormer sec. 4.1)
OWF-ViT                    N attention blocks, one FFN shared by all (Pires et al. 2023;
                           RingFormer sec. 4.1 "share only the feedforward layer")
relaxed recursive ViT      M blocks looped in a cycle, a LoRA and bias deltas per level on
                           every linear (Relaxed Recursive Transformers eq. 2-3)
+ MRLA                     any of the above with multi-head recurrent layer attention after
                           every level, per level and never shared (Fang et al. 2023; ``mrla=``)
=========================  ==================================================================

Every model also runs its shallow branch, each unique block once, for SReT's mixed-depth
training (SReT appendix B): a mode of its stack (``with shallow_branch(model): model(x)``,
:func:`~recurnmt.modules.shallow_branch`). The families (RingFormer, UiT, OWF, relaxed
recursion, SReT's recursion) are :data:`recurnmt.modules.FAMILIES`, the same entries the
translation architectures use (:func:`vit_family`); a ViT keeps only its own deviations.

Regularisation and norms follow timm/DeiT: layer norms with eps 1e-6 (``norm_eps``), and
stochastic depth (``drop_path_rate``, Huang et al. 2016) whose per-sample branch-dropping rate
grows linearly from 0 at the first level to ``drop_path_rate`` at the last, as DeiT's
``linspace(0, rate, depth)``. The DeiT models default to DeiT's 0.1 (DeiT sec. 6, Table 9); the
RingFormer-family models and ViT-B to 0, as their papers state none.

The module itself is :class:`~recurnmt.vision.models.vision_transformer.VisionTransformer`
(imported here, its public name); this file builds its stacks and registers the models.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from recurnmt.modules import (
    FAMILIES,
    ConfigError,
    SignalConfig,
    StackConfig,
    build_stack,
)
from recurnmt.modules.declarations import option_keywords
from recurnmt.vision.layers.layer_attention import LayerAttention
from recurnmt.vision.models.vision_transformer import VisionTransformer
from recurnmt.vision.registry import register_model

# a ViT's stack unless told otherwise (ViT eq. 2-3; timm's and DeiT's settings): pre-LN GELU
# blocks, layer norms with eps 1e-6, no dropout, each block's levels in a row (SReT's loop)
VIT_STACK = {
    "normalize_before": True,
    "activation": "gelu",
    "norm_eps": 1e-6,
    "dropout": 0.0,
    "sharing": "sequence",
}


def vit_family(name: str) -> dict[str, Any]:
    """The family ``name`` of :data:`recurnmt.modules.FAMILIES` as the image models' keywords
    (:func:`~recurnmt.modules.declarations.option_keywords`)."""
    keywords = {name: kw for kw, name in option_keywords(StackConfig).items()}
    return {keywords[option]: value for option, value in FAMILIES[name].changes().items()}


def vit_stack_config(
    *, embed_dim: int, depth: int, mlp_ratio: float = 4.0, **keywords: Any
) -> StackConfig:
    """The stack of a ViT: :data:`VIT_STACK` with ``keywords``, every stack option under its
    image-model keyword (:func:`~recurnmt.modules.declarations.option_keywords`: timm's names
    ``depth``, ``unique_layers``, ``drop_rate``, ``attn_drop_rate``, ``drop_path_rate``; the
    option's name otherwise, ``signal_rank`` for ``signal.rank``), or a whole part by its field
    (``signal=SignalConfig(...)``). ``depth`` levels over ``unique_layers`` blocks (``depth``
    when omitted; with the default ``sharing="sequence"`` and ``depth = R * unique_layers``
    every block runs R times in a row, SReT's internal loop, SReT eq. 4, sec. 5.2); the FFN
    ``embed_dim * mlp_ratio`` wide unless ``ffn_dim``; drop path rising linearly to
    ``drop_path_rate`` at the last level.

    Raises:
        TypeError: a keyword that is no stack option's.
        ConfigError: an impossible setting, named by its keyword.
    """
    names = option_keywords(StackConfig)
    parts = {f.name for f in dataclasses.fields(StackConfig)}  # whole: signal=SignalConfig()
    options = {"embed_dim": embed_dim, "num_levels": depth, **VIT_STACK}
    options["ffn_dim"] = int(embed_dim * mlp_ratio)
    for keyword, value in keywords.items():
        if keyword not in names and keyword not in parts:
            raise TypeError(f"{keyword!r} is no keyword of a ViT's stack")
        if keyword == "ffn_dim" and value is None:
            continue  # omitted: embed_dim * mlp_ratio
        options[names.get(keyword, keyword)] = value
    try:
        return StackConfig.from_options(**options)
    except ConfigError as err:
        raise err.renamed({name: kw for kw, name in names.items() if kw != name}) from None


_IMAGE_KEYS = ("img_size", "patch_size", "in_chans", "num_classes", "class_token", "global_pool")


def _create_vit(defaults: dict, kwargs: dict) -> VisionTransformer:
    """Splits ``defaults | kwargs`` into stack and image settings and builds the model.

    ``signal_rank=r`` is a shortcut for the rank of the model's level signals (RingFormer
    Table 4 varies it), handy on the command line (``--model-arg signal_rank=8``);
    ``signal_down_init`` and ``signal_down_std`` set how their down factors start (N(0, 1e-6^2)
    as the RingFormer authors' code by default, ``kaiming`` as LoRA's code; see
    :mod:`recurnmt.modules.level_signals`).

    ``mrla="light"`` or ``"base"`` adds MRLA after every level (MRLA sec. 4), with
    ``mrla_head_dim`` channels per head (d_k, 16 for ViTs, MRLA sec. 5.1) and ``mrla_stages``
    stages (a count dividing the levels, or stage lengths; 3 as in MRLA App. B.1.1); the
    MRLA branch takes the level's stochastic depth rate. With a class-token head the last
    level has no MRLA (the head never reads the patch tokens it would change).
    """
    args = {**defaults, **kwargs}
    image = {k: args.pop(k) for k in _IMAGE_KEYS if k in args}
    pos_embed = args.pop("pos_embed", "learned")
    drop_rate = args.get("drop_rate", 0.0)
    mrla = {k: args.pop(k) for k in _MRLA_KEYS if k in args}
    cfg = vit_stack_config(**args)
    model = VisionTransformer(
        build_stack(cfg),
        cfg.embed_dim,
        pos_embed=pos_embed,
        drop_rate=drop_rate,
        layer_attention=_layer_attention(
            cfg, skip_last_level=image.get("global_pool", "token") == "token", **mrla
        ),
        coordinates=cfg.coordinates,
        **image,
    )
    model.stack_cfg = cfg  # what the stack was built from (analysis, tests)
    return model


_MRLA_KEYS = ("mrla", "mrla_head_dim", "mrla_stages")


def _layer_attention(
    cfg: StackConfig,
    mrla: str | None = None,
    mrla_head_dim: int | None = None,
    mrla_stages: int | tuple[int, ...] | None = None,
    *,
    skip_last_level: bool = False,
) -> LayerAttention | None:
    """MRLA over the stack's levels, or None when ``mrla`` is None.

    Raises:
        ValueError: MRLA settings without ``mrla``, or invalid settings (named).
    """
    if mrla is None:
        if mrla_head_dim is not None or mrla_stages is not None:
            raise ValueError("mrla_head_dim / mrla_stages need mrla='light' or mrla='base'")
        return None
    num_levels = cfg.depth.num_levels
    return LayerAttention(
        cfg.embed_dim,
        num_levels,
        variant=mrla,
        head_dim=16 if mrla_head_dim is None else mrla_head_dim,
        stages=3 if mrla_stages is None else mrla_stages,
        drop_path=[cfg.drop_path_rate(i) for i in range(num_levels)],
        norm_eps=cfg.norms.eps,
        skip_last_level=skip_last_level,
    )


# ---------------------------------------------------------------- ViT / DeiT (no sharing)

# DeiT trains every model with stochastic depth 0.1 (DeiT Table 9; its --drop-path default)
_DEIT_TINY = dict(embed_dim=192, depth=12, num_heads=3, drop_path_rate=0.1)
_DEIT_SMALL = dict(embed_dim=384, depth=12, num_heads=6, drop_path_rate=0.1)
_VIT_BASE = dict(embed_dim=768, depth=12, num_heads=12)


@register_model
def deit_tiny_patch16_224(**kwargs) -> VisionTransformer:
    """DeiT-Ti (DeiT Table 1): 192 wide, 12 layers, 3 heads, 5.7M parameters, drop path 0.1."""
    return _create_vit(_DEIT_TINY, kwargs)


@register_model
def deit_small_patch16_224(**kwargs) -> VisionTransformer:
    """DeiT-S (DeiT Table 1): 384 wide, 12 layers, 6 heads, 22.1M parameters, drop path 0.1."""
    return _create_vit(_DEIT_SMALL, kwargs)


@register_model
def vit_base_patch16_224(**kwargs) -> VisionTransformer:
    """ViT-B/16 (ViT Table 1): 768 wide, 12 layers, 12 heads.

    With ``pos_embed="sincos"`` it is RingFormer Table 3's ViT (86.42M).
    """
    return _create_vit(_VIT_BASE, kwargs)


@register_model
def vit_small_rf_patch16_224(**kwargs) -> VisionTransformer:
    """RingFormer Table 2's ViT: 512/2048, 6 layers, 8 heads, fixed position embedding."""
    return _create_vit(
        dict(embed_dim=512, ffn_dim=2048, depth=6, num_heads=8, pos_embed="sincos"), kwargs
    )


# ---------------------------------------------------------------- naive recursion (SReT)


@register_model
def deit_tiny_recursive_patch16_224(loops: int = 2, **kwargs) -> VisionTransformer:
    """DeiT-Ti with every block looped twice in a row (SReT Table 1, "+1 naive recursion").

    Its 12 unique blocks run ``loops`` times each: ``depth = 12 * loops`` levels, and
    ``loops=3`` and ``loops=4`` give the table's other rows; parameters stay at 5.7M. SReT
    trains it with DeiT's recipe, so stochastic depth is DeiT's 0.1, spread linearly over all
    levels.
    """
    return _create_vit(_recursive(_DEIT_TINY, loops), kwargs)


def _recursive(defaults: dict, loops: int) -> dict:
    """``defaults`` with each of its ``depth`` blocks looped ``loops`` times in a row."""
    if not isinstance(loops, int) or loops <= 0:
        raise ValueError(f"loops={loops!r} must be a positive integer")
    return {**defaults, "unique_layers": defaults["depth"], "depth": defaults["depth"] * loops}


# ---------------------------------------------------------------- extreme depth (SReT)

# SReT's 108-layer models (ECCV sec. 5 "Extremely deep transformers" and Fig. 9; ICLR draft
# appendix B): DeiT-Ti deepened to 108 distinct layers (DeiT-108), and "our SReT-108" of the
# same depth, whose size is "only one-third of DeiT-108". The paper prints no configuration
# beyond that. Registered here: DeiT-108; the naive recursion of DeiT-Ti at that depth (36
# unique blocks looped 3 times, 108 / 3: a third of DeiT-108 in blocks, as SReT Table 1
# deepens DeiT-Ti, but neither NLL nor LRC); and SReT-108, the same DeiT-Ti body built as SReT
# (an NLL after every loop, LRC on every residual) at a third of DeiT-108's size. Train them
# with set_grad_checkpointing (segments: the stack's ``checkpoint_segment``) and, for the
# recursive ones, SReT's mixed-depth training (appendix B).
_DEIT_TINY_108 = {**_DEIT_TINY, "depth": 108}


@register_model
def deit_tiny_d108_patch16_224(**kwargs) -> VisionTransformer:
    """DeiT-108: DeiT-Ti with 108 distinct layers (SReT Fig. 9's baseline), 48.4M."""
    return _create_vit(_DEIT_TINY_108, kwargs)


@register_model
def deit_tiny_recursive_d108_patch16_224(**kwargs) -> VisionTransformer:
    """SReT's recursive 108-layer DeiT-Ti: 36 unique blocks, 3 loops each, 16.4M (a third
    of DeiT-108, SReT ICLR draft appendix B)."""
    return _create_vit({**_DEIT_TINY, "unique_layers": 36, "depth": 108}, kwargs)


@register_model
def deit_tiny_sret_d108_patch16_224(**kwargs) -> VisionTransformer:
    """SReT-108 (SReT Fig. 9 and ICLR draft appendix B, "our SReT-108"): DeiT-Ti's body at 108
    levels built as SReT, 16.43M parameters, 0.34 of DeiT-108 (the paper: "one-third").

    18 unique blocks, each looped 6 times in a row (SReT's internal loop, eq. 6); after every
    loop a non-linear projection layer of its own (eq. 5, hidden ratio 1.0 as SReT-T/TL,
    sec. 5) and learnable residual coefficients on every residual, NLLs' included (eq. 9-10);
    DeiT's stochastic depth 0.1. The paper gives only the depth, the DeiT-Ti baseline and the
    size: with SReT-T's NLL ratio, the 108 NLLs alone hold 8.05M, so 36 blocks x 3 loops (the
    naive pair's) would be 24.44M, half of DeiT-108; over the block counts that divide 108,
    18 gives the size nearest a third (12 give 13.76M). ``unique_layers`` and ``nll_ratio``
    set others (27 blocks x 4 loops at ratio 0.5 are 16.44M).
    """
    # SReT's recursion (the family: blocks looped in a row, NLL ratio 1, LRC on both branches)
    defaults = {**_DEIT_TINY, **vit_family("sret"), "unique_layers": 18, "depth": 108}
    return _create_vit(defaults, kwargs)


# ---------------------------------------------------------------- RingFormer-ViT

# the RingFormer family; the projections keep their biases, as the authors' image code
# (vringformer.py), unlike their translation code (the family's)
_RINGFORMER = {**vit_family("ringformer"), "bias": True, "pos_embed": "sincos"}


@register_model
def ringformer_vit_base_patch16_224(**kwargs) -> VisionTransformer:
    """RingFormer-ViT of RingFormer Table 3: one block over 12 levels, 768/3072, 12.02M.

    Per-level LNs and low-rank signals of rank D/16 on Q, K, V and the FFN input
    (RingFormer eq. 5-7), their down factors starting N(0, 1e-6^2) as the authors' code
    (``signal_down_init="kaiming"``: LoRA's). The projections keep their biases: the authors'
    image code has them (``vringformer.py``), unlike their translation code.
    ``embed_dim=1284, ffn_dim=5120`` is the table's RingFormer^s.
    """
    return _create_vit(
        {**_RINGFORMER, "embed_dim": 768, "ffn_dim": 3072, "depth": 12, "num_heads": 12},
        kwargs,
    )


@register_model
def ringformer_vit_small_patch16_224(**kwargs) -> VisionTransformer:
    """RingFormer-ViT of RingFormer Table 2: 512/2048, 6 levels, 8 heads (4.4M, 100 classes)."""
    return _create_vit(
        {**_RINGFORMER, "embed_dim": 512, "ffn_dim": 2048, "depth": 6, "num_heads": 8}, kwargs
    )


# ---------------------------------------------------------------- UiT

_UIT = {**vit_family("universal_transformer"), "pos_embed": "sincos"}


@register_model
def uit_base_patch16_224(**kwargs) -> VisionTransformer:
    """Universal Transformer ViT of RingFormer Table 3: one block, 12 levels, 768/3072, 8.45M.

    The sinusoidal position and level (timestep) embeddings are added before every level
    (UT sec. 2.1 coordinate embedding; RingFormer Table 4 "static signal").
    ``embed_dim=1560, ffn_dim=6240`` is the table's UiT^s.
    """
    return _create_vit(
        {**_UIT, "embed_dim": 768, "ffn_dim": 3072, "depth": 12, "num_heads": 12}, kwargs
    )


@register_model
def uit_small_patch16_224(**kwargs) -> VisionTransformer:
    """UiT of RingFormer Table 2: 512/2048, 6 levels, 8 heads (3.60M with 100 classes)."""
    return _create_vit(
        {**_UIT, "embed_dim": 512, "ffn_dim": 2048, "depth": 6, "num_heads": 8}, kwargs
    )


# ---------------------------------------------------------------- One Wide FFN

_OWF = {**vit_family("owf"), "pos_embed": "sincos"}


@register_model
def owf_vit_base_patch16_224(**kwargs) -> VisionTransformer:
    """One Wide FFN ViT of RingFormer Table 3: 12 attention blocks, one shared FFN, 34.45M."""
    return _create_vit(
        {**_OWF, "embed_dim": 768, "ffn_dim": 3072, "depth": 12, "num_heads": 12}, kwargs
    )


@register_model
def owf_vit_small_patch16_224(**kwargs) -> VisionTransformer:
    """One Wide FFN ViT of RingFormer Table 2: 512/2048, 6 blocks, 8 heads (8.86M, 100 classes).

    ``embed_dim=376, ffn_dim=1024`` is the table's down-scaled OWF^d.
    """
    return _create_vit(
        {**_OWF, "embed_dim": 512, "ffn_dim": 2048, "depth": 6, "num_heads": 8}, kwargs
    )


# ---------------------------------------------------------------- MRLA (layer attention)

# MRLA Table 1 / App. B.1.1: DeiT's recipe, d_k = 16, three stages of four layers
_MRLA = dict(mrla="light", mrla_head_dim=16, mrla_stages=3)


@register_model
def deit_tiny_mrla_patch16_224(**kwargs) -> VisionTransformer:
    """DeiT-T + MRLA-light (MRLA Table 1: 5.7M, +0.03M): MRLA after each of the 12 layers."""
    return _create_vit({**_DEIT_TINY, **_MRLA}, kwargs)


@register_model
def deit_tiny_mrla_base_patch16_224(**kwargs) -> VisionTransformer:
    """DeiT-T + MRLA-base (MRLA Table 1, eq. 6): each layer attends to its stage so far."""
    return _create_vit({**_DEIT_TINY, **_MRLA, "mrla": "base"}, kwargs)


@register_model
def deit_small_mrla_patch16_224(**kwargs) -> VisionTransformer:
    """DeiT-S + MRLA-light (MRLA Table 1: 22.1M)."""
    return _create_vit({**_DEIT_SMALL, **_MRLA}, kwargs)


@register_model
def deit_base_mrla_patch16_224(**kwargs) -> VisionTransformer:
    """DeiT-B + MRLA-light (MRLA Table 1: 86.5M): 768 wide, 12 heads, drop path 0.1."""
    return _create_vit({**_VIT_BASE, "drop_path_rate": 0.1, **_MRLA}, kwargs)


@register_model
def deit_tiny_recursive_mrla_patch16_224(**kwargs) -> VisionTransformer:
    """DeiT-T with every block looped twice (SReT Table 1) and MRLA-light at all 24 levels.

    Three stages of eight levels; the MRLA parts are per level although blocks repeat, so a
    block's second run retrieves from its first.
    """
    return _create_vit({**_recursive(_DEIT_TINY, 2), **_MRLA}, kwargs)


@register_model
def ringformer_vit_base_mrla_patch16_224(**kwargs) -> VisionTransformer:
    """RingFormer-ViT (RingFormer Table 3) with MRLA-light after each of its 12 levels.

    One shared block; the level signals and the MRLA parts are per level (three stages of
    four levels).
    """
    return _create_vit(
        {
            **_RINGFORMER,
            "embed_dim": 768,
            "ffn_dim": 3072,
            "depth": 12,
            "num_heads": 12,
            **_MRLA,
        },
        kwargs,
    )


# ---------------------------------------------------------------- relaxed recursion

# Relaxed Recursive Transformers (Bae et al. 2025): half the blocks looped twice in a cycle
# (eq. 2, level l runs block l mod M, as their recursive Gemma 1B from Gemma 2B), a LoRA and
# bias deltas per level on every linear (eq. 3), per-level norms; start one from a trained
# DeiT with ``python -m recurnmt.vision.convert`` (docs/relaxed.md)
_RELAXED = vit_family("relaxed_transformer")


@register_model
def deit_tiny_relaxed_patch16_224(**kwargs) -> VisionTransformer:
    """DeiT-Ti as a relaxed recursive Transformer: 6 blocks looped twice over 12 levels,
    rank-16 LoRA and bias deltas per level, drop path 0.1 as DeiT."""
    return _create_vit({**_DEIT_TINY, **_RELAXED, "unique_layers": 6}, kwargs)


# ---------------------------------------------------------------- mini models for CPUs

_MINI = dict(embed_dim=64, ffn_dim=128, num_heads=4, img_size=32, patch_size=4)


@register_model(img_size=32)
def vit_mini_patch4(**kwargs) -> VisionTransformer:
    """A CPU-sized ViT: 64 wide, 6 layers, 4 x 4 patches of 32 x 32 (or digits' 16 x 16) images."""
    return _create_vit({**_MINI, "depth": 6}, kwargs)


@register_model(img_size=32)
def recursive_vit_mini_patch4(**kwargs) -> VisionTransformer:
    """The mini ViT with 3 blocks, each looped twice (naive recursion, SReT eq. 4)."""
    return _create_vit({**_MINI, "depth": 6, "unique_layers": 3}, kwargs)


@register_model(img_size=32)
def ringformer_vit_mini_patch4(**kwargs) -> VisionTransformer:
    """A CPU-sized RingFormer-ViT: one 64-wide block over 6 levels, signal rank 8."""
    return _create_vit(
        {**_MINI, **_RINGFORMER, "depth": 6, "signal": SignalConfig(kind="lowrank", rank=8)},
        kwargs,
    )


@register_model(img_size=32)
def uit_mini_patch4(**kwargs) -> VisionTransformer:
    """A CPU-sized UiT: one 64-wide block over 6 levels with sinusoidal level embeddings."""
    return _create_vit({**_MINI, **_UIT, "depth": 6}, kwargs)


@register_model(img_size=32)
def owf_vit_mini_patch4(**kwargs) -> VisionTransformer:
    """A CPU-sized One Wide FFN ViT: 6 attention blocks, 64 wide, one shared FFN."""
    return _create_vit({**_MINI, **_OWF, "depth": 6}, kwargs)


@register_model(img_size=32)
def vit_mini_mrla_patch4(**kwargs) -> VisionTransformer:
    """The mini ViT with MRLA-light after each of its 6 layers (three stages of two)."""
    return _create_vit({**_MINI, "depth": 6, **_MRLA}, kwargs)


@register_model(img_size=32)
def ringformer_vit_mini_mrla_patch4(**kwargs) -> VisionTransformer:
    """The mini RingFormer-ViT with MRLA-light after each of its 6 levels (three stages of two)."""
    return _create_vit(
        {
            **_MINI,
            **_RINGFORMER,
            "depth": 6,
            "signal": SignalConfig(kind="lowrank", rank=8),
            **_MRLA,
        },
        kwargs,
    )


@register_model(img_size=32)
def relaxed_vit_mini_patch4(**kwargs) -> VisionTransformer:
    """A CPU-sized relaxed recursive ViT: 3 blocks looped twice over 6 levels, LoRA rank 8."""
    return _create_vit(
        {**_MINI, **_RELAXED, "depth": 6, "unique_layers": 3, "lora_rank": 8}, kwargs
    )
