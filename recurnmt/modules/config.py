"""Configuration of a recurrent Transformer stack, validated when it is made.

A :class:`StackConfig` is the model width and a few part configs, each a group of options that
one builder reads (:mod:`recurnmt.modules.builders`): the depth plan (how many unique blocks
execute over how many levels, and in which order), the block, its norms, dropout, and the
per-level parts of the papers (RingFormer level signals, Universal Transformer coordinates
and halting, SReT residuals and slicing, relaxed recursion's LoRA). Every option is declared
once, as a field of its part (:func:`~recurnmt.modules.declarations.option`): default, valid values
and its help, under a neutral name that each front end spells (a translation flag, an image
model's keyword). Impossible settings raise :class:`ConfigError` naming
the option, before any weight exists.

The parts live in :mod:`recurnmt.modules.block_configs` (depth, block, norms, regularisation)
and :mod:`recurnmt.modules.level_configs` (the papers' per-level parts); this module holds the
stack that groups them and is where every part and its constants are imported from.

Adding an option: a field of its part (and a rule in the part's ``check`` if it needs one),
read by the part's builder. Adding a part: a :class:`~recurnmt.modules.declarations.Part` in one
of those modules, a field of :class:`StackConfig`, and its builder.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from recurnmt.modules.block_configs import (
    ACTIVATIONS,
    FFN_SHARING,
    ON_OFF,
    SHARING_SCHEMES,
    BlockConfig,
    DepthConfig,
    NormConfig,
    RegularizationConfig,
    positive,
)
from recurnmt.modules.declarations import OptionField, Part, option, option_fields, part
from recurnmt.modules.errors import ConfigError
from recurnmt.modules.level_configs import (
    ATTN_SIGNAL_PLACES,
    FFN_SIGNAL_PLACES,
    LRC_MODES,
    SIGNAL_DOWN_INITS,
    SIGNAL_KINDS,
    CoordinateConfig,
    HaltingConfig,
    LoRAConfig,
    ResidualConfig,
    SignalConfig,
    SlicingConfig,
    int_list,
    rank_or_full,
)

__all__ = [
    "ACTIVATIONS",
    "ATTN_SIGNAL_PLACES",
    "FFN_SHARING",
    "FFN_SIGNAL_PLACES",
    "LRC_MODES",
    "ON_OFF",
    "SHARING_SCHEMES",
    "SIGNAL_DOWN_INITS",
    "SIGNAL_KINDS",
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
    "int_list",
    "option_declarations",
    "rank_or_full",
]


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
        positive("embed_dim", self.embed_dim)
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
