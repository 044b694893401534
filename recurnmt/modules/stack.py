"""The one level loop of recurnmt: N levels executing M shared blocks by a depth plan.

A :class:`RecurrentStack` receives everything built (torchtune style): its M unique blocks,
its N :class:`~recurnmt.modules.level_parts.LevelParts` and the
:class:`~recurnmt.modules.depth_plan.DepthPlan`, the only source of level -> block truth;
optionally a halting unit (ACT) and a final norm. Level i runs ``blocks[plan[i]]`` with
``levels[i]``. :func:`~recurnmt.modules.builders.build_stack` makes all of them from a
:class:`~recurnmt.modules.config.StackConfig`, and the architectures differ only there:

=================  ======  ==========================================================
architecture       M       per-level parts / options
=================  ======  ==========================================================
vanilla            N       none (norms in each block)
Universal (UT)     1       sinusoidal level embedding (+ positions, a hook) at every
                           level, optional ACT halting
RingFormer         1       own layer norms, low-rank signals on Q/K/V and FFN input
One Wide FFN       N       attention per block, one FFN shared by all blocks
Takase & Kiyono    M < N   none; the plan orders the blocks
SReT (internal)    M, R    ``sequence`` plan over M * R levels, an NLL after every
                           level, LRC on every residual, sliced groups per loop
Relaxed recursion  M < N   any plan; a LoRA and bias deltas per level on every linear
                           of the block (Relaxed Recursive Transformers eq. 3)
=================  ======  ==========================================================

Extensions of one call (positions at every level, MRLA, DVT's reuse, alignment weights,
recording level outputs) are :class:`~recurnmt.modules.hooks.LevelHook` objects passed to
:meth:`RecurrentStack.forward`; they never widen its signature.

For decoders, the encoder memory is projected to keys and values once per unique block
(once per sentence for a fully shared decoder) and reused by every level that runs the block
(a relaxed level adds its own low-rank term to them, Relaxed Recursive Transformers eq. 3);
in incremental decoding those projections live in the
:class:`~recurnmt.modules.cache.StackCache` next to each level's self-attention keys and
values, so levels never mix their states.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from recurnmt.modules.attention import MemoryKV
from recurnmt.modules.cache import StackCache
from recurnmt.modules.compile import CompileSettings, compiled
from recurnmt.modules.config import ConfigError
from recurnmt.modules.depth_plan import DepthPlan
from recurnmt.modules.halting import HaltingAccumulator, HaltingUnit
from recurnmt.modules.hooks import LevelHook
from recurnmt.modules.level_embedding import sinusoidal_level_embedding
from recurnmt.modules.level_parts import LevelParts


class Memory(NamedTuple):
    """The encoder output a decoder stack attends to.

    Attributes:
        states: B x S x C.
        padding_mask: B x S, True at padding (None: no padding).
        group: decoder rows per memory row: the decoder's batch is ``group`` consecutive
            rows (the hypotheses of one sentence in beam search) for each memory row.
    """

    states: Tensor
    padding_mask: Tensor | None = None
    group: int = 1


@dataclass
class StackOutput:
    """What one pass of a stack returns.

    Attributes:
        output: B x T x C, after the final norm.
        ponder: ACT's N + R per position (B x T); None without halting.
    """

    output: Tensor
    ponder: Tensor | None = None


class RecurrentStack(nn.Module):
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
        self.grad_checkpointing = False
        self.offload_activations = False
        self.checkpoint_segment = 0  # levels per outer checkpoint segment (0: none)
        self.run_levels: list[int] | None = None  # elastic depth (set_depth)
        self.compile_settings: CompileSettings | None = None  # torch.compile (set_compile)

    def set_grad_checkpointing(
        self, enable: bool = True, offload: bool = False, segment: int | str = 0
    ) -> None:
        """Activation checkpointing per level (timm's name; fairseq's
        ``--checkpoint-activations``): in training, each level keeps only its input and
        recomputes its block in the backward pass, so activation memory holds one level's
        intermediates instead of every level's. ``offload`` also moves the kept level inputs
        to CPU memory (fairseq's ``--offload-activations``). Losses and gradients are those
        of the plain pass (the random state of dropout is replayed).

        Per-level inputs still grow linearly with depth. ``segment`` (k levels, or
        ``"sqrt"`` for k = ceil(sqrt(N))) nests a second checkpoint around every k levels
        (Chen et al. 2016, "Training deep nets with sublinear memory cost", sec. 4): the
        forward keeps only every k-th level input, and the backward pass of a segment
        recomputes its k level inputs, then each level as before. Memory holds about
        N / k + k level inputs and one level's intermediates (O(sqrt N) at k = sqrt N), for
        one more forward pass of every level. It applies where levels carry no state from one
        to the next besides x (no ACT halting; only hooks marked ``stateless``); elsewhere
        the stack checkpoints per level.
        """
        if segment != "sqrt" and not (isinstance(segment, int) and segment >= 0):
            raise ConfigError(
                "checkpoint_segment", segment, "must be a number of levels >= 0 or 'sqrt'"
            )
        self.grad_checkpointing = enable or offload
        self.offload_activations = offload
        self.checkpoint_segment = segment if self.grad_checkpointing else 0

    def _segment_length(self, x: Tensor, levels: int, hooks: Sequence[LevelHook]) -> int:
        """Levels per outer checkpoint segment of this call (0: per-level checkpoints only)."""
        k = self.checkpoint_segment
        if not k or not (self.training and torch.is_grad_enabled() and x.requires_grad):
            return 0
        if self.halting is not None or not all(hook.recomputable for hook in hooks):
            return 0
        if k == "sqrt":
            k = math.ceil(math.sqrt(levels))
        return k if 1 < k < levels else 0

    def set_compile(self, settings: CompileSettings | None) -> None:
        """Runs full passes through ``torch.compile`` from now on (None: eagerly again).

        Training and every pass over whole sequences are compiled, with all levels unrolled
        into one graph; incremental decoding (a pass with a cache) stays eager. Outputs and
        gradients are those of the eager pass up to float rounding; dropout draws other
        random numbers when the backend generates its kernels (``inductor``). See
        :mod:`recurnmt.modules.compile`.
        """
        self.compile_settings = settings

    @property
    def num_levels(self) -> int:
        return self.plan.num_levels

    def block_of_level(self, level: int) -> nn.Module:
        """The block object executed at ``level``."""
        return self.blocks[self.plan.block_of_level[level]]

    def depth_levels(self, depth: int) -> list[int]:
        """The levels to run for ``depth`` levels of a trained stack (elastic depth).

        * A fully shared stack (one block) runs its first ``depth`` levels. Beyond the levels
          it was built with, a level's parts must be definable from the formulas alone: parts
          without parameters (the Universal Transformer's sinusoidal level embedding, UT
          sec. 2.1, is defined for every step) are created by :meth:`set_depth`; learned
          per-level parts (RingFormer's level signals and norms, SReT's NLLs) are not.
        * A stack whose M blocks each run R times in a row (SReT's internal loop) runs every
          block R' <= R times: ``depth = M * R'`` (R' = 1 is SReT's shallow branch).
        * Other stacks (vanilla, One Wide FFN, cycle sharing) have no other depth.

        Raises:
            ConfigError: naming ``levels`` and why that depth is not defined.
        """
        n, m = self.num_levels, self.plan.num_unique
        if not isinstance(depth, int) or depth <= 0:
            raise ConfigError("levels", depth, "must be a positive integer")
        if depth == n:
            return list(range(n))
        if m == 1:
            if depth < n or not any(p.requires_grad for p in self.levels[-1].parameters()):
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
        loops = self.plan.num_loops
        by_block = [self.plan.levels_of_block(b) for b in range(m)]
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

    def set_depth(self, depth: int | None) -> None:
        """Runs ``depth`` levels from now on (None: the built depth); see :meth:`depth_levels`.

        Levels beyond the built ones get parameter-free parts (a fully shared stack whose
        parts hold no parameters), so the state dict is unchanged.
        """
        if depth is None:
            self.run_levels = None
            return
        levels = self.depth_levels(depth)
        for i in range(self.num_levels, depth):  # only reached where definable
            last = self.levels[-1]
            embedding = None
            if last.level_embedding is not None:
                # the same sinusoid at level i, scaled as the built ones are (coordinate_scale)
                c, n = last.level_embedding.numel(), len(self.levels)
                table = sinusoidal_level_embedding(i + 1, c).to(last.level_embedding)
                ref = table[n - 1]
                scale = (last.level_embedding @ ref) / (ref @ ref)
                embedding = scale * table[i]
            self.levels.append(LevelParts(i, level_embedding=embedding))
        if depth > self.plan.num_levels:
            self.plan = DepthPlan((0,) * depth)
        self.run_levels = levels

    def memory_kv(self, memory: Memory, cache: StackCache | None = None) -> dict[int, MemoryKV]:
        """Keys/values of the memory as every level reads them, ``{level: MemoryKV}``.

        The memory is projected once per unique block and shared by the levels that run the
        block; a relaxed level adds its own low-rank term to its block's keys and values
        (Relaxed Recursive Transformers eq. 3, :meth:`LevelParts.level_memory`). In
        incremental decoding they are computed at the first step and read back from
        ``cache`` afterwards.
        """
        by_block = {}
        for b in sorted(set(self.plan.block_of_level)):
            if cache is not None and b in cache.memory:
                by_block[b] = cache.memory[b]
                continue
            by_block[b] = self.blocks[b].project_memory(
                memory.states, memory.padding_mask, memory.group
            )
            if cache is not None:
                cache.memory[b] = by_block[b]
        kv = {}
        for i, b in enumerate(self.plan.block_of_level):
            parts = self.levels[i]
            if not parts.relaxes_memory:
                kv[i] = by_block[b]
            elif cache is not None and i in cache.level_memory:
                kv[i] = cache.level_memory[i]
            else:
                kv[i] = parts.level_memory(by_block[b], memory.states)
                if cache is not None:
                    cache.level_memory[i] = kv[i]
        return kv

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
        """Runs the levels.

        Args:
            x: B x T x C.
            padding_mask: B x T, True at padding.
            memory: the encoder output (decoders).
            cache: incremental decoding state (owned by the caller); ``x`` then holds only
                the new positions.
            levels: run only these levels, in this order (e.g. SReT's shallow branch
                ``plan.first_loop_levels()``); all levels by default.
            hooks: extensions of this call, asked in list order at every level.

        Returns:
            The output and, with ACT, the ponder cost.
        """
        run = RecurrentStack._run_all
        if self.compile_settings is not None and cache is None:
            run = compiled(run, self.compile_settings)
        return run(
            self,
            x,
            padding_mask=padding_mask,
            memory=memory,
            cache=cache,
            levels=levels,
            hooks=hooks,
        )

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
        kv = self.memory_kv(memory, cache) if memory is not None else {}
        if levels is None:
            levels = self.run_levels
        order = range(self.num_levels) if levels is None else levels
        halting = HaltingAccumulator(x, self.halting.threshold) if self.halting else None
        # with a cache every level must fill its keys/values for later steps
        may_stop = cache is None and not any(hook.needs_all_levels for hook in hooks)
        segment = 0 if cache is not None else self._segment_length(x, len(order), hooks)
        if segment:
            order = list(order)
            for start in range(0, len(order), segment):
                x = self._checkpoint_segment(
                    x, order[start : start + segment], padding_mask, kv, hooks
                )
            order = ()
        for step, i in enumerate(order):
            parts = self.levels[i]
            x = parts.enter(x)
            for hook in hooks:
                x = hook.before_level(i, x)
            if halting is not None:
                weights = halting.weights(self.halting(x), last=step == len(order) - 1)
            b = self.plan.block_of_level[i]
            x = self._run_block(
                self.blocks[b],
                x,
                parts,
                padding_mask=padding_mask,
                memory=kv.get(i),
                cache=None if cache is None else cache.level(i),
                hooks=hooks,
            )
            for hook in hooks:
                x = hook.after_level(i, x)
            if halting is not None:
                halting.accumulate(x, weights)
                if may_stop and halting.all_halted():
                    break
        ponder = None
        if halting is not None:
            x, ponder = halting.output, halting.ponder_cost
        if self.final_norm is not None:
            x = self.final_norm(x)
        return StackOutput(x, ponder)

    def _checkpoint_segment(
        self,
        x: Tensor,
        levels: Sequence[int],
        padding_mask: Tensor | None,
        kv: dict[int, MemoryKV],
        hooks: Sequence[LevelHook],
    ) -> Tensor:
        """Runs ``levels`` keeping only ``x`` for backward, which recomputes them level by
        level under their own checkpoints.

        The segment is a reentrant checkpoint: its forward runs without autograd, so the
        per-level checkpoints inside it keep nothing, and its backward pass reruns it with
        autograd, where they keep one input per level of this segment only (a non-reentrant
        segment would keep every inner level's input alive from the first forward). A
        reentrant checkpoint differentiates only into its tensor arguments, so the memory's
        keys and values are passed as arguments.
        """
        # each distinct tensor once (levels of one block share their block's keys/values)
        index: dict[int, int] = {}
        memory: list[Tensor] = []
        for i in levels:
            if i in kv:
                for t in (kv[i].k, kv[i].v):
                    if id(t) not in index:
                        index[id(t)] = len(memory)
                        memory.append(t)

        def run(x: Tensor, *inputs: Tensor) -> Tensor:
            kv_in = {
                i: kv[i]._replace(k=inputs[index[id(kv[i].k)]], v=inputs[index[id(kv[i].v)]])
                for i in levels
                if i in kv
            }
            return self._run_levels(x, levels, padding_mask, kv_in, hooks)

        return checkpoint(run, x, *memory, use_reentrant=True, preserve_rng_state=True)

    def _run_levels(
        self,
        x: Tensor,
        levels: Sequence[int],
        padding_mask: Tensor | None,
        kv: dict[int, MemoryKV],
        hooks: Sequence[LevelHook],
    ) -> Tensor:
        """One checkpoint segment: ``levels`` in order, each checkpointed on its own."""
        for i in levels:
            parts = self.levels[i]
            x = parts.enter(x)
            for hook in hooks:
                x = hook.before_level(i, x)
            b = self.plan.block_of_level[i]
            x = self._run_block(
                self.blocks[b], x, parts, padding_mask=padding_mask, memory=kv.get(i), hooks=hooks
            )
            for hook in hooks:
                x = hook.after_level(i, x)
        return x

    def _run_block(self, block: nn.Module, x: Tensor, parts: LevelParts, **kwargs) -> Tensor:
        if not (self.grad_checkpointing and self.training and torch.is_grad_enabled()):
            return block(x, parts, **kwargs)
        if kwargs.get("cache") is not None:
            raise ValueError("activation checkpointing is for training, not incremental decoding")
        if not self.offload_activations:
            return checkpoint(block, x, parts, use_reentrant=False, **kwargs)
        with torch.autograd.graph.save_on_cpu(pin_memory=x.is_cuda):
            return checkpoint(block, x, parts, use_reentrant=False, **kwargs)

    def untied(self) -> RecurrentStack:
        """A copy in which every level has its own block, holding the same weights.

        The copy computes the same function; it is the reference against which weight sharing
        is checked, and a starting point for fine-tuning without sharing. A module shared by
        several blocks (One Wide FFN) is copied into each.
        """
        blocks = [copy.deepcopy(self.block_of_level(i)) for i in range(self.num_levels)]
        untied = RecurrentStack(
            blocks,
            copy.deepcopy(list(self.levels)),
            DepthPlan.build(self.num_levels),
            halting=copy.deepcopy(self.halting),
            final_norm=copy.deepcopy(self.final_norm),
        )
        untied.set_grad_checkpointing(
            self.grad_checkpointing, self.offload_activations, self.checkpoint_segment
        )
        untied.run_levels = self.run_levels
        untied.compile_settings = self.compile_settings
        return untied
