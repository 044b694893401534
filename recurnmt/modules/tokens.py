"""A side's token front end, declared and written once for every front end that embeds tokens.

``LN?(scale * E[tokens] + P[positions])``, as fairseq's transformer embeds them (Vaswani et
al. 2017, sec. 3.4: the embeddings times sqrt(d_model); sec. 3.5: sinusoidal positions). A
:class:`TokenConfig` says how a side embeds its tokens; :class:`TokenFrontEnd` is the module.
Its positions follow fairseq's layout, computed here without fairseq (:func:`make_positions`,
:func:`sinusoidal_positions`): the exported ``transformers`` models use them as they are, and
the translation front end takes fairseq's own position modules instead, whose weights its
checkpoints hold (:class:`recurnmt.nmt.embedding.TokenEmbedding` overrides
:meth:`TokenFrontEnd.build_positions` and the two readers of positions). The export writes the
translation model's config as it is (:meth:`TokenConfig.to_dict`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch
from torch import Tensor, nn

from recurnmt.modules.dropout import Dropout
from recurnmt.modules.errors import ConfigError

POSITIONS = ("sinusoidal", "learned", "none")


@dataclass(frozen=True)
class TokenConfig:
    """How one side embeds its tokens.

    Attributes:
        positions: ``sinusoidal`` (fairseq's default), ``learned`` (a table, fairseq's
            ``--*-learned-pos``) or ``none`` (``--no-token-positional-embeddings``).
        scale_embedding: the token embeddings times sqrt(width) (fairseq, unless
            ``--no-scale-embedding``; RingFormer's code: off).
        layernorm_embedding: a layer norm after the sum (``--layernorm-embedding``).

    Raises:
        ConfigError: a kind of positions other than these.
    """

    positions: str = "sinusoidal"
    scale_embedding: bool = True
    layernorm_embedding: bool = False

    def __post_init__(self) -> None:
        if self.positions not in POSITIONS:
            raise ConfigError("positions", self.positions, "sinusoidal, learned or none")

    def scale(self, dim: int) -> float:
        """The factor on the token embeddings of width ``dim``."""
        return math.sqrt(dim) if self.scale_embedding else 1.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TokenConfig:
        """The config from a mapping holding its fields (others ignored: a model config)."""
        return cls(**{f.name: values[f.name] for f in fields(cls) if f.name in values})


def make_positions(tokens: Tensor, padding_idx: int, offset: int = 0) -> Tensor:
    """B x T position numbers as fairseq numbers them (``fairseq.utils.make_positions``):
    ``padding_idx + 1 + offset, ...`` for tokens, ``padding_idx`` for padding (``offset``:
    the tokens before these, in incremental decoding)."""
    mask = tokens.ne(padding_idx).long()
    return (torch.cumsum(mask, dim=1) + offset) * mask + padding_idx


def sinusoidal_positions(positions: Tensor, dim: int, padding_idx: int) -> Tensor:
    """fairseq's ``SinusoidalPositionalEmbedding`` of B x T position numbers: B x T x dim
    (Vaswani et al. 2017 sec. 3.5 in fairseq's layout: all sines, then all cosines, frequency
    ``10000^(-i / (dim/2 - 1))``; zero at ``padding_idx``)."""
    half = dim // 2
    step = math.log(10000) / (half - 1)
    freq = torch.exp(torch.arange(half, dtype=torch.float, device=positions.device) * -step)
    angles = positions.float().unsqueeze(-1) * freq  # B x T x half
    table = torch.cat([torch.sin(angles), torch.cos(angles)], dim=-1)
    if dim % 2 == 1:
        table = torch.nn.functional.pad(table, (0, 1))
    return table.masked_fill(positions.eq(padding_idx).unsqueeze(-1), 0.0)


class TokenFrontEnd(nn.Module):
    """``dropout(LN?(scale * E[tokens] + P[positions]))`` of one side (:class:`TokenConfig`).

    Args:
        tokens: the front end's settings.
        embed_tokens: this side's (possibly shared) token embedding.
        max_positions: longest sequence of this side.
        dropout: dropout on the output (training).
        add_positions: add the positions to the input; when False they are returned for the
            stack to add at every level (Universal Transformer).
    """

    def __init__(
        self,
        tokens: TokenConfig,
        embed_tokens: nn.Embedding,
        max_positions: int,
        dropout: float = 0.0,
        add_positions: bool = True,
    ) -> None:
        super().__init__()
        dim = embed_tokens.embedding_dim
        self.tokens, self.add_positions = tokens, add_positions
        self.embed_tokens = embed_tokens
        self.padding_idx = embed_tokens.padding_idx
        self.embed_scale = tokens.scale(dim)
        self.has_positions = tokens.positions != "none"
        self.embed_positions = None
        if self.has_positions:
            self.embed_positions = self.build_positions(tokens, max_positions)
        self.layernorm_embedding = nn.LayerNorm(dim) if tokens.layernorm_embedding else None
        self.dropout = Dropout(dropout)

    def build_positions(self, tokens: TokenConfig, max_positions: int) -> nn.Module | None:
        """The module holding the position embeddings (None: computed, the sinusoids): a
        learned table in fairseq's layout (``max_positions + padding_idx + 1`` rows)."""
        if tokens.positions != "learned":
            return None
        dim, pad = self.embed_tokens.embedding_dim, self.padding_idx
        return nn.Embedding(max_positions + pad + 1, dim, padding_idx=pad)

    def positions(self, tokens: Tensor, offset: int = 0) -> Tensor | None:
        """B x T x C position embeddings of ``tokens`` at positions ``offset`` on (0: the
        start token; None when the side has none)."""
        if not self.has_positions:
            return None
        return self._rows(make_positions(tokens, self.padding_idx, offset))

    def position_rows(self, length: int) -> Tensor | None:
        """The position embeddings of positions 0 .. ``length`` - 1, length x C, in the
        embeddings' dtype (None without positions): what a static-shape step reads."""
        if not self.has_positions:
            return None
        weight = self.embed_tokens.weight
        first = self.padding_idx + 1
        numbers = torch.arange(first, first + length, device=weight.device).unsqueeze(0)
        return self._rows(numbers)[0].to(weight.dtype)

    def _rows(self, numbers: Tensor) -> Tensor:
        if self.embed_positions is not None:
            return self.embed_positions(numbers)
        return sinusoidal_positions(numbers, self.embed_tokens.embedding_dim, self.padding_idx)

    def embedded(self, tokens: Tensor, positions: Tensor | None) -> Tensor:
        """The stack's input for B x T ``tokens`` at ``positions`` (B x T x C, or None),
        without dropout (decoding)."""
        return self._combine(self.embed_scale * self.embed_tokens(tokens), positions)

    def _combine(self, scaled: Tensor, positions: Tensor | None) -> Tensor:
        """``LN?(scale * E[tokens] + P)`` from the scaled embeddings: the one place it is
        written."""
        x = scaled if positions is None or not self.add_positions else scaled + positions
        return x if self.layernorm_embedding is None else self.layernorm_embedding(x)

    def forward(self, tokens: Tensor, offset: int = 0) -> tuple[Tensor, Tensor, Tensor | None]:
        """Embeds B x T tokens at positions ``offset`` on.

        Returns:
            ``dropout(x)``, the scaled token embeddings and the position embeddings (None
            when there are none), all B x T x C.
        """
        positions = self.positions(tokens, offset)
        scaled = self.embed_scale * self.embed_tokens(tokens)
        return self.dropout(self._combine(scaled, positions)), scaled, positions
