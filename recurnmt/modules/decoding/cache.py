"""Incremental decoding state of one stack.

fairseq keys incremental state by module instance, and one block object runs at every level of
a shared stack, so the attention modules cannot own their state. A :class:`StackCache` holds
it per level instead: level i's self-attention keys and values, and the projected encoder
memory of every unique block (computed at the first step only, then read back: a fully shared
decoder projects the memory once per sentence), and the memory as a relaxed level reads it
(its own LoRA term on the keys and values, Relaxed Recursive Transformers eq. 3). Levels
therefore never mix their states. It also holds the session's tensors derived from the weights
(:mod:`recurnmt.modules.decoding.session`), so that they live exactly as long as the keys and values.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

from recurnmt.modules.attention import MemoryKV, additive_mask
from recurnmt.modules.decoding.kv_cache import KVCache
from recurnmt.modules.decoding.session import DecodingSession


class StackCache:
    """Self-attention keys/values per level and memory keys/values per unique block.

    Attributes:
        levels: ``levels[i]`` holds level i's keys and values (:class:`KVCache`).
        memory: ``memory[b]`` is unique block b's projected memory.
        level_memory: ``level_memory[i]`` is the memory as relaxed level i reads it (only
            levels with their own term on the keys and values).
        session: what this decoding session derives from the weights (folded linears, ACT's
            float32 halting unit; :mod:`recurnmt.modules.decoding.session`), made by the stack at the
            first step in inference and living as long as this state.
    """

    def __init__(
        self,
        levels: dict[int, KVCache] | None = None,
        memory: dict[int, MemoryKV] | None = None,
        level_memory: dict[int, MemoryKV] | None = None,
    ) -> None:
        self.levels: dict[int, KVCache] = {} if levels is None else levels
        self.memory: dict[int, MemoryKV] = {} if memory is None else memory
        self.level_memory: dict[int, MemoryKV] = {} if level_memory is None else level_memory
        self.session: DecodingSession | None = None

    def level(self, index: int) -> KVCache:
        """Level ``index``'s state (created empty at the first step)."""
        if index not in self.levels:
            self.levels[index] = KVCache()
        return self.levels[index]

    def truncate(self, length: int) -> None:
        """Every level keeps its first ``length`` positions (speculative decoding: what was
        accepted); the projected memory is the sentence's and stays."""
        for kv in self.levels.values():
            kv.truncate(length)

    def reorder(self, new_order: Tensor) -> StackCache:
        """The cache with its batch rows selected by ``new_order`` (beam search).

        Self-attention keys/values are reordered. The projected memory is the same for all
        beams of a sentence, so while the batch keeps its size (beams reshuffled within each
        sentence) it is left as is, as fairseq does for encoder-decoder attention; it is
        selected only when finished sentences leave the batch. A memory kept once per
        sentence (``group`` rows each, :class:`~recurnmt.modules.attention.MemoryKV`) then
        selects the sentences of whole groups, or is repeated to one row per hypothesis
        where the new order breaks the groups.
        """
        levels = {i: kv.reorder(new_order) for i, kv in self.levels.items()}
        memory = {b: select_memory(kv, new_order) for b, kv in self.memory.items()}
        relaxed = {i: select_memory(kv, new_order) for i, kv in self.level_memory.items()}
        moved = StackCache(levels, memory, relaxed)
        moved.session = self.session  # derived from the weights, not from the rows
        return moved


def select_memory(kv: MemoryKV, new_order: Tensor) -> MemoryKV:
    """``kv`` for the query rows ``new_order`` (indices into its current query rows)."""
    g = kv.group
    if kv.k.size(0) * g == new_order.numel():
        return kv  # beams reshuffled within their sentences
    if g > 1:
        n = new_order.numel()
        sentences = new_order.view(-1, g) // g if n % g == 0 else None
        if sentences is None or not bool((sentences == sentences[:, :1]).all()):
            # a new group would mix sentences: one memory row per query row from here on
            k, v, pad = (_rows(t, lambda t: t.repeat_interleave(g, dim=0)) for t in _rows_of(kv))
            return select_memory(MemoryKV(k, v, pad, 1, _mask_like(kv, pad)), new_order)
        new_order = sentences[:, 0]  # every group keeps the rows of one sentence

    def select(t: Tensor) -> Tensor:
        return t.index_select(0, new_order)

    k, v, pad = (_rows(t, select) for t in _rows_of(kv))
    return MemoryKV(k, v, pad, kv.group, _mask_like(kv, pad))


def _rows_of(kv: MemoryKV) -> tuple[Tensor | None, ...]:
    """The tensors of ``kv`` with one row per memory row (the additive mask aside)."""
    return kv.k, kv.v, kv.padding_mask


def _mask_like(kv: MemoryKV, pad: Tensor | None) -> Tensor | None:
    """The additive mask of the selected rows, made anew from their padding (a selected copy
    would lose the aligned layout the fused kernel takes without a copy); only where the
    memory had one."""
    return None if kv.attn_mask is None else additive_mask(pad, kv.attn_mask.dtype)


def _rows(t: Tensor | None, f: Callable[[Tensor], Tensor]) -> Tensor | None:
    return None if t is None else f(t)
