"""Configuration of a recurrent Transformer stack, validated when it is made.

A :class:`StackConfig` is the model width and a few part configs, each a group of options that
one builder reads (:mod:`recurnmt.modules.builders`): the depth plan (how many unique blocks
execute over how many levels, and in which order), the block, its norms, dropout, and the
per-level parts of the papers (RingFormer level signals, Universal Transformer coordinates
and halting, SReT residuals and slicing, relaxed recursion's LoRA). Every option is declared
once, as a field of its part (:func:`~recurnmt.modules.declarations.option`): default, valid values
and the translation flag that sets it. Impossible settings raise :class:`ConfigError` naming
the option, before any weight exists.

Adding an option: a field of its part (and a rule in the part's ``check`` if it needs one),
read by the part's builder. Adding a part: a :class:`~recurnmt.modules.declarations.Part` here,
a field of :class:`StackConfig`, and its builder.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from recurnmt.modules.declarations import OptionField, Part, option, option_fields, part
from recurnmt.modules.errors import ConfigError

__all__ = [
    "BlockConfig",
    "ConfigError",
    "CoordinateConfig",
    "DepthConfig",
    "HaltingConfig",
    "LoRAConfig",
    "NormConfig",
    "RegularizationConfig",
    "ResidualConfig",
    "SignalConfig",
    "SlicingConfig",
    "StackConfig",
]

SHARING_SCHEMES = ("sequence", "cycle", "cycle_rev")
SIGNAL_KINDS = ("lowrank", "full", "static", "none")
ATTN_SIGNAL_PLACES = ("after", "before", "none")
FFN_SIGNAL_PLACES = ("input", "inter", "none")
SIGNAL_DOWN_INITS = ("normal", "kaiming")
ACTIVATIONS = ("relu", "gelu")
FFN_SHARING = ("block", "shared", "none")
LRC_MODES = ("none", "both", "identity", "main")
ON_OFF = {"on": True, "off": False}


@dataclass(frozen=True)
class DepthConfig(Part):
    """The depth plan (:func:`~recurnmt.modules.builders.build_plan`).

    Attributes:
        num_levels: N, the depth seen by the data.
        num_unique: M, the number of blocks with their own weights (1 = fully recurrent,
            N = vanilla). ``None`` means N.
        sharing: order in which levels visit the unique blocks (Takase & Kiyono 2021):
            ``sequence`` (0,0,1,1,..), ``cycle`` (0,1,0,1,..) or ``cycle_rev``.
    """

    num_levels: int = option(6, keyword="depth")
    num_unique: int | None = option(
        None,
        "unique {side} blocks M over the N = --{side}-layers levels (1: fully recurrent; "
        "N: vanilla)",
        flag="--{side}-unique-layers",
        type=int,
        metavar="M",
        keyword="unique_layers",
    )
    sharing: str = option(
        "cycle",
        "order in which levels visit the unique blocks (Takase & Kiyono 2021)",
        flag="--sharing-scheme",
        choices=SHARING_SCHEMES,
    )

    def check(self, stack: StackConfig) -> None:
        _positive("num_levels", self.num_levels)
        if self.num_unique is not None:
            _positive("num_unique", self.num_unique)
            if self.num_unique > self.num_levels:
                raise ConfigError(
                    "num_unique",
                    self.num_unique,
                    "must not exceed {num_levels} (every unique block runs at one level or more)",
                    {"num_levels": self.num_levels},
                )


@dataclass(frozen=True)
class BlockConfig(Part):
    """A block's sub-modules (:func:`~recurnmt.modules.builders.build_block`).

    Attributes:
        num_heads: attention heads; must divide ``embed_dim``.
        ffn_dim: feed-forward inner width FF.
        activation: FFN non-linearity.
        bias: biases in the attention and FFN projections (Q, K, V, output, up, down); the
            RingFormer authors' translation code has none (``"bias": 0`` in its
            ``config.json``), which gives RingFormer Table 1's P* exactly.
        ffn_sharing: every block has its own FFN (``block``), all blocks of the stack share
            one FFN (``shared``, One Wide FFN, Pires et al. 2023) or blocks have no FFN
            (``none``, OWF's decoder).
        cross_attention: decoder blocks attend to an encoder memory.
        causal: causal self-attention (decoders): a position attends to itself and earlier
            positions only.
    """

    num_heads: int = option(8)
    ffn_dim: int = option(2048)
    activation: str = option("relu", choices=ACTIVATIONS)
    bias: bool = option(
        True,
        "biases in the attention (Q, K, V, output) and FFN projections of both stacks: on as "
        "fairseq's transformer, off as RingFormer's code (its P* in Table 1); the ringformer "
        "architectures default to off",
        flag="--block-bias",
        words=ON_OFF,
    )
    ffn_sharing: str = option(
        "block",
        "{side} FFNs: one per block, one shared by all blocks (One Wide FFN), or none",
        flag="--{side}-ffn-sharing",
        choices=FFN_SHARING,
    )
    cross_attention: bool = option(False)
    causal: bool = option(False)

    def check(self, stack: StackConfig) -> None:
        _positive("ffn_dim", self.ffn_dim)
        _positive("num_heads", self.num_heads)
        if stack.embed_dim % self.num_heads:
            raise ConfigError(
                "num_heads",
                self.num_heads,
                "does not divide {embed_dim}",
                {"embed_dim": stack.embed_dim},
            )
        sig = stack.signal
        if self.ffn_sharing == "none" and sig.learned and sig.ffn != "none":
            raise ConfigError(
                "ffn_sharing",
                self.ffn_sharing,
                "removes the FFN, so it cannot carry the FFN level signal {signal.ffn} "
                "(set it to 'none')",
                {"signal.ffn": sig.ffn},
            )

    @property
    def num_sublayers(self) -> int:
        """Residual sub-layers of a block: self-attention, cross-attention?, FFN?."""
        return 1 + int(self.cross_attention) + int(self.ffn_sharing != "none")


@dataclass(frozen=True)
class NormConfig(Part):
    """Layer norms (:func:`~recurnmt.modules.builders.build_norms`).

    Attributes:
        per_level: every level owns its layer norms (RingFormer sec. 3.2) instead of the
            block owning them.
        normalize_before: pre-LN (True) or post-LN (False) residual blocks.
        final: a layer norm after the last level; None means "when pre-LN".
        eps: epsilon of every layer norm (1e-5 as in fairseq; timm/SReT use 1e-6).
    """

    per_level: bool = option(
        False,
        "every level owns its layer norms (RingFormer) or every block does",
        name="norms_per_level",
        flag="--layer-norms",
        words={"per-level": True, "per-block": False},
    )
    normalize_before: bool = option(False)
    final: bool | None = option(None, name="final_norm")
    eps: float = option(1e-5, name="norm_eps")

    def check(self, stack: StackConfig) -> None:
        if self.eps <= 0:
            raise ConfigError("norm_eps", self.eps, "must be positive")

    @property
    def has_final(self) -> bool:
        return self.normalize_before if self.final is None else self.final


@dataclass(frozen=True)
class RegularizationConfig(Part):
    """Dropout and stochastic depth (the block's and every level's rate).

    Attributes:
        dropout: residual and embedding dropout.
        attention_dropout: dropout on attention probabilities.
        activation_dropout: dropout after the FFN non-linearity.
        drop_path: stochastic depth (Huang et al. 2016, as in DeiT/SReT): the rate of dropping
            a residual branch per sample grows linearly from 0 at the first level to this
            value at the last (timm's ``linspace(0, drop_path, N)``).
        level_drop_path: explicit per-level stochastic depth rates (length N), for schedules
            that span several stacks (SReT's stages); overrides ``drop_path``.
    """

    dropout: float = option(0.1, keyword="drop_rate")
    attention_dropout: float = option(0.0, keyword="attn_drop_rate")
    activation_dropout: float = option(0.0)
    drop_path: float = option(0.0, keyword="drop_path_rate")
    level_drop_path: tuple[float, ...] = option(())

    def check(self, stack: StackConfig) -> None:
        num_levels = stack.depth.num_levels
        if self.level_drop_path and len(self.level_drop_path) != num_levels:
            raise ConfigError(
                "level_drop_path",
                self.level_drop_path,
                f"{len(self.level_drop_path)} rates for {{num_levels}} levels",
                {"num_levels": num_levels},
            )
        if any(not 0.0 <= r < 1.0 for r in self.level_drop_path):
            raise ConfigError("level_drop_path", self.level_drop_path, "must lie in [0, 1)")
        for name in ("dropout", "attention_dropout", "activation_dropout", "drop_path"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ConfigError(name, value, "must lie in [0, 1)")

    def drop_path_rate(self, level: int, num_levels: int) -> float:
        """Stochastic depth rate at ``level``: ``level_drop_path`` if given, else linear from
        0 at the first level to ``drop_path`` at the last (DeiT / timm rule)."""
        if self.level_drop_path:
            return self.level_drop_path[level]
        if num_levels == 1:
            return 0.0
        return self.drop_path * level / (num_levels - 1)


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
        flag="--level-signal",
        choices=SIGNAL_KINDS,
    )
    rank: int | None = option(
        None,
        "rank of the low-rank level signals (default: embed dim // 16)",
        name="signal.rank",
        flag="--level-signal-rank",
        type=int,
        metavar="R",
    )
    attn: str = option(
        "after",
        "attention level signals after the Q/K/V projections (RingFormer eq. 6), before them, "
        "or none",
        name="signal.attn",
        flag="--attn-signal",
        choices=ATTN_SIGNAL_PLACES,
    )
    ffn: str = option(
        "input",
        "FFN level signal on the FFN input (RingFormer eq. 7), on the intermediate activation "
        "(inter), or none",
        name="signal.ffn",
        flag="--ffn-signal",
        choices=FFN_SIGNAL_PLACES,
    )
    down_init: str = option(
        "normal",
        "how the low-rank signals' down factors start (their up factors start at zero): "
        "normal, N(0, S^2) with S = --level-signal-down-std, as RingFormer's code (the "
        "default), or kaiming, LoRA's code (Kaiming-uniform)",
        name="signal.down_init",
        flag="--level-signal-down-init",
        choices=SIGNAL_DOWN_INITS,
    )
    down_std: float = option(
        1e-6,
        "standard deviation of --level-signal-down-init normal (RingFormer's code: 1e-6)",
        name="signal.down_std",
        flag="--level-signal-down-std",
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
        flag="--positions",
        words={"input": False, "every-level": True},
    )
    scale: float = option(
        1.0,
        "scale of the coordinate embedding added at every level (level embedding, and "
        "positions with --positions every-level); 1 is the UT paper's full sinusoid",
        name="coordinate_scale",
        flag="--coordinate-scale",
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
        flag="--lrc",
        choices=LRC_MODES,
    )
    nll_ratio: float = option(
        0.0,
        "SReT non-linear projection layer after every level with hidden ratio R (SReT eq. 5); "
        "0 = none",
        flag="--nll-ratio",
        type=float,
        metavar="R",
    )

    def check(self, stack: StackConfig) -> None:
        if self.nll_ratio < 0:
            raise ConfigError("nll_ratio", self.nll_ratio, "must be >= 0")


def int_list(text: str) -> tuple[int, ...]:
    """A flag's comma-separated integers (``2,1``) as a tuple."""
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
        flag="--encoder-attn-groups",
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
    """

    act: bool = option(
        False,
        "Adaptive Computation Time halting over the levels (Universal Transformer sec. 2.2); "
        "its ponder cost is a term of the training loss",
        flag="--act",
        words=ON_OFF,
    )
    threshold: float = option(
        0.99,
        "ACT halting threshold 1 - eps",
        name="act_threshold",
        flag="--act-threshold",
        type=float,
    )
    bias_init: float = option(
        1.0, "initial halting unit bias", name="act_bias_init", flag="--act-bias-init", type=float
    )

    def check(self, stack: StackConfig) -> None:
        if not 0.0 < self.threshold <= 1.0:
            raise ConfigError("act_threshold", self.threshold, "must lie in (0, 1]")


def rank_or_full(text: Any, options: Mapping[str, Any]) -> int:
    """``--level-lora-rank``: a rank >= 0, or ``full`` (the width, the full rank of every
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
        flag="--level-lora-rank",
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


@dataclass(frozen=True)
class StackConfig:
    """A stack of ``depth.num_levels`` levels executing ``depth.num_unique`` unique blocks.

    Make one from option names (:meth:`from_options`, :meth:`replace`:
    ``cfg.replace(num_levels=8, lrc="both")``) or from parts
    (``StackConfig(embed_dim=64, depth=DepthConfig(num_levels=4))``).

    Attributes:
        embed_dim: model width H.
        depth: the depth plan.
        block: the blocks' sub-modules.
        norms: the layer norms.
        regularization: dropout and stochastic depth.
        signal: RingFormer's level signals.
        coordinates: what the Universal Transformer adds at every level.
        residual: SReT's learnable residual coefficients and NLLs.
        slicing: SReT's sliced group attention.
        halting: ACT halting.
        lora: relaxed recursion's per-level LoRA.
    """

    embed_dim: int = option(512)
    depth: DepthConfig = part(DepthConfig)
    block: BlockConfig = part(BlockConfig)
    norms: NormConfig = part(NormConfig)
    regularization: RegularizationConfig = part(RegularizationConfig)
    signal: SignalConfig = part(SignalConfig)
    coordinates: CoordinateConfig = part(CoordinateConfig)
    residual: ResidualConfig = part(ResidualConfig)
    slicing: SlicingConfig = part(SlicingConfig)
    halting: HaltingConfig = part(HaltingConfig)
    lora: LoRAConfig = part(LoRAConfig)

    def __post_init__(self) -> None:
        _positive("embed_dim", self.embed_dim)
        for f in dataclasses.fields(self):
            if f.name in option_fields(type(self)):
                continue  # an option of the stack itself (the width)
            value = getattr(self, f.name)
            if not isinstance(value, f.default_factory):
                raise TypeError(f"{f.name} must be a {f.default_factory.__name__}")
            value.validate(self)

    @classmethod
    def from_options(cls, **options: Any) -> StackConfig:
        """The defaults with ``options`` (option names, or whole parts by field name)."""
        return cls().replace(**options)

    def replace(self, **changes: Any) -> StackConfig:
        """A copy with ``changes``: options by name (``num_levels=8``,
        ``**{"signal.rank": 4}``), or whole parts by field name (``signal=SignalConfig()``).

        Raises:
            TypeError: a name that is neither.
            ConfigError: an impossible result, naming the option.
        """
        index = option_fields(type(self))
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        by_part: dict[str, dict[str, Any]] = {}
        for name, value in changes.items():
            if name not in index and isinstance(values.get(name), Part):
                values[name] = value  # a whole part
        for name, value in changes.items():
            if name in index:
                where = index[name]
                if where.part is None:
                    values[where.field] = value
                else:
                    by_part.setdefault(where.part, {})[where.field] = value
            elif not isinstance(values.get(name), Part):
                raise TypeError(f"{name!r} is no stack option")
        for name, fields_ in by_part.items():
            values[name] = dataclasses.replace(values[name], **fields_)
        return type(self)(**values)

    def options(self) -> dict[str, Any]:
        """``{option name: value}`` of every option."""
        return {
            name: getattr(self if w.part is None else getattr(self, w.part), w.field)
            for name, w in option_fields(type(self)).items()
        }

    def to_dict(self) -> dict[str, Any]:
        """The options as a JSON-able dictionary: option names, ``a.b`` written as
        ``{"a": {"b": ...}}`` (tuples become lists when written)."""
        out: dict[str, Any] = {}
        for name, value in self.options().items():
            head, dot, tail = name.partition(".")
            if dot:
                out.setdefault(head, {})[tail] = value
            else:
                out[name] = value
        return out

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> StackConfig:
        """The configuration of :meth:`to_dict`'s output (also the flat dictionaries of
        exports made before the options were grouped: the same names)."""
        flat: dict[str, Any] = {}
        for name, value in values.items():
            if isinstance(value, Mapping):
                flat |= {f"{name}.{k}": v for k, v in value.items()}
            else:
                flat[name] = value
        return cls.from_options(**flat)

    def drop_path_rate(self, level: int) -> float:
        """Stochastic depth rate at ``level`` (see :class:`RegularizationConfig`)."""
        return self.regularization.drop_path_rate(level, self.depth.num_levels)

    @property
    def signal_rank(self) -> int:
        """The effective low-rank signal rank (RingFormer sec. 4.1: H / 16 by default)."""
        return self.signal.rank if self.signal.rank is not None else self.embed_dim // 16


def option_declarations() -> dict[str, OptionField]:
    """``{option name: where it lives}`` of every :class:`StackConfig` option, in declaration
    order (the width first)."""
    return option_fields(StackConfig)


def _positive(name: str, value: int) -> None:
    if not isinstance(value, int) or value <= 0:
        raise ConfigError(name, value, "must be a positive integer")
