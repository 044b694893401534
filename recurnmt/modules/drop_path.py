"""Stochastic depth (Huang et al. 2016), as DeiT, timm and SReT use it on residual branches."""

from __future__ import annotations

from torch import Tensor


def drop_path(x: Tensor, p: float, training: bool) -> Tensor:
    """Drops the whole branch of a sample with probability p, rescaling the rest (B x ...)."""
    if p == 0.0 or not training:
        return x
    keep = x.new_empty((x.size(0),) + (1,) * (x.dim() - 1)).bernoulli_(1.0 - p)
    return x * keep / (1.0 - p)
