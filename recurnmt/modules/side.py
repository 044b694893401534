"""One side of a translation model (encoder or decoder), and a decoder side as decoding asks it.

A side is its token front end (:class:`~recurnmt.modules.tokens.TokenFrontEnd`), its
:class:`~recurnmt.modules.stack.RecurrentStack` (built from the side's ``StackConfig``), the
hooks every level takes (the Universal Transformer's positions at every level) and the
positions' rows. :class:`Side` holds all of it and is built once, by :meth:`Side.build_side`,
for every front end: fairseq's encoder and decoder and the ``transformers`` model's sides are
:class:`Side` subclasses (each also the module its own framework expects, so the parameters
keep their names, ``embed.*`` and ``stack.*``, in every checkpoint and export); a front end
chooses only its token front end's class (:attr:`Side.front_end`: fairseq's on fairseq's
position modules).

:class:`DecodingSide` is what every decoding loop (the speculative loop, the static-shape and
compiled steps) asks of a model: embed a step, run levels i..j over a cache, read logits,
keep rows. A front end makes one from its decoder side, one batch's encoder memory and its
output layer; nothing else of the front end reaches the loop.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from torch import Tensor, nn

from recurnmt.modules.builders import build_stack
from recurnmt.modules.cache import StackCache
from recurnmt.modules.config import StackConfig
from recurnmt.modules.hooks import LevelHook, positions_hooks
from recurnmt.modules.memory import Memory
from recurnmt.modules.stack import RecurrentStack, StackOutput
from recurnmt.modules.tokens import TokenConfig, TokenFrontEnd


class Side(nn.Module):
    """A token front end and the recurrent stack of one side (the module docstring).

    A subclass calls :meth:`build_side` once in its constructor, after its framework's own
    base constructor (``FairseqEncoder``, ``nn.Module``).

    Attributes:
        front_end: the token front end's class (a :class:`TokenFrontEnd`).
        embed: the token front end.
        stack: the side's stack.
        stack_cfg: what the stack was built from (analysis, tests, exports).
    """

    front_end: type[TokenFrontEnd] = TokenFrontEnd
    embed: TokenFrontEnd
    stack: RecurrentStack
    stack_cfg: StackConfig

    def build_side(
        self,
        stack_cfg: StackConfig,
        tokens: TokenConfig,
        embed_tokens: nn.Embedding,
        max_positions: int,
        dropout: float = 0.0,
        depth: int | None = None,
    ) -> None:
        """Builds the side's token front end, then its stack (in this order: a learned
        position table draws its initial weights before the stack's).

        Args:
            stack_cfg: the stack's configuration.
            tokens: how the side embeds its tokens.
            embed_tokens: the side's (possibly shared) token embedding.
            max_positions: the side's longest sequence.
            dropout: dropout on the front end's output.
            depth: the elastic depth to run the stack at (None: as built).
        """
        self.stack_cfg = stack_cfg
        every_level = stack_cfg.coordinates.positions_every_level  # UT: the stack adds them
        self.embed = self.front_end(
            tokens, embed_tokens, max_positions, dropout, add_positions=not every_level
        )
        self.padding_idx = self.embed.padding_idx
        self.stack = build_stack(stack_cfg)
        if depth is not None:
            self.stack.set_depth(depth)

    @property
    def embed_tokens(self) -> nn.Embedding:
        return self.embed.embed_tokens

    @property
    def positions_every_level(self) -> bool:
        """The stack adds the positions at every level (Universal Transformer)."""
        return self.stack_cfg.coordinates.positions_every_level

    def level_hooks(self, positions: Tensor | None) -> list[LevelHook]:
        """The hooks every level of a pass takes: the Universal Transformer's positions."""
        return positions_hooks(self.stack_cfg.coordinates, positions)

    def embed_step(self, tokens: Tensor, position: int) -> tuple[Tensor, Tensor | None]:
        """``tokens`` (B x T, no padding) embedded at target positions ``position`` on
        (0: the start token), B x T x C without dropout, and their position embeddings (or
        None)."""
        positions = self.embed.positions(tokens, position)
        return self.embed.embedded(tokens, positions), positions


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
