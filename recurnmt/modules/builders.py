"""Builders: a :class:`~recurnmt.modules.config.StackConfig` -> the modules of a stack.

Modules receive their parts built; these functions are the one place that reads a config to
build them (torchtune's component builders). A new architecture that a config cannot express
builds its own blocks, level parts or plan and hands them to
:class:`~recurnmt.modules.stack.RecurrentStack` directly.
"""

from __future__ import annotations

from torch import nn

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


def num_sublayers(cfg: StackConfig) -> int:
    """Residual sub-layers of a block: self-attention, cross-attention?, FFN?."""
    return 1 + int(cfg.cross_attention) + int(cfg.ffn_sharing != "none")


def build_plan(cfg: StackConfig) -> DepthPlan:
    """The level -> block plan of ``cfg`` (Takase & Kiyono 2021 orders)."""
    return DepthPlan.build(cfg.num_levels, cfg.num_unique, cfg.sharing)


def build_ffn(cfg: StackConfig) -> FeedForward:
    return FeedForward(cfg.embed_dim, cfg.ffn_dim, cfg.activation, cfg.activation_dropout, cfg.bias)


def _norms(cfg: StackConfig) -> nn.ModuleList:
    return nn.ModuleList(
        nn.LayerNorm(cfg.embed_dim, eps=cfg.norm_eps) for _ in range(num_sublayers(cfg))
    )


def build_block(cfg: StackConfig, ffn: FeedForward | None = None) -> TransformerBlock:
    """One block of ``cfg``; ``ffn`` is used instead of a new FFN when given (One Wide FFN)."""
    c = cfg.embed_dim
    # built in this order so that a seed gives the same weights as before the refactoring
    self_attn = SelfAttention(c, cfg.num_heads, cfg.attention_dropout, cfg.bias, cfg.causal)
    cross_attn = (
        CrossAttention(c, cfg.num_heads, dropout=cfg.attention_dropout, bias=cfg.bias)
        if cfg.cross_attention
        else None
    )
    if ffn is None and cfg.ffn_sharing == "block":
        ffn = build_ffn(cfg)
    return TransformerBlock(
        self_attn,
        ffn if cfg.ffn_sharing != "none" else None,
        cross_attn=cross_attn,
        norms=None if cfg.norms_per_level else _norms(cfg),
        lrc=ResidualCoefficients(num_sublayers(cfg), cfg.lrc),
        dropout=cfg.dropout,
        normalize_before=cfg.normalize_before,
    )


def build_level_parts(cfg: StackConfig, plan: DepthPlan, level: int) -> LevelParts:
    """The parts level ``level`` of ``cfg`` owns (see :class:`LevelParts`)."""
    c, sig = cfg.embed_dim, cfg.signal
    loop = plan.loop_of_level(level)
    groups = cfg.attn_groups[loop] if cfg.attn_groups else 1
    # SReT Algorithm 1: a block's first loop slices contiguously, later loops permute
    permute = cfg.attn_permute[loop] if cfg.attn_permute else loop > 0
    embedding = None
    if sig.kind == "static" or cfg.positions_every_level:
        embedding = cfg.coordinate_scale * sinusoidal_level_embedding(cfg.num_levels, c)[level]
    init = {"down_init": sig.down_init, "down_std": sig.down_std}
    return LevelParts(
        level,
        norms=_norms(cfg) if cfg.norms_per_level else None,
        attn_signal=(
            build_signal(sig.kind, c, c, cfg.signal_rank, groups=3, **init)
            if sig.learned and sig.attn != "none"
            else None
        ),
        attn_place="after" if sig.attn == "none" else sig.attn,
        ffn_signal=(
            build_signal(
                sig.kind, c, cfg.ffn_dim if sig.ffn == "inter" else c, cfg.signal_rank, **init
            )
            if sig.learned and sig.ffn != "none"
            else None
        ),
        ffn_place="input" if sig.ffn == "none" else sig.ffn,
        level_embedding=embedding,
        nll=(
            NonLinearProjection(c, cfg.nll_ratio, cfg.activation, cfg.lrc, cfg.norm_eps)
            if cfg.nll_ratio > 0
            else None
        ),
        # seeded by the level, so that evaluation slices each level along its own partition
        slicing=SlicedGroups(groups, permute, seed=level) if groups > 1 else None,
        drop_path=cfg.drop_path_rate(level),
        lora=(
            LevelLoRA(
                c,
                cfg.ffn_dim,
                cfg.lora_rank,
                cross_attention=cfg.cross_attention,
                ffn=cfg.ffn_sharing != "none",
                bias=cfg.bias,
            )
            if cfg.lora_rank
            else None
        ),
    )


def build_stack(cfg: StackConfig, plan: DepthPlan | None = None) -> RecurrentStack:
    """The stack ``cfg`` describes.

    Args:
        cfg: the configuration (validated when it was made).
        plan: a level -> block plan to use instead of the one ``cfg``'s sharing scheme gives
            (a new sharing scheme needs no change anywhere else); it must have
            ``cfg.num_levels`` levels.

    Raises:
        ConfigError: the plan does not fit the configuration.
    """
    plan = build_plan(cfg) if plan is None else plan
    if plan.num_levels != cfg.num_levels:
        raise ConfigError(
            "num_levels", cfg.num_levels, f"the depth plan has {plan.num_levels} levels"
        )
    for name, per_loop in (("attn_groups", cfg.attn_groups), ("attn_permute", cfg.attn_permute)):
        if per_loop and len(per_loop) < plan.num_loops:
            raise ConfigError(
                name,
                per_loop,
                f"gives a setting for {len(per_loop)} loop(s), but blocks run up to "
                f"{plan.num_loops} times",
            )
    shared_ffn = build_ffn(cfg) if cfg.ffn_sharing == "shared" else None
    return RecurrentStack(
        [build_block(cfg, shared_ffn) for _ in range(plan.num_unique)],
        [build_level_parts(cfg, plan, i) for i in range(cfg.num_levels)],
        plan,
        halting=(
            HaltingUnit(cfg.embed_dim, cfg.act_bias_init, cfg.act_threshold) if cfg.act else None
        ),
        final_norm=nn.LayerNorm(cfg.embed_dim, eps=cfg.norm_eps) if cfg.has_final_norm else None,
    )
