"""Sinusoidal level (timestep) embeddings of the Universal Transformer.

Dehghani et al. (2019), "Universal Transformers", sec. 2.1: at every recurrent step t the
input receives the coordinate embedding P^t, whose level part is
P^t_{2j} = sin(t / 10000^{2j/d}) and P^t_{2j+1} = cos(t / 10000^{2j/d}). RingFormer calls
this the static level signal (RingFormer sec. 3.1, Table 4 "static signal").
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def sinusoidal_level_embedding(num_levels: int, dim: int) -> Tensor:
    """Level embeddings for steps t = 1..num_levels, shape num_levels x dim."""
    t = torch.arange(1, num_levels + 1, dtype=torch.float32)[:, None]  # N x 1
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    emb = torch.zeros(num_levels, dim)
    emb[:, 0::2] = torch.sin(t * freq)
    emb[:, 1::2] = torch.cos(t * freq[: dim // 2])
    return emb
