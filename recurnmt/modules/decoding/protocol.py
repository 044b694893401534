"""What every decoding loop asks of a model: the one protocol of recurnmt's decoding.

:class:`DecodingSide` is a decoder :class:`~recurnmt.modules.side.Side`, one batch's encoder
memory and the output layer, as the loops of this package (the speculative loop, the
static-shape and compiled steps) ask them: embed a step, run levels i..j over a cache, read
logits, keep rows. A front end makes one from its decoder side, one batch's encoder memory and
its output layer (fairseq's ``nmt/generation.decoding_side``, the ``transformers`` model's
``generate()``); nothing else of the front end reaches a loop, and no loop calls back into a
front end.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from torch import Tensor

from recurnmt.modules.decoding.cache import StackCache
from recurnmt.modules.hooks import LevelHook
from recurnmt.modules.memory import Memory

if TYPE_CHECKING:
    from recurnmt.modules.side import Side
    from recurnmt.modules.stack import StackOutput


class DecodingSide:
    """A decoder :class:`Side`, one batch's encoder memory and the output layer, as a decoding
    loop asks them: the one protocol of recurnmt's decoding loops.

    Args:
        side: the decoder side.
        memory: the encoder output it attends to (``group``: decoder rows per memory row).
        head: the output layer, B x T x C features -> B x T x V logits.
    """

    def __init__(self, side: Side, memory: Memory, head: Callable[[Tensor], Tensor]) -> None:
        self.side, self.stack, self.memory, self.head = side, side.stack, memory, head

    def embed(self, tokens: Tensor, position: int) -> tuple[Tensor, Tensor | None]:
        """``tokens`` (B x 1) embedded at target position ``position`` (0: the start token),
        B x 1 x C, and their position embedding (or None)."""
        return self.side.embed_step(tokens, position)

    def embedded(self, tokens: Tensor, positions: Tensor | None) -> Tensor:
        """The decoder's input for ``tokens`` (B x 1) at ``positions`` (B x 1 x C, or None)."""
        return self.side.embed.embedded(tokens, positions)

    def position_rows(self, length: int) -> Tensor | None:
        """The position embeddings of positions 0 .. ``length`` - 1 (length x C; None without
        positions), as :meth:`embed` adds them (a static-shape step reads them on the
        device)."""
        return self.side.embed.position_rows(length)

    def hooks(self, positions: Tensor | None) -> list[LevelHook]:
        """The level hooks of positions (the Universal Transformer's at every level)."""
        return self.side.level_hooks(positions)

    def run(self, x: Tensor, levels: Sequence[int], cache: StackCache, hooks) -> StackOutput:
        """The stack's ``levels`` on ``x`` (new positions) with the decoding ``cache``."""
        return self.stack(x, memory=self.memory, cache=cache, levels=levels, hooks=hooks)

    def logits(self, features: Tensor) -> Tensor:
        """The output layer: B x T x C -> B x T x V."""
        return self.head(features)

    def select(self, rows: Tensor) -> None:
        """Keeps the batch rows ``rows`` (finished sentences leave)."""
        m = self.memory
        pad = None if m.padding_mask is None else m.padding_mask[rows]
        self.memory = Memory(m.states[rows], pad, m.group)
