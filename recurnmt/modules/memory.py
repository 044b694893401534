"""The encoder memory of a decoder stack, as every level reads it.

A weight-shared decoder's cross-attention has the same K/V projection at every level that
runs a block, so the memory is projected once per unique block (once per sentence for a fully
shared decoder) and reused by those levels; a relaxed level adds its own low-rank term to its
block's keys and values (Relaxed Recursive Transformers eq. 3,
:meth:`~recurnmt.modules.level_parts.LevelParts.level_memory`). In incremental decoding the
projections live in the :class:`~recurnmt.modules.decoding.cache.StackCache`, computed at the first
step only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from torch import Tensor, nn

from recurnmt.modules.attention import MemoryKV
from recurnmt.modules.decoding.cache import StackCache
from recurnmt.modules.depth_plan import DepthPlan
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


def level_memory(
    blocks: Sequence[nn.Module],
    levels: Sequence[LevelParts],
    plan: DepthPlan,
    memory: Memory,
    cache: StackCache | None = None,
) -> dict[int, MemoryKV]:
    """Keys/values of ``memory`` as every level reads them, ``{level: MemoryKV}``.

    Args:
        blocks: the stack's unique blocks (with ``project_memory``).
        levels: the stack's level parts.
        plan: which block each level runs.
        memory: the encoder output.
        cache: incremental decoding state: the projections are read from it after the first
            step, and written to it at the first.
    """
    by_block = {}
    for b in sorted(set(plan.block_of_level)):
        if cache is not None and b in cache.memory:
            by_block[b] = cache.memory[b]
            continue
        by_block[b] = blocks[b].project_memory(memory.states, memory.padding_mask, memory.group)
        if cache is not None:
            cache.memory[b] = by_block[b]
    kv = {}
    for i, b in enumerate(plan.block_of_level):
        parts = levels[i]
        if not parts.relaxes_memory:
            kv[i] = by_block[b]
        elif cache is not None and i in cache.level_memory:
            kv[i] = cache.level_memory[i]
        else:
            kv[i] = parts.level_memory(by_block[b], memory.states)
            if cache is not None:
                cache.level_memory[i] = kv[i]
    return kv
