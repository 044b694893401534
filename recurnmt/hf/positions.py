"""fairseq's position embeddings, computed as fairseq computes them.

fairseq numbers the positions of a sequence from ``padding_idx + 1`` and gives padding the
position ``padding_idx`` (``fairseq.utils.make_positions``); its sinusoidal table (Vaswani et al.
2017 sec. 3.5, in fairseq's layout: all sines, then all cosines, frequency
``10000^(-i / (C/2 - 1))``) is zero at ``padding_idx``. These functions give the same vectors
without fairseq, so an exported model computes exactly what fairseq computed.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def make_positions(tokens: Tensor, padding_idx: int, offset: int = 0) -> Tensor:
    """B x T position numbers: ``padding_idx + 1 + offset, ...`` for tokens, ``padding_idx``
    for padding (``offset``: tokens before these, in incremental decoding)."""
    mask = tokens.ne(padding_idx).long()
    return (torch.cumsum(mask, dim=1) + offset) * mask + padding_idx


def sinusoidal_positions(positions: Tensor, dim: int, padding_idx: int) -> Tensor:
    """fairseq's ``SinusoidalPositionalEmbedding`` of B x T position numbers: B x T x dim."""
    half = dim // 2
    step = math.log(10000) / (half - 1)
    freq = torch.exp(torch.arange(half, dtype=torch.float, device=positions.device) * -step)
    angles = positions.float().unsqueeze(-1) * freq  # B x T x half
    table = torch.cat([torch.sin(angles), torch.cos(angles)], dim=-1)
    if dim % 2 == 1:
        table = torch.nn.functional.pad(table, (0, 1))
    return table.masked_fill(positions.eq(padding_idx).unsqueeze(-1), 0.0)
