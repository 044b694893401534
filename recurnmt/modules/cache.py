"""Incremental decoding state of one stack.

fairseq keys incremental state by module instance, and one block object runs at every level of
a shared stack, so the attention modules cannot own their state. A :class:`StackCache` holds
it per level instead: level i's self-attention keys and values, and the projected encoder
memory of every unique block (computed at the first step only, then read back: a fully shared
decoder projects the memory once per sentence). Levels therefore never mix their states.
"""

from __future__ import annotations

from torch import Tensor

from recurnmt.modules.attention import MemoryKV
from recurnmt.modules.kv_cache import KVCache


class StackCache:
    """Self-attention keys/values per level and memory keys/values per unique block.

    Attributes:
        levels: ``levels[i]`` holds level i's keys and values (:class:`KVCache`).
        memory: ``memory[b]`` is unique block b's projected memory.
    """

    def __init__(
        self,
        levels: dict[int, KVCache] | None = None,
        memory: dict[int, MemoryKV] | None = None,
    ) -> None:
        self.levels: dict[int, KVCache] = {} if levels is None else levels
        self.memory: dict[int, MemoryKV] = {} if memory is None else memory

    def level(self, index: int) -> KVCache:
        """Level ``index``'s state (created empty at the first step)."""
        if index not in self.levels:
            self.levels[index] = KVCache()
        return self.levels[index]

    def reorder(self, new_order: Tensor) -> StackCache:
        """The cache with its batch rows selected by ``new_order`` (beam search).

        Self-attention keys/values are reordered. The projected memory is the same for all
        beams of a sentence, so while the batch keeps its size (beams reshuffled within each
        sentence) it is left as is, as fairseq does for encoder-decoder attention; it is
        selected only when finished sentences leave the batch.
        """
        levels = {i: kv.reorder(new_order) for i, kv in self.levels.items()}
        memory = {}
        for b, kv in self.memory.items():
            if kv.k.size(0) == new_order.numel():
                memory[b] = kv
            else:
                pad = (
                    None if kv.padding_mask is None else kv.padding_mask.index_select(0, new_order)
                )
                memory[b] = MemoryKV(
                    kv.k.index_select(0, new_order), kv.v.index_select(0, new_order), pad
                )
        return StackCache(levels, memory)
