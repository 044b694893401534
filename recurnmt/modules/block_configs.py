"""The parts every stack has: its depth plan, its block, its norms and its regularisation.

Each part config is a group of options that one builder reads (:mod:`recurnmt.modules.builders`),
every option declared once as a field (:func:`~recurnmt.modules.declarations.option`: default,
valid values, its help). The per-level parts of the papers are in
:mod:`recurnmt.modules.level_configs`; :class:`~recurnmt.modules.config.StackConfig` holds them
all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from recurnmt.modules.declarations import Part, option
from recurnmt.modules.errors import ConfigError

if TYPE_CHECKING:
    from recurnmt.modules.config import StackConfig

SHARING_SCHEMES = ("sequence", "cycle", "cycle_rev")
ACTIVATIONS = ("relu", "gelu")
FFN_SHARING = ("block", "shared", "none")
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
        "M, the {side} blocks with weights of their own, run over its N levels ({num_levels}): "
        "1 is fully recurrent, N vanilla",
        type=int,
        metavar="M",
        keyword="unique_layers",
    )
    sharing: str = option(
        "cycle",
        "order in which levels visit the unique blocks (Takase & Kiyono 2021)",
        choices=SHARING_SCHEMES,
    )

    def check(self, stack: StackConfig) -> None:
        positive("num_levels", self.num_levels)
        if self.num_unique is not None:
            positive("num_unique", self.num_unique)
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
        words=ON_OFF,
    )
    ffn_sharing: str = option(
        "block",
        "{side} FFNs: one per block, one shared by all blocks (One Wide FFN), or none",
        choices=FFN_SHARING,
    )
    cross_attention: bool = option(False)
    causal: bool = option(False)

    def check(self, stack: StackConfig) -> None:
        positive("ffn_dim", self.ffn_dim)
        positive("num_heads", self.num_heads)
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


def positive(name: str, value: int) -> None:
    """Refuses ``value`` of option ``name`` unless it is a positive integer."""
    if not isinstance(value, int) or value <= 0:
        raise ConfigError(name, value, "must be a positive integer")
