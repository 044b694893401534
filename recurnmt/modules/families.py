"""What makes each architecture family, once, in the block library's words.

A family is the option values (:mod:`recurnmt.modules.declarations`) that turn a plain stack into
the paper's: one shared block with per-level norms and signals (RingFormer), sinusoidal
coordinates at every level (Universal Transformer), one FFN for all blocks (One Wide FFN), ...
Sizes (widths, depth) are not the family's: the front ends choose them. Every front end applies
the same entries: the translation architectures (:mod:`recurnmt.nmt.defaults` turns them into
flag defaults, registered at every size; the exported ``transformers`` models hold the
resulting stacks), and the image models (:mod:`recurnmt.vision.models.vit`, the SReT stages).
A front end's own settings around the stacks (a tied output projection, a criterion, a
position table) stay with that front end.

Adding a family: an entry here (``tests/test_families.py`` checks that every name is an
option); the translation architectures, the decoding tests, the results tables and the
comparison and benchmark scripts pick it up (its title, its place in :data:`FAMILIES`' order,
its loop count from its options).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from recurnmt.modules.config import StackConfig, option_declarations


@dataclass(frozen=True)
class Family:
    """An architecture family: option changes on each of its stacks.

    Attributes:
        options: ``{option name: value}`` on every stack of the family.
        decoder: further changes on a stack with cross-attention (a decoder), where the
            family's decoder differs.
        title: the family's name in tables and plots.

    Raises:
        ValueError: a name that is no stack option.
    """

    options: Mapping[str, Any] = field(default_factory=dict)
    decoder: Mapping[str, Any] = field(default_factory=dict)
    title: str = ""

    def __post_init__(self) -> None:
        unknown = (set(self.options) | set(self.decoder)) - set(option_declarations())
        if unknown:
            raise ValueError(f"{sorted(unknown)} are no stack options")

    def changes(self, cross_attention: bool = False) -> dict[str, Any]:
        """The option values of a stack of the family (a decoder's with ``cross_attention``)."""
        return {**self.options, **(self.decoder if cross_attention else {})}

    def apply(self, cfg: StackConfig) -> StackConfig:
        """``cfg`` made a stack of the family."""
        return cfg.replace(**self.changes(cfg.block.cross_attention))

    @property
    def loops(self) -> int | None:
        """How many times the family runs each block, where it fixes that (SReT's internal
        loop: its levels over its blocks), else None (the blocks follow the levels)."""
        levels, blocks = self.options.get("num_levels"), self.options.get("num_unique")
        return levels // blocks if levels and blocks else None

    def blocks(self, levels: int) -> int | None:
        """The unique blocks of a stack of ``levels`` levels of the family (at least one),
        where it fixes its loop count; None where the blocks are the family's own or the
        front end's (one shared block, one per level)."""
        return None if self.loops is None else max(1, levels // self.loops)


_UNIVERSAL_TRANSFORMER = {
    "num_unique": 1,
    "norms_per_level": False,
    "signal.kind": "static",
    "positions_every_level": True,
    "activation": "gelu",
}

# in the order of the tables and benchmarks (after fairseq's transformer, where one is compared)
FAMILIES: dict[str, Family] = {
    # a plain Transformer built from recurnmt's blocks (one block per level)
    "recurrent_transformer": Family(title="Transformer (recurnmt's blocks)"),
    # RingFormer (sec. 3): one shared block per side, per-level norms, low-rank level signals
    # on Q/K/V (after projection) and on the FFN input, rank H/16, GELU; no biases in the
    # attention and FFN projections, as the authors' translation code ("bias": 0 in its
    # config.json), which gives Table 1's P* exactly (8,943,616 and 35,713,024)
    "ringformer": Family(
        {
            "num_unique": 1,
            "norms_per_level": True,
            "signal.kind": "lowrank",
            "signal.attn": "after",
            "signal.ffn": "input",
            "activation": "gelu",
            "bias": False,
        },
        title="RingFormer",
    ),
    # Universal Transformer (Dehghani et al. 2019) as compared in RingFormer Table 1: one
    # shared block per side, sinusoidal level + position embeddings at every level, GELU
    "universal_transformer": Family(_UNIVERSAL_TRANSFORMER, title="Universal Transformer"),
    # ... with Adaptive Computation Time halting (UT sec. 2.2); the levels are the maximum
    # number of steps
    "universal_transformer_act": Family(
        _UNIVERSAL_TRANSFORMER | {"act": True}, title="Universal Transformer + ACT"
    ),
    # One Wide FFN (Pires et al. 2023, as in RingFormer Table 1): attention per layer, one FFN
    # shared by all encoder layers, no decoder FFN, GELU
    "owf": Family(
        {"ffn_sharing": "shared", "signal.kind": "none", "activation": "gelu"},
        decoder={"ffn_sharing": "none"},
        title="One Wide FFN",
    ),
    # SReT for translation (sec. 3, Table 9 setting): each of the six blocks per side looped
    # twice in a row (internal loop, eq. 6: 12 levels), a non-shared NLL after every loop
    # (eq. 5, ratio 1), learnable residual coefficients on every residual (eq. 9-10)
    "sret": Family(
        {
            "num_unique": 6,
            "num_levels": 12,
            "sharing": "sequence",
            "nll_ratio": 1.0,
            "lrc": "both",
        },
        title="SReT",
    ),
    # Relaxed Recursive Transformers (Bae et al. 2025): M unique blocks looped over the levels
    # in a cycle (eq. 2: level l runs block l mod M; half the levels, two loops, as their
    # "recursive Gemma 1B" from Gemma 2B), and every level a rank-16 LoRA plus bias deltas on
    # every linear of its block (eq. 3, recurnmt.modules.level_lora); per-level layer norms,
    # so that a converted model starts exactly as its source at full rank (recurnmt-convert,
    # docs/relaxed.md); otherwise fairseq's transformer (ReLU, biases)
    "relaxed_transformer": Family(
        {"num_unique": 3, "sharing": "cycle", "norms_per_level": True, "lora_rank": 16},
        title="Relaxed Recursive Transformer",
    ),
}
