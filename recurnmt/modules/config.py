"""Configuration of a recurrent Transformer stack, validated when it is built.

One dataclass describes everything a stack of levels needs: widths, the depth plan (how many
unique blocks execute over how many levels, and in which order) and the per-level parts
(layer norms, RingFormer level signals, Universal Transformer level embeddings). Impossible
settings raise :class:`ConfigError` naming the offending setting, before any weight exists.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

SHARING_SCHEMES = ("sequence", "cycle", "cycle_rev")
SIGNAL_KINDS = ("lowrank", "full", "static", "none")
ATTN_SIGNAL_PLACES = ("after", "before", "none")
FFN_SIGNAL_PLACES = ("input", "inter", "none")
SIGNAL_DOWN_INITS = ("normal", "kaiming")
ACTIVATIONS = ("relu", "gelu")
FFN_SHARING = ("block", "shared", "none")
LRC_MODES = ("none", "both", "identity", "main")


class ConfigError(ValueError):
    """An impossible setting: which setting, its value, and why.

    ``str(err)`` is ``"{setting}={value!r}: {reason}"``. A reason that involves other settings
    names them as ``{name}`` placeholders with their values in ``related``; they are written
    out as ``name=value``, so that :meth:`renamed` can translate every name in the message
    (a config field to a command-line flag) without matching message text.

    ``ConfigError(message)`` with a single argument is a plain message naming no setting
    (``setting`` is then None).

    Args:
        setting: the setting's name, in the vocabulary of whoever raises (a config field such
            as ``num_heads``, or a flag such as ``--encoder-layers``); or the whole message.
        value: the offending value.
        reason: why the value is impossible.
        related: other settings the reason refers to, ``{name: value}``.

    Attributes:
        setting: as given (None for a plain message).
        value: as given (None for a plain message).
        reason: the reason, with the related settings written out.
        related: as given.
    """

    def __init__(
        self,
        setting: str | None,
        value: Any = None,
        reason: str | None = None,
        related: Mapping[str, Any] | None = None,
    ) -> None:
        if reason is None:  # ConfigError(message)
            if value is not None or related:
                raise TypeError("ConfigError(setting, value, reason): the reason is missing")
            setting, reason = None, str(setting)
        super().__init__(setting, value, reason, related)
        self.setting = setting
        self.value = value
        self._template = reason
        self.related = dict(related or {})

    @property
    def reason(self) -> str:
        def name(match: re.Match[str]) -> str:
            key = match.group(1)
            return f"{key}={self.related[key]!r}" if key in self.related else match.group(0)

        return re.sub(r"\{([\w.-]+)\}", name, self._template)

    def __str__(self) -> str:
        if self.setting is None:
            return self.reason
        return f"{self.setting}={self.value!r}: {self.reason}"

    def renamed(self, names: Mapping[str, str]) -> ConfigError:
        """A copy in which every setting found in ``names`` is called by its new name.

        Args:
            names: old name -> new name; settings not in it keep their names.
        """

        def new(key: str) -> str:
            return names.get(key, key)

        template = re.sub(
            r"\{([\w.-]+)\}",
            lambda m: "{" + new(m.group(1)) + "}" if m.group(1) in self.related else m.group(0),
            self._template,
        )
        setting = None if self.setting is None else new(self.setting)
        related = {new(k): v for k, v in self.related.items()}
        return type(self)(setting, self.value, template, related)


@dataclass(frozen=True)
class SignalConfig:
    """RingFormer level signals (RingFormer sec. 3.2, eq. 5-7).

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

    kind: str = "none"
    rank: int | None = None
    attn: str = "after"
    ffn: str = "input"
    down_init: str = "normal"
    down_std: float = 1e-6

    @property
    def learned(self) -> bool:
        return self.kind in ("lowrank", "full")


@dataclass(frozen=True)
class StackConfig:
    """A stack of ``num_levels`` levels executing ``num_unique`` unique blocks.

    Attributes:
        embed_dim: model width H.
        ffn_dim: feed-forward inner width FF.
        num_heads: attention heads; must divide ``embed_dim``.
        num_levels: N, the depth seen by the data.
        num_unique: M, the number of blocks with their own weights (1 = fully recurrent,
            N = vanilla). ``None`` means N.
        sharing: order in which levels visit the unique blocks (Takase & Kiyono 2021):
            ``sequence`` (0,0,1,1,..), ``cycle`` (0,1,0,1,..) or ``cycle_rev``.
        norms_per_level: every level owns its layer norms (RingFormer sec. 3.2) instead of
            the block owning them.
        normalize_before: pre-LN (True) or post-LN (False) residual blocks.
        signal: the per-level level signals.
        cross_attention: decoder blocks attend to an encoder memory.
        causal: causal self-attention (decoders): a position attends to itself and earlier
            positions only.
        dropout: residual and embedding dropout.
        attention_dropout: dropout on attention probabilities.
        activation_dropout: dropout after the FFN non-linearity.
        activation: FFN non-linearity.
        bias: biases in the attention and FFN projections (Q, K, V, output, up, down); the
            RingFormer authors' translation code has none (``"bias": 0`` in its
            ``config.json``), which gives RingFormer Table 1's P* exactly.
        ffn_sharing: every block has its own FFN (``block``), all blocks of the stack share
            one FFN (``shared``, One Wide FFN, Pires et al. 2023) or blocks have no FFN
            (``none``, OWF's decoder).
        lrc: learnable residual coefficients on every residual (SReT eq. 9-10): ``both``
            branches, the ``identity`` branch, the ``main`` branch, or ``none``.
        nll_ratio: hidden ratio of SReT's non-linear projection layer after every level
            (SReT eq. 5); 0 disables NLLs.
        attn_groups: sliced group self-attention (SReT sec. 4): the number of groups at each
            loop of a block (loop r of a block uses ``attn_groups[r]``); empty = global
            attention everywhere.
        positions_every_level: the caller's position embeddings are added at every level
            together with the level embedding (Universal Transformer coordinate embedding).
        coordinate_scale: factor on what is added at every level: the level embedding and,
            with ``positions_every_level``, the positions (1: the full sinusoids of UT
            sec. 2.1). In a post-LN stack the full sinusoids, re-added to a normalised state at
            every level, outweigh the tokens: at initialisation the last level's output is
            nearly the same for every sentence (``tests/test_ut_stability.py``).
        act: Adaptive Computation Time halting over the levels (Universal Transformer
            sec. 2.2).
        act_threshold: 1 - eps of ACT.
        act_bias_init: initial bias of the halting unit.
        drop_path: stochastic depth (Huang et al. 2016, as in DeiT/SReT): the rate of dropping
            a residual branch per sample grows linearly from 0 at the first level to this
            value at the last (timm's ``linspace(0, drop_path, N)``).
        level_drop_path: explicit per-level stochastic depth rates (length N), for schedules
            that span several stacks (SReT's stages); overrides ``drop_path``.
        final_norm: a layer norm after the last level; None means "when pre-LN".
        norm_eps: epsilon of every layer norm (1e-5 as in fairseq; timm/SReT use 1e-6).
        attn_permute: sliced group attention permutes the tokens before slicing at loop r
            when ``attn_permute[r]`` (SReT appendix C/D "P+I"); contiguous slices otherwise.
            Empty = SReT Algorithm 1: contiguous slices at a block's first loop, permuted
            ones at every later loop.
        lora_rank: relaxed recursion (Relaxed Recursive Transformers eq. 3): every level owns
            a LoRA of this rank on every linear of its block (Q/K/V, attention output,
            cross-attention, FFN up and down; each capped at its full rank, so
            ``embed_dim`` is the full rank of all of them) and, with ``bias``, a bias delta
            on each; 0: none (plain sharing). See :mod:`recurnmt.modules.level_lora`.
    """

    embed_dim: int = 512
    ffn_dim: int = 2048
    num_heads: int = 8
    num_levels: int = 6
    num_unique: int | None = None
    sharing: str = "cycle"
    norms_per_level: bool = False
    normalize_before: bool = False
    signal: SignalConfig = field(default_factory=SignalConfig)
    cross_attention: bool = False
    causal: bool = False
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    activation: str = "relu"
    bias: bool = True
    ffn_sharing: str = "block"
    lrc: str = "none"
    nll_ratio: float = 0.0
    attn_groups: tuple[int, ...] = ()
    positions_every_level: bool = False
    coordinate_scale: float = 1.0
    act: bool = False
    act_threshold: float = 0.99
    act_bias_init: float = 1.0
    drop_path: float = 0.0
    level_drop_path: tuple[float, ...] = ()
    final_norm: bool | None = None
    norm_eps: float = 1e-5
    attn_permute: tuple[bool, ...] = ()
    lora_rank: int = 0

    def __post_init__(self) -> None:
        _positive("embed_dim", self.embed_dim)
        _positive("ffn_dim", self.ffn_dim)
        _positive("num_heads", self.num_heads)
        _positive("num_levels", self.num_levels)
        if self.embed_dim % self.num_heads:
            raise ConfigError(
                "num_heads",
                self.num_heads,
                "does not divide {embed_dim}",
                {"embed_dim": self.embed_dim},
            )
        if self.num_unique is not None:
            _positive("num_unique", self.num_unique)
            if self.num_unique > self.num_levels:
                raise ConfigError(
                    "num_unique",
                    self.num_unique,
                    "must not exceed {num_levels} (every unique block runs at one level or more)",
                    {"num_levels": self.num_levels},
                )
        _choice("sharing", self.sharing, SHARING_SCHEMES)
        _choice("activation", self.activation, ACTIVATIONS)
        _choice("signal.kind", self.signal.kind, SIGNAL_KINDS)
        _choice("signal.attn", self.signal.attn, ATTN_SIGNAL_PLACES)
        _choice("signal.ffn", self.signal.ffn, FFN_SIGNAL_PLACES)
        _choice("signal.down_init", self.signal.down_init, SIGNAL_DOWN_INITS)
        if not self.signal.down_std >= 0:
            raise ConfigError("signal.down_std", self.signal.down_std, "must be >= 0")
        _choice("ffn_sharing", self.ffn_sharing, FFN_SHARING)
        _choice("lrc", self.lrc, LRC_MODES)
        if self.nll_ratio < 0:
            raise ConfigError("nll_ratio", self.nll_ratio, "must be >= 0")
        if any(not isinstance(g, int) or g <= 0 for g in self.attn_groups):
            raise ConfigError("attn_groups", self.attn_groups, "must be positive integers")
        if (self.cross_attention or self.causal) and any(g > 1 for g in self.attn_groups):
            raise ConfigError(
                "attn_groups",
                self.attn_groups,
                "sliced group attention is for encoder self-attention only; in a causal "
                "decoder a token's group would depend on future tokens, so step-by-step "
                "decoding could not match the full pass",
            )
        if not 0.0 < self.act_threshold <= 1.0:
            raise ConfigError("act_threshold", self.act_threshold, "must lie in (0, 1]")
        if self.ffn_sharing == "none" and self.signal.learned and self.signal.ffn != "none":
            raise ConfigError(
                "ffn_sharing",
                self.ffn_sharing,
                "removes the FFN, so it cannot carry the FFN level signal {signal.ffn} "
                "(set it to 'none')",
                {"signal.ffn": self.signal.ffn},
            )
        if self.level_drop_path and len(self.level_drop_path) != self.num_levels:
            raise ConfigError(
                "level_drop_path",
                self.level_drop_path,
                f"{len(self.level_drop_path)} rates for {{num_levels}} levels",
                {"num_levels": self.num_levels},
            )
        if any(not 0.0 <= r < 1.0 for r in self.level_drop_path):
            raise ConfigError("level_drop_path", self.level_drop_path, "must lie in [0, 1)")
        if any(not isinstance(p, bool) for p in self.attn_permute):
            raise ConfigError("attn_permute", self.attn_permute, "must be booleans, one per loop")
        if self.coordinate_scale < 0:
            raise ConfigError("coordinate_scale", self.coordinate_scale, "must be >= 0")
        if self.norm_eps <= 0:
            raise ConfigError("norm_eps", self.norm_eps, "must be positive")
        for name in ("dropout", "attention_dropout", "activation_dropout", "drop_path"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ConfigError(name, value, "must lie in [0, 1)")
        if self.signal.kind == "lowrank" and self.signal.rank is not None:
            rank = self.signal.rank
            if rank <= 0 or rank > self.embed_dim:
                raise ConfigError(
                    "signal.rank",
                    rank,
                    "must lie between 1 and {embed_dim}",
                    {"embed_dim": self.embed_dim},
                )
        if not isinstance(self.lora_rank, int) or not 0 <= self.lora_rank <= self.embed_dim:
            raise ConfigError(
                "lora_rank",
                self.lora_rank,
                "must lie between 0 (no relaxation) and {embed_dim} (the full rank)",
                {"embed_dim": self.embed_dim},
            )
        if self.lora_rank and self.signal.learned and self.signal.attn == "before":
            raise ConfigError(
                "lora_rank",
                self.lora_rank,
                "a level LoRA reads the input of the Q/K/V projection, which {signal.attn} "
                "changes per projection; place the attention signal 'after'",
                {"signal.attn": self.signal.attn},
            )
        if self.signal.kind == "lowrank" and self.signal.rank is None and self.embed_dim < 16:
            raise ConfigError(
                "signal.rank",
                None,
                "the default rank, width // 16, is 0 for {embed_dim}; set the rank",
                {"embed_dim": self.embed_dim},
            )

    @property
    def has_final_norm(self) -> bool:
        return self.normalize_before if self.final_norm is None else self.final_norm

    def drop_path_rate(self, level: int) -> float:
        """Stochastic depth rate at ``level``: ``level_drop_path`` if given, else linear from
        0 at the first level to ``drop_path`` at the last (DeiT / timm rule)."""
        if self.level_drop_path:
            return self.level_drop_path[level]
        if self.num_levels == 1:
            return 0.0
        return self.drop_path * level / (self.num_levels - 1)

    @property
    def signal_rank(self) -> int:
        """The effective low-rank signal rank (RingFormer sec. 4.1: H / 16 by default)."""
        return self.signal.rank if self.signal.rank is not None else self.embed_dim // 16

    def replace(self, **changes) -> StackConfig:
        return replace(self, **changes)


def _positive(name: str, value: int) -> None:
    if not isinstance(value, int) or value <= 0:
        raise ConfigError(name, value, "must be a positive integer")


def _choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(name, value, f"choose one of {', '.join(choices)}")
