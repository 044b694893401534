"""The one level loop of recurnmt: N levels executing M shared blocks by a depth plan.

A :class:`RecurrentStack` receives everything built (torchtune style): its M unique blocks,
its N :class:`~recurnmt.modules.level_parts.LevelParts` and the
:class:`~recurnmt.modules.depth_plan.DepthPlan`, the only source of level -> block truth;
optionally a halting unit (ACT) and a final norm. Level i runs ``blocks[plan[i]]`` with
``levels[i]``, in one level step that every loop uses. The builders make all of them from a
:class:`~recurnmt.modules.config.StackConfig`; the architectures differ only there.

Extensions of one call (UT positions, MRLA, DVT's reuse, alignment weights, recording level
outputs) are :class:`~recurnmt.modules.hooks.LevelHook` objects passed to
:meth:`RecurrentStack.forward`; they never widen its signature. Modes are set once, not per
call (:class:`~recurnmt.modules.run_modes.RunModes`: the depth it runs, SReT's shallow branch,
its memory policy, compilation). A
decoder's memory is projected once per unique block (:mod:`recurnmt.modules.memory`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

import torch
from torch import Tensor, nn

from recurnmt.modules.act_rule import run_paper_rule
from recurnmt.modules.attention import MemoryKV
from recurnmt.modules.checkpointing import checkpointed_block, checkpointed_segment, segment_length
from recurnmt.modules.compile import compiled
from recurnmt.modules.decoding.cache import StackCache
from recurnmt.modules.decoding.exits import run_levels
from recurnmt.modules.decoding.session import DecodingSession
from recurnmt.modules.depth_plan import DepthPlan
from recurnmt.modules.halting import HaltingAccumulator, HaltingUnit
from recurnmt.modules.hooks import LevelHook
from recurnmt.modules.level_parts import LevelParts
from recurnmt.modules.memory import Memory, level_memory
from recurnmt.modules.run_modes import RunModes
from recurnmt.modules.untie import untie


@dataclass
class StackOutput:
    """One pass's ``output`` (B x T x C, final norm applied), ACT's ``ponder`` cost N + R per
    position (B x T; None without ACT or with a cache), and the ``hidden`` state before the final
    norm: the next level's input (:mod:`recurnmt.modules.decoding.speculative`)."""

    output: Tensor
    ponder: Tensor | None = None
    hidden: Tensor | None = None


class RecurrentStack(RunModes, nn.Module):
    """N levels over M unique blocks.

    Args:
        blocks: the M unique blocks (each follows the level protocol of
            :mod:`recurnmt.modules.block`).
        levels: the N levels' own parts; ``levels[i].index == i``.
        plan: which block each level runs.
        halting: Adaptive Computation Time over the levels (Universal Transformer sec. 2.2).
        final_norm: applied to the output (pre-LN stacks).

    Raises:
        ValueError: the blocks or levels do not match the plan.
    """

    def __init__(
        self,
        blocks: Sequence[nn.Module],
        levels: Sequence[LevelParts],
        plan: DepthPlan,
        *,
        halting: HaltingUnit | None = None,
        final_norm: nn.Module | None = None,
    ) -> None:
        super().__init__()
        if len(blocks) != plan.num_unique:
            raise ValueError(f"{len(blocks)} blocks for a plan of {plan.num_unique} unique blocks")
        if len(levels) != plan.num_levels:
            raise ValueError(f"{len(levels)} level parts for a plan of {plan.num_levels} levels")
        if any(parts.index != i for i, parts in enumerate(levels)):
            raise ValueError("levels[i] must be the parts of level i")
        self.plan = plan
        self.blocks = nn.ModuleList(blocks)
        self.levels = nn.ModuleList(levels)
        self.halting = halting
        self.final_norm = final_norm
        self.reset_modes()

    @property
    def num_levels(self) -> int:
        return self.plan.num_levels

    @property
    def skips_halted(self) -> bool:
        """ACT's paper rule: halted positions leave the level loop (:mod:`recurnmt.modules.
        act_rule`), so a level's hooks see the running positions only."""
        return self.halting is not None and self.halting.rule == "paper"

    def block_of_level(self, level: int) -> nn.Module:
        """The block object executed at ``level``."""
        return self.blocks[self.plan.block_of_level[level]]

    def forward(
        self,
        x: Tensor,
        *,
        padding_mask: Tensor | None = None,
        memory: Memory | None = None,
        cache: StackCache | None = None,
        levels: Sequence[int] | None = None,
        hooks: Sequence[LevelHook] = (),
    ) -> StackOutput:
        """Runs the levels on x (B x T x C): ``levels`` in this order (default:
        :attr:`active_levels`), ``padding_mask`` (B x T) True at padding, the encoder
        ``memory`` (decoders), a ``cache`` of incremental decoding (``x`` then holds the new
        positions only) and the call's ``hooks``, asked in list order at every level.
        Returns the output and, with ACT, the ponder cost."""
        run = RecurrentStack._run_all
        if self.compile_settings is not None and cache is None:
            run = compiled(run, self.compile_settings)
        kwargs = dict(padding_mask=padding_mask, memory=memory, cache=cache, hooks=hooks)
        return run(self, x, levels=levels, **kwargs)

    def _run_all(
        self,
        x: Tensor,
        *,
        padding_mask: Tensor | None,
        memory: Memory | None,
        cache: StackCache | None,
        levels: Sequence[int] | None,
        hooks: Sequence[LevelHook],
    ) -> StackOutput:
        """The pass of :meth:`forward`, which may compile it."""
        kv = level_memory(self.blocks, self.levels, self.plan, memory, cache) if memory else {}
        order = self.active_levels if levels is None else levels
        act = self.halting  # with a cache (incremental decoding) no ponder cost is asked
        halting = HaltingAccumulator(x, act.threshold, ponder=cache is None) if act else None
        session = None if cache is None else DecodingSession.of(self, cache)
        # a cache needs every level's keys/values; compiled, all run (no test, no graph break)
        stops = cache is None and not torch.compiler.is_compiling()
        may_stop = stops and not any(hook.needs_all_levels for hook in hooks)
        if self.skips_halted:  # ACT's paper rule (modules/act_rule.py)
            args = (self, x, order, kv, padding_mask, cache, hooks, session, may_stop)
            x, ponder = run_paper_rule(*args)
            return StackOutput(x if self.final_norm is None else self.final_norm(x), ponder, x)
        segment = 0 if cache is not None else self._segment_length(x, len(order), hooks)
        if segment:
            level = partial(self._level, padding_mask=padding_mask, cache=None, hooks=hooks)
            order = list(order)
            for start in range(0, len(order), segment):
                x = checkpointed_segment(level, x, order[start : start + segment], kv)
            order = ()
        if cache is not None and self.exits is not None and not torch.is_grad_enabled():
            x = run_levels(self, x, order, kv, cache, hooks, session, self.exits)
            order = ()  # the step ran with exits (modules/decoding/exits.py)
        for step, i in enumerate(order):
            last = halting is not None and step == len(order) - 1  # ACT: the last level takes R
            x = self._level(i, x, kv, padding_mask, cache, hooks, halting, last, session)
            if halting is not None and may_stop and halting.all_halted():
                break
        ponder = None
        if halting is not None:
            x, ponder = halting.output, halting.ponder_cost if halting.ponder else None
        out = x if self.final_norm is None else self.final_norm(x)
        return StackOutput(out, ponder, hidden=x)

    def _level(
        self,
        i: int,
        x: Tensor,
        kv: dict[int, MemoryKV],
        padding_mask: Tensor | None,
        cache: StackCache | None,
        hooks: Sequence[LevelHook],
        halting: HaltingAccumulator | None = None,
        last: bool = False,
        session: DecodingSession | None = None,
    ) -> Tensor:
        """Level ``i`` (or a decoding ``session``'s): its input (level embedding, hooks), ACT's
        weights, its block (under a checkpoint in training when asked), the output hooks."""
        parts = self.levels[i] if session is None else session.levels[i]
        x = parts.enter(x)
        for hook in hooks:
            x = hook.before_level(i, x)
        if halting is not None:
            weights = halting.weights(self.halting(x, session and session.halting), last=last)
        block = self.blocks[self.plan.block_of_level[i]]
        level_cache = None if cache is None else cache.level(i)
        kwargs = dict(padding_mask=padding_mask, memory=kv.get(i), cache=level_cache, hooks=hooks)
        if self.grad_checkpointing and self.training and torch.is_grad_enabled():
            x = checkpointed_block(block, x, parts, self.offload_activations, **kwargs)
        else:
            x = block(x, parts, **kwargs)
        for hook in hooks:
            x = hook.after_level(i, x)
        if halting is not None:
            halting.accumulate(x, weights)
        return x

    def _segment_length(self, x: Tensor, levels: int, hooks: Sequence[LevelHook]) -> int:
        """Levels per checkpoint segment of this pass (0: none; ACT carries state)."""
        if self.halting is not None:
            return 0
        return segment_length(self.checkpoint_segment, levels, x, self.training, hooks)

    def untied(self) -> RecurrentStack:
        """Every level its own copy of its block (:func:`~recurnmt.modules.untie.untie`)."""
        return untie(self)
