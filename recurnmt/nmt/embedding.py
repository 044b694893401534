"""The token front end of fairseq's encoder and decoder: the block library's
:class:`~recurnmt.modules.tokens.TokenFrontEnd` on fairseq's position modules (whose weights,
or the sinusoidal module's buffer, every translation checkpoint holds), set by fairseq's flags."""

from __future__ import annotations

from typing import Any

import torch
from fairseq.modules import PositionalEmbedding
from torch import Tensor, nn

from recurnmt.modules.tokens import TokenConfig, TokenFrontEnd
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


class TokenEmbedding(TokenFrontEnd):
    """:class:`~recurnmt.modules.tokens.TokenFrontEnd` with fairseq's position modules
    (``PositionalEmbedding``: sinusoidal or learned), read as fairseq's transformer reads them
    in a full pass, and by table row at a decoding step (what fairseq's incremental path
    computes, without its several small operations a step)."""

    def build_positions(self, tokens: TokenConfig, max_positions: int) -> nn.Module:
        dim = self.embed_tokens.embedding_dim
        learned = tokens.positions == "learned"
        return PositionalEmbedding(max_positions, dim, self.padding_idx, learned=learned)

    def max_positions(self, limit: int) -> int:
        if self.embed_positions is None:
            return limit
        return min(limit, self.embed_positions.max_positions)

    def positions(self, tokens: Tensor, offset: int = 0) -> Tensor | None:
        if self.embed_positions is None:
            return None
        if offset == 0:  # a full pass (padding numbered as fairseq numbers it)
            return self.embed_positions(tokens)
        rows = self._table_rows(offset, tokens.size(1))  # generated prefixes hold no padding
        return rows.unsqueeze(0).expand(tokens.size(0), -1, -1)

    def position_rows(self, length: int) -> Tensor | None:
        if self.embed_positions is None:
            return None
        return self._table_rows(0, length)

    def _table_rows(self, start: int, count: int) -> Tensor:
        """Positions ``start`` .. ``start + count - 1``, count x C: fairseq's table rows
        ``padding_idx + 1 + position`` (sinusoidal: its ``weights``; learned: its
        ``weight``)."""
        module, weight = self.embed_positions, self.embed_tokens.weight
        table = module.weights if hasattr(module, "weights") else module.weight
        first = self.padding_idx + 1 + start
        if first + count > table.size(0):  # beyond the built table: the module extends it
            prefix = torch.full((1, start + count), self.padding_idx + 1, device=weight.device)
            return module(prefix)[0, start:]
        return table[first : first + count].to(weight)
