"""recurnmt's incremental decoding state in ``transformers``' ``generate()``.

A weight-shared decoder cannot keep its state in the attention modules (one block object
runs at every level), so recurnmt keeps a :class:`~recurnmt.modules.StackCache` per stack: the
keys and values of every level, and the encoder memory projected once per unique block. This
wrapper adds the number of decoded steps (positions of the next token) and the two methods
generation asks of a cache: its length, and a reordering of the batch rows after each beam
search step (``_reorder_cache`` / ``reorder_cache``).
"""

from __future__ import annotations

from torch import Tensor

from recurnmt.modules import StackCache


class RecurnmtCache:
    """Decoder state of one ``generate()`` call.

    Attributes:
        stack: every level's keys/values and every unique block's projected memory.
        steps: target positions decoded so far.
    """

    def __init__(self, stack: StackCache | None = None, steps: int = 0) -> None:
        self.stack = StackCache() if stack is None else stack
        self.steps = steps

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Decoded positions (transformers' cache protocol)."""
        return self.steps

    def reordered(self, beam_idx: Tensor) -> RecurnmtCache:
        """The state with its batch rows selected by ``beam_idx`` (beam search)."""
        return RecurnmtCache(self.stack.reorder(beam_idx), self.steps)

    def reorder_cache(self, beam_idx: Tensor) -> None:
        """In place, as ``transformers.Cache.reorder_cache``."""
        self.stack = self.stack.reorder(beam_idx)
