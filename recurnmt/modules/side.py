"""One side of a translation model (encoder or decoder).

A side is its token front end (:class:`~recurnmt.modules.tokens.TokenFrontEnd`), its
:class:`~recurnmt.modules.stack.RecurrentStack` (built from the side's ``StackConfig``), the
hooks every level takes (the Universal Transformer's positions at every level) and the
positions' rows. :class:`Side` holds all of it and is built once, by :meth:`Side.build_side`,
for every front end: fairseq's encoder and decoder and the ``transformers`` model's sides are
:class:`Side` subclasses (each also the module its own framework expects, so the parameters
keep their names, ``embed.*`` and ``stack.*``, in every checkpoint and export); a front end
chooses only its token front end's class (:attr:`Side.front_end`: fairseq's on fairseq's
position modules).

What a decoding loop asks of a decoder side is
:class:`~recurnmt.modules.decoding.protocol.DecodingSide`.
"""

from __future__ import annotations

from torch import Tensor, nn

from recurnmt.modules.builders import build_stack
from recurnmt.modules.config import StackConfig
from recurnmt.modules.hooks import LevelHook, positions_hooks
from recurnmt.modules.stack import RecurrentStack
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
