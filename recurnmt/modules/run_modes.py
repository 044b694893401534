"""What a stack is running as: modes set once, never arguments of ``forward``.

:class:`RunModes` is the part of :class:`~recurnmt.modules.stack.RecurrentStack` that says
how its next passes run, beside the level loop that runs them: another depth (``set_depth``;
the arithmetic is :class:`~recurnmt.modules.depth_plan.DepthPlan`'s, the parameter-free levels
beyond the built ones :meth:`~recurnmt.modules.level_parts.LevelParts.continued`), SReT's
shallow branch (``set_shallow``, SReT appendix B), activation checkpointing per level and per
segment (``set_grad_checkpointing``, :mod:`recurnmt.modules.checkpointing`) and
``torch.compile`` of the full passes (``set_compile``, :mod:`recurnmt.modules.compile`).
:attr:`RunModes.active_levels` is what they leave the loop to run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from recurnmt.modules.checkpointing import check_segment
from recurnmt.modules.compile import CompileSettings
from recurnmt.modules.depth_plan import DepthPlan
from recurnmt.modules.errors import ConfigError

if TYPE_CHECKING:
    from recurnmt.modules.decoding.exits import Exits


class RunModes:
    """The run modes of a stack (a mixin of :class:`~recurnmt.modules.stack.RecurrentStack`,
    which holds ``plan``, ``levels`` and ``num_levels``)."""

    def reset_modes(self) -> None:
        """Every mode off: all built levels, eagerly, nothing checkpointed."""
        self.grad_checkpointing = False
        self.offload_activations = False
        self.checkpoint_segment = 0  # levels per outer checkpoint segment (0: none)
        self.run_levels: list[int] | None = None  # elastic depth (set_depth)
        self.shallow_levels: list[int] | None = None  # SReT's shallow branch (set_shallow)
        self.compile_settings: CompileSettings | None = None  # torch.compile (set_compile)
        self.exits: Exits | None = None  # per-row exits while decoding (set_exits)

    def set_grad_checkpointing(
        self, enable: bool = True, offload: bool = False, segment: int | str = 0
    ) -> None:
        """Activation checkpointing per level (timm's name; fairseq's
        ``--checkpoint-activations``), ``offload``-ing the kept level inputs to CPU memory
        (fairseq's ``--offload-activations``), and per ``segment`` of k levels (or ``"sqrt"``:
        ceil(sqrt(N))) for O(sqrt N) memory; see :mod:`recurnmt.modules.checkpointing`."""
        check_segment(segment)
        self.grad_checkpointing = enable or offload
        self.offload_activations = offload
        self.checkpoint_segment = segment if self.grad_checkpointing else 0

    def set_compile(self, settings: CompileSettings | None) -> None:
        """Full passes through ``torch.compile`` from now on (None: eagerly), modules/compile.py."""
        self.compile_settings = settings

    def set_exits(self, exits: Exits | None) -> None:
        """Rows of a decoding step leave the level loop by ``exits``' test from now on (None:
        every row runs every level); :mod:`recurnmt.modules.decoding.exits`. Only incremental
        decoding in inference exits; a full pass runs every level."""
        if exits is not None and self.halting is not None:
            raise ConfigError(
                "exit_test", exits.test, "ACT's halting decides each position's depth itself "
                "({act}); its own halting rule skips the work", {"act": "on"},
            )  # fmt: skip
        if exits is not None and not 1 <= exits.min_level < len(self.active_levels):
            raise ConfigError(
                "min_exit_level", exits.min_level,
                f"rows exit after 1 to {len(self.active_levels) - 1} of the decoder's "
                f"{len(self.active_levels)} levels",
            )  # fmt: skip
        self.exits = exits

    def set_depth(self, depth: int | None) -> None:
        """Runs ``depth`` levels from now on (None: the built depth), as
        :meth:`DepthPlan.depth_levels` defines them; levels beyond the built ones get
        parameter-free parts (:meth:`LevelParts.continued`): the state dict is unchanged."""
        if depth is None:
            self.run_levels = None
            return
        levels = self.plan.depth_levels(depth, extendable=self.levels[-1].parameter_free)
        for i in range(self.num_levels, depth):  # only reached where definable
            self.levels.append(self.levels[-1].continued(i))
        if depth > self.plan.num_levels:
            self.plan = DepthPlan((0,) * depth)
        self.run_levels = levels

    def set_shallow(self, enable: bool = True) -> None:
        """Runs SReT's shallow branch from now on (each block once, SReT appendix B; False:
        the full depth again); :func:`~recurnmt.modules.mixed_depth.shallow_branch`."""
        self.shallow_levels = self.plan.first_loop_levels() if enable else None

    @property
    def active_levels(self) -> Sequence[int]:
        """The levels a pass runs now, in order (shallow branch, elastic depth or all)."""
        if self.shallow_levels is not None:
            return self.shallow_levels
        return range(self.num_levels) if self.run_levels is None else self.run_levels
