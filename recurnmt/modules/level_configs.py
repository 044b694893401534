"""The per-level parts of the papers: RingFormer's level signals, the Universal Transformer's
coordinates and halting, SReT's residuals and sliced attention, relaxed recursion's LoRA.

Each part config is a group of options that one builder reads (:mod:`recurnmt.modules.builders`),
every option declared once as a field (:func:`~recurnmt.modules.declarations.option`: default,
valid values, its help); the parts
every stack has are in :mod:`recurnmt.modules.block_configs`;
:class:`~recurnmt.modules.config.StackConfig` holds them all.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from recurnmt.modules.block_configs import ON_OFF
from recurnmt.modules.declarations import Part, option
from recurnmt.modules.errors import ConfigError

if TYPE_CHECKING:
    from recurnmt.modules.config import StackConfig

SIGNAL_KINDS = ("lowrank", "full", "static", "none")
ATTN_SIGNAL_PLACES = ("after", "before", "none")
FFN_SIGNAL_PLACES = ("input", "inter", "none")
SIGNAL_DOWN_INITS = ("normal", "kaiming")
LRC_MODES = ("none", "both", "identity", "main")
ACT_RULES = ("authors", "paper")


@dataclass(frozen=True)
class SignalConfig(Part):
    """RingFormer level signals (RingFormer sec. 3.2, eq. 5-7;
    :func:`~recurnmt.modules.builders.build_signals`).

    Attributes:
        kind: ``lowrank`` (eq. 5, the paper's design), ``full`` (one d x d matrix per signal,
            Table 4 "full-rank signal"), ``static`` (input-independent sinusoidal level
            embedding, Table 4 "static signal", as in Universal Transformers) or ``none``.
        rank: rank r of the low-rank signals; ``None`` means width // 16 (paper default).
        attn: where the attention signals go: ``after`` the Q/K/V projections (eq. 6),
            ``before`` them (Table 4 "before attn") or ``none`` (Table 4 "w.o. attn signal").
        ffn: where the feed-forward signal goes: on the FFN ``input`` before the
            up-projection (eq. 7), on the ``inter``-mediate activation pre-nonlinearity
            (Table 4 "inter-FF signal") or ``none`` (Table 4 "w.o. FF signal").
        down_init: how a low-rank signal's down factor starts (its up factor starts at zero,
            sec. 3.2; the paper says no more): ``normal``, N(0, ``down_std``^2) as the
            RingFormer authors' code, or ``kaiming``, LoRA's code (Kaiming-uniform). See
            :mod:`recurnmt.modules.level_signals`.
        down_std: standard deviation of ``normal`` (the authors' code: 1e-6).
    """

    kind: str = option(
        "none",
        "level signals: lowrank (RingFormer eq. 5), full (d x d), static (sinusoidal level "
        "embedding, Universal Transformer) or none",
        name="signal.kind",
        choices=SIGNAL_KINDS,
    )
    rank: int | None = option(
        None,
        "rank of the low-rank level signals (default: embed dim // 16)",
        name="signal.rank",
        type=int,
        metavar="R",
    )
    attn: str = option(
        "after",
        "attention level signals after the Q/K/V projections (RingFormer eq. 6), before them, "
        "or none",
        name="signal.attn",
        choices=ATTN_SIGNAL_PLACES,
    )
    ffn: str = option(
        "input",
        "FFN level signal on the FFN input (RingFormer eq. 7), on the intermediate activation "
        "(inter), or none",
        name="signal.ffn",
        choices=FFN_SIGNAL_PLACES,
    )
    down_init: str = option(
        "normal",
        "how the low-rank signals' down factors start (their up factors start at zero): "
        "normal, N(0, S^2) with S = {signal.down_std}, as RingFormer's code (the "
        "default), or kaiming, LoRA's code (Kaiming-uniform)",
        name="signal.down_init",
        choices=SIGNAL_DOWN_INITS,
    )
    down_std: float = option(
        1e-6,
        "standard deviation of {signal.down_init} normal (RingFormer's code: 1e-6)",
        name="signal.down_std",
        type=float,
        metavar="S",
    )

    @property
    def learned(self) -> bool:
        return self.kind in ("lowrank", "full")

    def check(self, stack: StackConfig) -> None:
        if not self.down_std >= 0:
            raise ConfigError("signal.down_std", self.down_std, "must be >= 0")
        width = {"embed_dim": stack.embed_dim}
        if self.kind == "lowrank" and self.rank is not None:
            if self.rank <= 0 or self.rank > stack.embed_dim:
                raise ConfigError(
                    "signal.rank", self.rank, "must lie between 1 and {embed_dim}", width
                )
        if self.kind == "lowrank" and self.rank is None and stack.embed_dim < 16:
            raise ConfigError(
                "signal.rank",
                None,
                "the default rank, width // 16, is 0 for {embed_dim}; set the rank",
                width,
            )


@dataclass(frozen=True)
class CoordinateConfig(Part):
    """What a Universal Transformer adds at every level (UT sec. 2.1; the level embedding
    itself comes with a ``static`` signal or these positions;
    :func:`~recurnmt.modules.builders.build_level_embedding`).

    Attributes:
        positions_every_level: the caller's position embeddings are added at every level
            together with the level embedding (Universal Transformer coordinate embedding).
        scale: factor on what is added at every level: the level embedding and,
            with ``positions_every_level``, the positions (1: the full sinusoids of UT
            sec. 2.1). In a post-LN stack the full sinusoids, re-added to a normalised state at
            every level, outweigh the tokens: at initialisation the last level's output is
            nearly the same for every sentence (``tests/test_ut_stability.py``).
    """

    positions_every_level: bool = option(
        False,
        "add position embeddings at the input only, or at every level together with the "
        "level embedding (Universal Transformer coordinate embedding)",
        words={"input": False, "every-level": True},
    )
    scale: float = option(
        1.0,
        "scale of the coordinate embedding added at every level (level embedding, and "
        "positions with {positions_every_level} every-level); 1 is the UT paper's full sinusoid",
        name="coordinate_scale",
        type=float,
    )

    def check(self, stack: StackConfig) -> None:
        if self.scale < 0:
            raise ConfigError("coordinate_scale", self.scale, "must be >= 0")


@dataclass(frozen=True)
class ResidualConfig(Part):
    """SReT's residuals: learnable coefficients and the NLL after every level (SReT eq. 5-10;
    :func:`~recurnmt.modules.builders.build_nll`).

    Attributes:
        lrc: learnable residual coefficients on every residual (SReT eq. 9-10): ``both``
            branches, the ``identity`` branch, the ``main`` branch, or ``none``.
        nll_ratio: hidden ratio of SReT's non-linear projection layer after every level
            (SReT eq. 5); 0 disables NLLs.
    """

    lrc: str = option(
        "none",
        "learnable residual coefficients (SReT eq. 9-10) on both branches, the identity "
        "branch, the main branch, or none",
        choices=LRC_MODES,
    )
    nll_ratio: float = option(
        0.0,
        "SReT non-linear projection layer after every level with hidden ratio R (SReT eq. 5); "
        "0 = none",
        type=float,
        metavar="R",
    )

    def check(self, stack: StackConfig) -> None:
        if self.nll_ratio < 0:
            raise ConfigError("nll_ratio", self.nll_ratio, "must be >= 0")


def int_list(text: str) -> tuple[int, ...]:
    """A command line's comma-separated integers (``2,1``) as a tuple."""
    try:
        return tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None


@dataclass(frozen=True)
class SlicingConfig(Part):
    """Sliced group self-attention per loop of a block (SReT sec. 4;
    :func:`~recurnmt.modules.builders.build_slicing`).

    Attributes:
        groups: the number of groups at each loop of a block (loop r of a block uses
            ``groups[r]``); empty = global attention everywhere.
        permute: sliced group attention permutes the tokens before slicing at loop r when
            ``permute[r]`` (SReT appendix C/D "P+I"); contiguous slices otherwise. Empty =
            SReT Algorithm 1: contiguous slices at a block's first loop, permuted ones at
            every later loop.
    """

    groups: tuple[int, ...] = option(
        (),
        "sliced group self-attention in the encoder: groups at loop 1, 2, ... of each block "
        "(SReT sec. 4); empty = global attention",
        name="attn_groups",
        type=int_list,
        metavar="G1,G2,...",
    )
    permute: tuple[bool, ...] = option((), name="attn_permute")

    def check(self, stack: StackConfig) -> None:
        if any(not isinstance(g, int) or g <= 0 for g in self.groups):
            raise ConfigError("attn_groups", self.groups, "must be positive integers")
        block = stack.block
        if (block.cross_attention or block.causal) and any(g > 1 for g in self.groups):
            raise ConfigError(
                "attn_groups",
                self.groups,
                "sliced group attention is for encoder self-attention only; in a causal "
                "decoder a token's group would depend on future tokens, so step-by-step "
                "decoding could not match the full pass",
            )
        if any(not isinstance(p, bool) for p in self.permute):
            raise ConfigError("attn_permute", self.permute, "must be booleans, one per loop")


@dataclass(frozen=True)
class HaltingConfig(Part):
    """Adaptive Computation Time halting over the levels (Universal Transformer sec. 2.2;
    :func:`~recurnmt.modules.builders.build_halting`).

    Attributes:
        act: halt (ACT) or run every level.
        threshold: 1 - eps of ACT.
        bias_init: initial bias of the halting unit.
        rule: what a halted position does at deeper levels: ``authors``, as the Universal
            Transformer's code (tensor2tensor): it is still transformed (a key and value for
            the positions that run on) while its output stops changing; or ``paper``, as UT
            sec. 2.2 says ("once a symbol halts, its state is simply copied to the next step"):
            its state is frozen, it stays a key and value and does no other work
            (:mod:`recurnmt.modules.act_rule`).
    """

    act: bool = option(
        False,
        "Adaptive Computation Time halting over the levels (Universal Transformer sec. 2.2); "
        "its ponder cost is a term of the training loss",
        words=ON_OFF,
    )
    threshold: float = option(
        0.99,
        "ACT halting threshold 1 - eps",
        name="act_threshold",
        type=float,
    )
    bias_init: float = option(1.0, "initial halting unit bias", name="act_bias_init", type=float)
    rule: str = option(
        "authors",
        "what a halted position does at deeper levels: authors (the UT code: it is still "
        "transformed, only its output stops changing) or paper (UT sec. 2.2: its state is "
        "copied on, a key and value only; the levels skip its work)",
        name="act_rule",
        choices=ACT_RULES,
    )

    def check(self, stack: StackConfig) -> None:
        if not 0.0 < self.threshold <= 1.0:
            raise ConfigError("act_threshold", self.threshold, "must lie in (0, 1]")
        if self.rule != "authors" and not self.act:
            raise ConfigError(
                "act_rule", self.rule, "a halting rule needs ACT ({act})", {"act": "on"}
            )


def rank_or_full(text: Any, options: Mapping[str, Any]) -> int:
    """The option ``lora_rank`` from text: a rank >= 0, or ``full`` (the width, the full rank of every
    linear of the block).

    Raises:
        ConfigError: anything else, naming the option.
    """
    if str(text).strip() == "full":
        return options["embed_dim"]
    try:
        return int(str(text).strip())
    except ValueError:
        raise ConfigError("lora_rank", text, "choose a rank >= 0 or full") from None


@dataclass(frozen=True)
class LoRAConfig(Part):
    """Relaxed recursion (Relaxed Recursive Transformers eq. 3; see
    :mod:`recurnmt.modules.level_lora`; :func:`~recurnmt.modules.builders.build_lora`).

    Attributes:
        rank: every level owns a LoRA of this rank on every linear of its block (Q/K/V,
            attention output, cross-attention, FFN up and down; each capped at its full rank,
            so ``embed_dim`` is the full rank of all of them) and, with ``bias``, a bias delta
            on each; 0: none (plain sharing).
    """

    rank: int = option(
        0,
        "relaxed recursion (Relaxed Recursive Transformers eq. 3): every level owns a LoRA of "
        "rank R (and bias deltas) on every linear of its shared block; 0: plain sharing, "
        "full: the full rank (the embed dim)",
        name="lora_rank",
        parse=rank_or_full,
        metavar="R",
    )

    def check(self, stack: StackConfig) -> None:
        if not isinstance(self.rank, int) or not 0 <= self.rank <= stack.embed_dim:
            raise ConfigError(
                "lora_rank",
                self.rank,
                "must lie between 0 (no relaxation) and {embed_dim} (the full rank)",
                {"embed_dim": stack.embed_dim},
            )
        sig = stack.signal
        if self.rank and sig.learned and sig.attn == "before":
            raise ConfigError(
                "lora_rank",
                self.rank,
                "a level LoRA reads the input of the Q/K/V projection, which {signal.attn} "
                "changes per projection; place the attention signal 'after'",
                {"signal.attn": sig.attn},
            )
