"""Learning-rate schedule: linear warmup, then cosine decay (Loshchilov & Hutter 2017).

lr(t) = base * t / W                                          for t < W,
lr(t) = min + (base - min) * (1 + cos(pi * (t - W) / (T - W))) / 2   for W <= t <= T,

stepped once per optimiser update (DeiT and SReT use 5 warmup epochs; RingFormer A.1 2K/3128
warmup steps).
"""

from __future__ import annotations

import math

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR


def cosine_factor(step: int, warmup: int, total: int, min_ratio: float = 0.0) -> float:
    """The multiplier of the base rate at update ``step`` (0-based)."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    if total <= warmup:
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def cosine_with_warmup(
    optimizer: Optimizer, warmup: int, total: int, min_ratio: float = 0.0
) -> LambdaLR:
    """A per-update scheduler implementing :func:`cosine_factor`."""
    return LambdaLR(optimizer, lambda step: cosine_factor(step, warmup, total, min_ratio))
