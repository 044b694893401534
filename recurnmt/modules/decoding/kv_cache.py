"""One level's self-attention keys and values during incremental decoding.

Keys and values live in one preallocated buffer, 2 x B x H x capacity x D, that grows by
doubling: a step writes its new positions in place instead of concatenating (which would copy
the whole history at every step), and beam search reorders keys and values together with one
``index_select`` per level. The buffer is read and written through ``narrow`` rather than
``[:, :, a:b]``: torch 2.6 dispatches a slice for every ``:``, eight more operations per level
and step (``tests/test_decoding_guards.py`` counts them). Self-attention hands over the new keys
and values as one 2 x B x H x T x D view of its fused projection (:meth:`KVCache.append_pair`):
one copy writes both and one ``narrow`` reads both, five operations per level and step
where separate keys and values take ten.

Beam search reorders the cache at every step, and a reorder *moves* it: the filled positions are
selected into a new buffer, and the cache it was called on gives up its own (reading or
appending to it afterwards raises). On a CPU the new buffer is the one the cache held before its
previous reorder (kept as ``spare``): two buffers per level take turns and no step allocates,
where a new buffer of tens of megabytes would be fresh pages from the operating system at every
step, whose faults cost several times the copy (one level's reorder of 512 hypotheses, H=128,
33 of 64 positions filled: 32 ms into a new buffer, 3.4 ms into the spare; a ``ringformer``
decoding step at H=256, 64 sentences at beam 4: 82-86 ms before, 71-76 ms after, fairseq's
transformer 67-75). The spare doubles the self-attention state held between steps; on CUDA the
caching allocator already hands the freed buffer back, so there no spare is kept.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

MIN_CAPACITY = 16  # positions allocated at the first step


class KVCache:
    """Keys and values of earlier steps for one level.

    Attributes:
        buffer: 2 x B x H x capacity x D (keys, then values); None before the first step.
        length: positions filled.
        spare: storage the next :meth:`reorder` writes into (on a CPU: the buffer before the
            last reorder).
        key_mask: None: attention reads the filled positions only (a static-shape cache,
            :mod:`recurnmt.modules.decoding.static_cache`, gives its whole buffer and this mask).
        query_rows: None: every row has a query (:class:`~recurnmt.modules.decoding.exits.
            StepRows` names the rows still running).
    """

    key_mask = None
    query_rows = None  # the rows whose queries attend (None: all; modules/decoding/exits.py)

    def __init__(
        self, buffer: Tensor | None = None, length: int = 0, spare: Tensor | None = None
    ) -> None:
        self.buffer = buffer
        self.length = length
        self.spare = spare

    @property
    def keys(self) -> Tensor:
        """B x H x length x D (a view of the buffer)."""
        return self._filled(0)

    @property
    def values(self) -> Tensor:
        """B x H x length x D (a view of the buffer)."""
        return self._filled(1)

    def _filled(self, which: int) -> Tensor:
        if self.buffer is None:
            self._check_not_moved()
            raise ValueError("the cache is empty: no step has run yet")
        return self.buffer[which].narrow(2, 0, self.length)

    def _check_not_moved(self) -> None:
        if self.length:  # positions filled, no buffer: reorder() moved them
            raise ValueError("this cache was moved by reorder(): use the cache it returned")

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Writes the new positions' keys and values (B x H x T x D each).

        Returns:
            All keys and all values so far, each B x H x (length + T) x D, as views.
        """
        end = self.length + k.size(2)
        if self.buffer is None or end > self.buffer.size(3):
            self._grow(k, end)
        self.buffer[0].narrow(2, self.length, k.size(2)).copy_(k)
        self.buffer[1].narrow(2, self.length, v.size(2)).copy_(v)
        self.length = end
        return self.keys, self.values

    def append_pair(self, kv: Tensor) -> tuple[Tensor, Tensor]:
        """Writes the new positions' keys and values given together, 2 x B x H x T x D
        (keys, then values), with one copy.

        Returns:
            All keys and all values so far, each B x H x (length + T) x D, as views.
        """
        end = self.length + kv.size(3)
        if self.buffer is None or end > self.buffer.size(3):
            self._grow(kv[0], end)
        self.buffer.narrow(3, self.length, kv.size(3)).copy_(kv)
        self.length = end
        keys, values = self.buffer.narrow(3, 0, end).unbind(0)
        return keys, values

    def open_step(self, like: Tensor) -> int:
        """Makes room for one more position of every row (``like``: B x H x 1 x D, the new
        keys' shape, dtype and device) and counts it filled; returns its index. The caller
        writes it (:class:`~recurnmt.modules.decoding.exits.StepRows`: rows that exit write
        theirs apart from the rows that run on)."""
        end = self.length + 1
        if self.buffer is None or end > self.buffer.size(3):
            self._grow(like, end)
        self.length = end
        return end - 1

    def truncate(self, length: int) -> None:
        """Keeps the first ``length`` positions (speculative decoding drops the rejected drafts'
        keys and values): the buffer stays, later appends overwrite the rest."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a cache of {self.length} positions to {length}")
        if self.buffer is None:
            self._check_not_moved()
        self.length = length

    def _grow(self, k: Tensor, needed: int) -> None:
        if self.buffer is None:
            self._check_not_moved()
        b, h, _, d = k.shape
        capacity = max(needed, MIN_CAPACITY)
        if self.buffer is not None:
            capacity = max(capacity, 2 * self.buffer.size(3))
        grown = k.new_empty(2, b, h, capacity, d)
        if self.buffer is not None:
            grown.narrow(3, 0, self.length).copy_(self.buffer.narrow(3, 0, self.length))
        self.buffer = grown

    def reorder(self, new_order: Tensor) -> KVCache:
        """The cache with its batch rows selected by ``new_order`` (one copy of the filled
        keys and values; on a CPU into this cache's spare storage); this cache is moved into
        it (reading or appending to it afterwards raises)."""
        if self.buffer is None:
            self._check_not_moved()
            return KVCache()
        shape = (2, new_order.numel(), *self.buffer.shape[2:])
        target = self.spare
        if target is None or target.shape != shape:
            target = _storage(target, shape)
            if target is None:
                target = self.buffer.new_empty(shape)
        filled = self.buffer.narrow(3, 0, self.length)
        torch.index_select(filled, 1, new_order, out=target.narrow(3, 0, self.length))
        spare = self.buffer if self.buffer.device.type == "cpu" else None
        moved = KVCache(target, self.length, spare=spare)
        self.buffer = self.spare = None
        return moved


def _storage(t: Tensor | None, shape: tuple[int, ...]) -> Tensor | None:
    """A ``shape`` view of the memory of ``t`` (contiguous) where it is large enough: a
    batch that shrinks (sentences finished) reuses it."""
    n = math.prod(shape)
    if t is None or t.numel() < n:
        return None
    return t.view(-1).narrow(0, 0, n).view(shape)
