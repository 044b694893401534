"""Builders: a :class:`~recurnmt.modules.config.StackConfig` -> the modules of a stack.

Modules receive their parts built; these functions are the one place that reads a config to
build them (torchtune's component builders), one function per part config: the plan reads
``depth``, a block ``block``, the norms ``norms``, and each per-level part its own config
(``signal``, ``coordinates``, ``residual``, ``slicing``, ``lora``, ``halting``). A new option
of a part is read by that part's builder. A new architecture that a config cannot express
builds its own blocks, level parts or plan and hands them to
:class:`~recurnmt.modules.stack.RecurrentStack` directly.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from recurnmt.modules.attention import CrossAttention, SelfAttention
from recurnmt.modules.block import TransformerBlock
from recurnmt.modules.config import ConfigError, StackConfig
from recurnmt.modules.depth_plan import DepthPlan
from recurnmt.modules.feedforward import FeedForward
from recurnmt.modules.halting import HaltingUnit
from recurnmt.modules.level_embedding import sinusoidal_level_embedding
from recurnmt.modules.level_lora import LevelLoRA
from recurnmt.modules.level_parts import LevelParts
from recurnmt.modules.level_signals import build_signal
from recurnmt.modules.nll import NonLinearProjection
from recurnmt.modules.residual import ResidualCoefficients
from recurnmt.modules.sliced_attention import SlicedGroups
from recurnmt.modules.stack import RecurrentStack


def build_plan(cfg: StackConfig) -> DepthPlan:
    """The level -> block plan of ``cfg.depth`` (Takase & Kiyono 2021 orders)."""
    depth = cfg.depth
    return DepthPlan.build(depth.num_levels, depth.num_unique, depth.sharing)


def build_ffn(cfg: StackConfig) -> FeedForward:
    b = cfg.block
    return FeedForward(
        cfg.embed_dim, b.ffn_dim, b.activation, cfg.regularization.activation_dropout, b.bias
    )


def build_norms(cfg: StackConfig) -> nn.ModuleList:
    """One layer norm per residual sub-layer of a block (the block's, or a level's own)."""
    return nn.ModuleList(
        nn.LayerNorm(cfg.embed_dim, eps=cfg.norms.eps) for _ in range(cfg.block.num_sublayers)
    )


def build_block(cfg: StackConfig, ffn: FeedForward | None = None) -> TransformerBlock:
    """One block of ``cfg``; ``ffn`` is used instead of a new FFN when given (One Wide FFN)."""
    c, b, reg = cfg.embed_dim, cfg.block, cfg.regularization
    # built in this order so that a seed gives the same weights as before the refactoring
    self_attn = SelfAttention(c, b.num_heads, reg.attention_dropout, b.bias, b.causal)
    cross_attn = (
        CrossAttention(c, b.num_heads, dropout=reg.attention_dropout, bias=b.bias)
        if b.cross_attention
        else None
    )
    if ffn is None and b.ffn_sharing == "block":
        ffn = build_ffn(cfg)
    return TransformerBlock(
        self_attn,
        ffn if b.ffn_sharing != "none" else None,
        cross_attn=cross_attn,
        norms=None if cfg.norms.per_level else build_norms(cfg),
        lrc=ResidualCoefficients(b.num_sublayers, cfg.residual.lrc),
        dropout=reg.dropout,
        normalize_before=cfg.norms.normalize_before,
    )


def build_signals(cfg: StackConfig) -> dict[str, Any]:
    """A level's RingFormer signals (eq. 5-7), as :class:`LevelParts` keywords."""
    c, sig = cfg.embed_dim, cfg.signal
    init = {"down_init": sig.down_init, "down_std": sig.down_std}
    out = cfg.block.ffn_dim if sig.ffn == "inter" else c
    return {
        "attn_signal": (
            build_signal(sig.kind, c, c, cfg.signal_rank, groups=3, **init)
            if sig.learned and sig.attn != "none"
            else None
        ),
        "attn_place": "after" if sig.attn == "none" else sig.attn,
        "ffn_signal": (
            build_signal(sig.kind, c, out, cfg.signal_rank, **init)
            if sig.learned and sig.ffn != "none"
            else None
        ),
        "ffn_place": "input" if sig.ffn == "none" else sig.ffn,
    }


def build_level_embedding(cfg: StackConfig, level: int) -> Tensor | None:
    """The sinusoidal level embedding of ``level`` (UT sec. 2.1; RingFormer's static signal),
    scaled by ``coordinates.scale``; None when the stack adds none. Defined at any level (also
    beyond the built ones, elastic depth)."""
    coords = cfg.coordinates
    if cfg.signal.kind != "static" and not coords.positions_every_level:
        return None
    rows = max(cfg.depth.num_levels, level + 1)
    return coords.scale * sinusoidal_level_embedding(rows, cfg.embed_dim)[level]


def build_nll(cfg: StackConfig) -> NonLinearProjection | None:
    """SReT's non-linear projection after a level (eq. 5), or None."""
    res = cfg.residual
    if res.nll_ratio <= 0:
        return None
    return NonLinearProjection(
        cfg.embed_dim, res.nll_ratio, cfg.block.activation, res.lrc, cfg.norms.eps
    )


def build_slicing(cfg: StackConfig, plan: DepthPlan, level: int) -> SlicedGroups | None:
    """The sliced group attention of ``level`` (SReT sec. 4: loop r of a block uses
    ``groups[r]``), or None for global attention."""
    slicing = cfg.slicing
    loop = plan.loop_of_level(level)
    groups = slicing.groups[loop] if slicing.groups else 1
    if groups <= 1:
        return None
    # SReT Algorithm 1: a block's first loop slices contiguously, later loops permute
    permute = slicing.permute[loop] if slicing.permute else loop > 0
    # seeded by the level, so that evaluation slices each level along its own partition
    return SlicedGroups(groups, permute, seed=level)


def build_lora(cfg: StackConfig) -> LevelLoRA | None:
    """A relaxed level's LoRA on every linear of its block (eq. 3), or None."""
    if not cfg.lora.rank:
        return None
    b = cfg.block
    return LevelLoRA(
        cfg.embed_dim,
        b.ffn_dim,
        cfg.lora.rank,
        cross_attention=b.cross_attention,
        ffn=b.ffn_sharing != "none",
        bias=b.bias,
    )


def build_level_parts(cfg: StackConfig, plan: DepthPlan, level: int) -> LevelParts:
    """The parts level ``level`` of ``cfg`` owns (see :class:`LevelParts`)."""
    embedding = build_level_embedding(cfg, level)
    # built in this order so that a seed gives the same weights as before the refactoring
    norms = build_norms(cfg) if cfg.norms.per_level else None
    return LevelParts(
        level,
        norms=norms,
        **build_signals(cfg),
        level_embedding=embedding,
        nll=build_nll(cfg),
        slicing=build_slicing(cfg, plan, level),
        drop_path=cfg.drop_path_rate(level),
        lora=build_lora(cfg),
    )


def build_halting(cfg: StackConfig) -> HaltingUnit | None:
    """ACT's halting unit (Universal Transformer sec. 2.2), or None."""
    act = cfg.halting
    if not act.act:
        return None
    return HaltingUnit(cfg.embed_dim, act.bias_init, act.threshold, rule=act.rule)


def build_stack(cfg: StackConfig, plan: DepthPlan | None = None) -> RecurrentStack:
    """The stack ``cfg`` describes.

    Args:
        cfg: the configuration (validated when it was made).
        plan: a level -> block plan to use instead of the one ``cfg``'s sharing scheme gives
            (a new sharing scheme needs no change anywhere else); it must have
            ``cfg.depth.num_levels`` levels.

    Raises:
        ConfigError: the plan does not fit the configuration.
    """
    plan = build_plan(cfg) if plan is None else plan
    num_levels = cfg.depth.num_levels
    if plan.num_levels != num_levels:
        raise ConfigError("num_levels", num_levels, f"the depth plan has {plan.num_levels} levels")
    for name, per_loop in (
        ("attn_groups", cfg.slicing.groups),
        ("attn_permute", cfg.slicing.permute),
    ):
        if per_loop and len(per_loop) < plan.num_loops:
            raise ConfigError(
                name,
                per_loop,
                f"gives a setting for {len(per_loop)} loop(s), but blocks run up to "
                f"{plan.num_loops} times",
            )
    shared_ffn = build_ffn(cfg) if cfg.block.ffn_sharing == "shared" else None
    return RecurrentStack(
        [build_block(cfg, shared_ffn) for _ in range(plan.num_unique)],
        [build_level_parts(cfg, plan, i) for i in range(num_levels)],
        plan,
        halting=build_halting(cfg),
        final_norm=nn.LayerNorm(cfg.embed_dim, eps=cfg.norms.eps) if cfg.norms.has_final else None,
    )
