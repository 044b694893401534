"""Incremental decoding state of fixed shapes: what a captured decoding step needs.

A CUDA graph (or ``torch.compile``'s "reduce-overhead" mode) replays a step over the same
memory with the same shapes. The default cache (:mod:`recurnmt.modules.decoding.kv_cache`) does neither:
it grows by doubling, attention reads its filled positions through a ``narrow`` whose length
changes at every step, and beam search moves it into other storage, with fewer rows as
finished sentences leave the batch. Here, instead:

* every level's keys and values live in one zeroed buffer, 2 x B x H x bucket x D, where the
  bucket is the current position rounded up to a multiple of :data:`BUCKET` (32; at most the
  longest output the batch may reach): it is made anew, holding what was written, when the
  position enters a new bucket, and keeps its storage for the bucket's steps; B stays (beam
  search keeps a finished sentence's rows and ignores them, :mod:`recurnmt.nmt.static_decoding`);
* a step writes its position with ``index_copy_`` at an index held on the device
  (:class:`StepPosition`, shared by all levels, set once per step before the levels run);
* attention reads the whole buffer under a key mask that is True at positions 0 .. the
  current one (:attr:`StaticKVCache.key_mask`, 1 x 1 x 1 x bucket): the positions not yet
  written get softmax weight exactly 0 and hold zeros, so a query attends as over the filled
  positions alone;
* beam search reorders the rows in place (the filled positions are selected, then copied
  back), so the buffer's storage stays.

Every tensor a step reads or writes therefore keeps its address and its shape for the
:data:`BUCKET` steps of a bucket; only the position's two small tensors are rewritten between
steps, so a captured step replays for every step of its bucket (a decoding of 40 tokens
captures two). The buckets keep the buffers and attention's arithmetic near the filled
length's: one buffer of the longest output (201 positions for fairseq-generate's default
``--max-len-b 200``), zeroed at the first step and read whole, made beam search on the
embedded test set 3.2x slower than fairseq's own on a CPU; with the buckets a step costs what
the default cache's does (docs/gpu.md). What stays dearer than the default cache: a finished
sentence's rows, which are still computed until the batch's last sentence ends
(tests/test_static_decoding.py shows the outputs equal to the default decoding's).
"""

from __future__ import annotations

import torch
from torch import Tensor

from recurnmt.modules.decoding.cache import StackCache, select_memory

BUCKET = 32  # positions attention reads grow by this many at a time


class StepPosition:
    """The positions a decoding step writes, shared by every level of a stack: one (beam
    search), or several consecutive ones (speculative decoding's verification).

    Attributes:
        capacity: positions the buffers hold (the longest output, end of sentence included).
        index: the positions, a long tensor of ``count`` elements on the device (for one
            position always the same tensor, rewritten in place).
        start, count: the first position written and how many (host numbers).
        bucket: positions attention reads at this step (the last position + 1 rounded up to a
            multiple of :data:`BUCKET`, at most ``capacity``, never less than before; a host
            number).
        mask: 1 x 1 x count x bucket, True where a query may attend (query j: positions 0 ..
            start + j); a view of one buffer of ``capacity`` positions per count.
        length: positions filled once the current step has run (host number).
    """

    def __init__(self, capacity: int, device: torch.device | str) -> None:
        if capacity < 1:
            raise ValueError(f"a static-shape cache of {capacity} positions holds nothing")
        self.capacity = capacity
        self._positions = torch.arange(capacity, device=device)
        self._indices = {1: torch.zeros(1, dtype=torch.long, device=device)}
        self._masks = {1: torch.zeros(1, 1, 1, capacity, dtype=torch.bool, device=device)}
        self.index = self._indices[1]
        self.start, self.count, self.length = 0, 1, 0
        self.bucket = min(BUCKET, capacity)
        # a tensor attribute, not a lookup by count: a compiled step reads it without
        # specialising on the count
        self._mask = self._masks[1].narrow(3, 0, self.bucket)
        self._step = self.index, self._mask

    @property
    def mask(self) -> Tensor:
        return self._mask

    def set(self, position: int, count: int = 1) -> None:
        """The next step writes positions ``position`` .. ``position + count - 1``, its query j
        attending to 0 .. ``position + j`` (in place: the tensors of a count keep their
        storage)."""
        if count < 1 or not 0 <= position <= self.capacity - count:
            raise ValueError(
                f"positions {position} .. {position + count - 1}: the static-shape cache holds "
                f"{self.capacity} positions"
            )
        if count not in self._indices:
            device = self._positions.device
            self._indices[count] = torch.zeros(count, dtype=torch.long, device=device)
            self._masks[count] = torch.zeros(
                1, 1, count, self.capacity, dtype=torch.bool, device=device
            )
        index, mask = self._indices[count], self._masks[count]
        if count == 1:
            index.fill_(position)
            torch.le(self._positions, position, out=mask.view(-1))
        else:
            torch.add(self._positions[:count], position, out=index)
            torch.le(self._positions, index.view(count, 1), out=mask.view(count, -1))
        self.index, self.start, self.count = index, position, count
        self.length = position + count
        # never smaller than before: after a truncation (speculative decoding) the buffers
        # keep the bucket a verification reached
        bucket = min(-(-self.length // BUCKET) * BUCKET, self.capacity)
        self.bucket = max(bucket, self.bucket)
        self._mask = mask.narrow(3, 0, self.bucket)
        self._step = self.index, self._mask

    def window(self, j: int | None) -> None:
        """Within a step of several positions, the next pass writes its ``j``-th alone (query
        ``start + j``: a draft pass of speculative decoding's fused round, which sets the
        round's positions once); None: every position of the step again. Views of the step's
        tensors, so a compiled round reads them without a host number of the step."""
        index, mask = self._step
        if j is None:
            self.index, self._mask = index, mask
        else:
            self.index, self._mask = index.narrow(0, j, 1), mask.narrow(2, j, 1)

    def truncate(self, length: int) -> None:
        """Only the first ``length`` positions count as filled (speculative decoding keeps
        what was accepted): the buffers stay as they are, the next step writes ``length`` on
        and attends no further than it writes."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a cache of {self.length} positions to {length}")
        self.length = length


class StaticKVCache:
    """One level's keys and values in a buffer of fixed shape (the module docstring).

    Attributes:
        position: the step's position (:class:`StepPosition`, shared by the stack's levels).
        buffer: 2 x B x H x capacity x D (keys, then values); None before the first step.
    """

    query_rows = None  # every row has a query (the exits keep a dynamic cache)

    def __init__(self, position: StepPosition) -> None:
        self.position = position
        self.buffer: Tensor | None = None

    @property
    def key_mask(self) -> Tensor:
        """1 x 1 x 1 x bucket, True where a query may attend (what self-attention reads
        beside the keys and values of :meth:`append_pair`)."""
        return self.position.mask

    @property
    def length(self) -> int:
        return self.position.length if self.buffer is not None else 0

    @property
    def keys(self) -> Tensor:
        """B x H x length x D, the filled positions (a view)."""
        return self._filled()[0]

    @property
    def values(self) -> Tensor:
        """B x H x length x D, the filled positions (a view)."""
        return self._filled()[1]

    def _filled(self) -> Tensor:
        if self.buffer is None:
            raise ValueError("the cache is empty: no step has run yet")
        return self.buffer.narrow(3, 0, self.length)

    def append_pair(self, kv: Tensor) -> tuple[Tensor, Tensor]:
        """Writes the step's keys and values (2 x B x H x count x D) at the step's positions.

        Returns:
            The keys and values of the bucket's positions, each B x H x bucket x D (read
            with :attr:`key_mask`).
        """
        if kv.size(3) != self.position.index.numel():
            raise ValueError(
                f"a static-shape cache takes the step's {self.position.index.numel()} "
                f"position(s), not {kv.size(3)}"
            )
        if self.buffer is not None and kv.shape[1:3] != self.buffer.shape[1:3]:
            raise ValueError(
                f"a static-shape cache keeps its {self.buffer.size(1)} rows; a step gave "
                f"{kv.size(1)}"
            )
        bucket = self.position.bucket
        if self.buffer is None or self.buffer.size(3) != bucket:
            self._grow(kv, bucket)
        self.buffer.index_copy_(3, self.position.index, kv)
        keys, values = self.buffer.unbind(0)
        return keys, values

    def fit(self) -> None:
        """A buffer of the step's bucket, made before the step where the position entered a
        new bucket (so that a compiled step never takes :meth:`append_pair`'s branch that
        makes it)."""
        if self.buffer is not None and self.buffer.size(3) != self.position.bucket:
            self._grow(self.buffer[:, :, :, :1], self.position.bucket)

    def _grow(self, kv: Tensor, bucket: int) -> None:
        """A zeroed buffer of ``bucket`` positions holding the positions filled so far (once
        per bucket: zeroing the longest output's buffer at once cost more than decoding a
        short batch on a CPU)."""
        _, b, h, _, d = kv.shape
        grown = kv.new_zeros(2, b, h, bucket, d)
        if self.buffer is not None:
            filled = self.position.start  # this step's positions are written next
            grown.narrow(3, 0, filled).copy_(self.buffer.narrow(3, 0, filled))
        self.buffer = grown

    def reorder(self, new_order: Tensor) -> StaticKVCache:
        """Selects the rows ``new_order`` (one index per row) in place; returns this cache."""
        if self.buffer is None:
            return self
        if new_order.numel() != self.buffer.size(1):
            raise ValueError(
                f"a static-shape cache keeps its {self.buffer.size(1)} rows; the new order "
                f"has {new_order.numel()}"
            )
        filled = self.buffer.narrow(3, 0, self.length)
        filled.copy_(filled.index_select(1, new_order))
        return self

    def select_rows(self, rows: Tensor) -> None:
        """Keeps the batch rows ``rows`` (sentences leaving speculative decoding's batch) in a
        new buffer of fewer rows: the shapes change, which a compiled step follows and a
        captured one could not."""
        if self.buffer is not None:
            self.buffer = self.buffer.index_select(1, rows)


class StaticStackCache(StackCache):
    """A :class:`~recurnmt.modules.decoding.cache.StackCache` whose levels are :class:`StaticKVCache`
    buffers of ``capacity`` positions on ``device``; :meth:`set_position` before each step.

    Beam search keeps every row (the batch never shrinks), so the projected memory, one row
    per sentence, is never selected: :meth:`reorder` reorders the levels' keys and values in
    place and returns this cache."""

    def __init__(self, capacity: int, device: torch.device | str) -> None:
        super().__init__()
        self.position = StepPosition(capacity, device)

    def set_position(self, position: int) -> None:
        """The next step writes ``position`` (0 at the first step)."""
        self.position.set(position)

    def level(self, index: int) -> StaticKVCache:
        if index not in self.levels:
            self.levels[index] = StaticKVCache(self.position)
        return self.levels[index]

    def set_positions(self, position: int, count: int) -> None:
        """The next step writes ``count`` positions from ``position`` (speculative decoding:
        a draft pass, one; a verification, several), every level's buffer fitted to its
        bucket first (:meth:`StaticKVCache.fit`)."""
        self.position.set(position, count)
        for kv in self.levels.values():
            kv.fit()

    def reorder(self, new_order: Tensor) -> StaticStackCache:
        """Beam search's new order of the rows (as many as before): in place. Fewer rows
        (speculative decoding's finished sentences leave the batch): the levels' buffers and
        the projected memory selected into new, smaller ones (:meth:`StaticKVCache.select_rows`)."""
        rows = next((kv.buffer.size(1) for kv in self.levels.values() if kv.buffer is not None),
                    None)  # fmt: skip
        if rows is None or new_order.numel() == rows:
            for kv in self.levels.values():
                kv.reorder(new_order)
            return self
        for kv in self.levels.values():
            kv.select_rows(new_order)
        self.memory = {b: select_memory(kv, new_order) for b, kv in self.memory.items()}
        self.level_memory = {i: select_memory(kv, new_order) for i, kv in self.level_memory.items()}
        return self

    def truncate(self, length: int) -> None:
        """Every level keeps its first ``length`` positions (speculative decoding): the shared
        position is moved back; the buffers keep their storage (:meth:`StepPosition.truncate`)."""
        self.position.truncate(length)
