"""Token + position embedding front end shared by the encoder and the decoder."""

from __future__ import annotations

from typing import Any

from fairseq.modules import LayerNorm, PositionalEmbedding
from torch import Tensor, nn

from recurnmt.modules.dropout import Dropout
from recurnmt.modules.tokens import TokenConfig
from recurnmt.nmt.embedding_layout import scales_embedding


def token_config(args: Any, side: str) -> TokenConfig:
    """A side's token front end as fairseq's flags set it: ``--no-token-positional-embeddings``,
    ``--{side}-learned-pos``, ``--no-scale-embedding`` (and recurnmt's ``--scale-embedding``,
    :func:`~recurnmt.nmt.embedding_layout.scales_embedding`), ``--layernorm-embedding``."""
    positions = "learned" if getattr(args, f"{side}_learned_pos", False) else "sinusoidal"
    if getattr(args, "no_token_positional_embeddings", False):
        positions = "none"
    return TokenConfig(
        positions=positions,
        scale_embedding=scales_embedding(args),
        layernorm_embedding=bool(getattr(args, "layernorm_embedding", False)),
    )


class TokenEmbedding(nn.Module):
    """``dropout(LN?(scale * E[tokens] + P[positions]))``, as fairseq's transformer does
    (:class:`~recurnmt.modules.tokens.TokenConfig`), on fairseq's position modules.

    Args:
        tokens: the front end's settings (:func:`token_config`).
        embed_tokens: the (possibly shared) token embedding.
        max_positions: longest sequence.
        dropout: dropout on the output.
        add_positions: add the positions to the input; when False they are returned for the
            stack to add at every level (Universal Transformer).
    """

    def __init__(
        self,
        tokens: TokenConfig,
        embed_tokens: nn.Embedding,
        max_positions: int,
        dropout: float,
        add_positions: bool = True,
    ):
        super().__init__()
        self.tokens, self.add_positions = tokens, add_positions
        dim = embed_tokens.embedding_dim
        self.embed_tokens = embed_tokens
        self.padding_idx = embed_tokens.padding_idx
        self.embed_scale = tokens.scale(dim)
        self.embed_positions = (
            PositionalEmbedding(
                max_positions, dim, self.padding_idx, learned=tokens.positions == "learned"
            )
            if tokens.positions != "none"
            else None
        )
        self.layernorm_embedding = LayerNorm(dim) if tokens.layernorm_embedding else None
        self.dropout = Dropout(dropout)

    def max_positions(self, limit: int) -> int:
        if self.embed_positions is None:
            return limit
        return min(limit, self.embed_positions.max_positions)

    def forward(
        self, tokens: Tensor, incremental_state: dict | None = None
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """Embeds B x T tokens.

        Returns:
            ``dropout(x)``, the scaled token embeddings and the position embeddings (None
            when there are none), all B x T x C. With ``incremental_state`` only the last
            position is embedded.
        """
        positions = None
        if self.embed_positions is not None:
            positions = self.embed_positions(tokens, incremental_state=incremental_state)
        if incremental_state is not None:
            tokens = tokens[:, -1:]
            positions = positions[:, -1:] if positions is not None else None
        embedded = self.embed_scale * self.embed_tokens(tokens)
        x = embedded if positions is None or not self.add_positions else embedded + positions
        if self.layernorm_embedding is not None:
            x = self.layernorm_embedding(x)
        return self.dropout(x), embedded, positions
