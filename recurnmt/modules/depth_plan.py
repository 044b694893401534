"""Depth plans: which unique block each level executes.

Every architecture in recurnmt is "N levels, each running one of M unique blocks, plus small
per-level parts". A :class:`DepthPlan` is that mapping made explicit, so a sharing scheme is a
few lines and can be tested by itself.

Sharing orders follow Takase & Kiyono (2021), "Lessons on parameter sharing across layers in
Transformers", sec. 2 (their "unique layers" are our blocks): with M blocks over N levels,

* ``sequence``: consecutive levels share a block, level i uses block floor(i * M / N);
* ``cycle``: levels visit the blocks in turn, level i uses block i mod M;
* ``cycle_rev``: like ``cycle``, except the last M levels visit the blocks in reverse order.

M = 1 is the fully recurrent case (Universal Transformer, RingFormer), M = N the vanilla stack.

The plan also holds the arithmetic of running a trained stack at another depth (elastic depth,
:meth:`DepthPlan.depth_levels`) and of SReT's shallow branch (:meth:`DepthPlan.first_loop_levels`).
"""

from __future__ import annotations

from dataclasses import dataclass

from recurnmt.modules.config import SHARING_SCHEMES
from recurnmt.modules.errors import ConfigError


@dataclass(frozen=True)
class DepthPlan:
    """The unique block index executed at each level.

    Attributes:
        block_of_level: ``block_of_level[i]`` is the unique block run at level ``i``.
    """

    block_of_level: tuple[int, ...]

    @classmethod
    def build(
        cls, num_levels: int, num_unique: int | None = None, scheme: str = "cycle"
    ) -> DepthPlan:
        """Builds the plan for ``num_unique`` blocks over ``num_levels`` levels.

        Raises:
            ConfigError: a count is not positive, ``num_unique > num_levels`` or the scheme is
                unknown.
        """
        m = num_levels if num_unique is None else num_unique
        if num_levels <= 0:
            raise ConfigError("num_levels", num_levels, "must be positive")
        if m <= 0 or m > num_levels:
            raise ConfigError(
                "num_unique", m, "must lie between 1 and {num_levels}", {"num_levels": num_levels}
            )
        if scheme == "sequence":
            order = [i * m // num_levels for i in range(num_levels)]
        elif scheme == "cycle":
            order = [i % m for i in range(num_levels)]
        elif scheme == "cycle_rev":
            head = num_levels - m
            order = [i % m for i in range(head)] + list(range(m - 1, -1, -1))
        else:
            raise ConfigError(
                "scheme",
                scheme,
                f"unknown sharing scheme; choose one of {', '.join(SHARING_SCHEMES)}",
            )
        return cls(tuple(order))

    @property
    def num_levels(self) -> int:
        return len(self.block_of_level)

    @property
    def num_unique(self) -> int:
        return max(self.block_of_level) + 1

    @property
    def num_loops(self) -> int:
        """The largest number of levels that run one block (R for an SReT internal loop)."""
        return max(self.block_of_level.count(b) for b in range(self.num_unique))

    def loop_of_level(self, level: int) -> int:
        """How many times the block of ``level`` ran before it (0 at its first level)."""
        return self.block_of_level[:level].count(self.block_of_level[level])

    def first_loop_levels(self) -> list[int]:
        """The levels at which each block runs for the first time (SReT's shallow branch)."""
        return [i for i in range(self.num_levels) if self.loop_of_level(i) == 0]

    def levels_of_block(self, block: int) -> list[int]:
        """The levels that execute ``block``."""
        return [i for i, b in enumerate(self.block_of_level) if b == block]

    def depth_levels(self, depth: int, extendable: bool = False) -> list[int]:
        """The levels to run for ``depth`` levels of a trained stack (elastic depth).

        * A fully shared stack (one block) runs its first ``depth`` levels. Beyond the levels
          it was built with, a level's parts must be definable from the formulas alone
          (``extendable``): parts without parameters (the Universal Transformer's sinusoidal
          level embedding, UT sec. 2.1, is defined for every step) can be made for new levels;
          learned per-level parts (RingFormer's level signals and norms, SReT's NLLs) cannot.
        * A stack whose M blocks each run R times in a row (SReT's internal loop) runs every
          block R' <= R times: ``depth = M * R'`` (R' = 1 is SReT's shallow branch).
        * Other stacks (vanilla, One Wide FFN, cycle sharing) have no other depth.

        Args:
            depth: the levels to run.
            extendable: the stack can make parameter-free parts for levels beyond its own.

        Raises:
            ConfigError: naming ``levels`` and why that depth is not defined.
        """
        n, m = self.num_levels, self.num_unique
        if not isinstance(depth, int) or depth <= 0:
            raise ConfigError("levels", depth, "must be a positive integer")
        if depth == n:
            return list(range(n))
        if m == 1:
            if depth < n or extendable:
                return list(range(depth))
            raise ConfigError(
                "levels",
                depth,
                f"this stack's per-level parts are learned (level signals or norms) and exist "
                f"for its {n} levels only; choose levels <= {n}",
            )
        if m == n:
            raise ConfigError(
                "levels", depth, f"a stack of {n} unshared blocks runs at its own depth only"
            )
        loops = self.num_loops
        by_block = [self.levels_of_block(b) for b in range(m)]
        in_a_row = all(lv == list(range(lv[0], lv[0] + loops)) for lv in by_block)
        if not (in_a_row and all(len(lv) == loops for lv in by_block)):
            raise ConfigError(
                "levels",
                depth,
                f"a stack of {m} unique blocks over {n} levels in this order runs at its own "
                "depth only (elastic depth needs one shared block, or blocks looped in a row)",
            )
        if depth % m or depth // m > loops:
            raise ConfigError(
                "levels",
                depth,
                f"{m} blocks each looped R times in a row run {m} * R levels, R <= {loops}: "
                f"choose one of {[m * r for r in range(1, loops + 1)]}",
            )
        return sorted(lv for levels in by_block for lv in levels[: depth // m])
