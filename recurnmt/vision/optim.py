"""AdamW with DeiT's weight-decay exemptions (Loshchilov & Hutter 2019; DeiT Table 9).

Weight decay applies to weight matrices and convolution kernels only: biases, norm scales,
learnable residual coefficients (all 1-D), position tables and class tokens are exempt, as in
DeiT and SReT (``no_weight_decay`` of the model lists the non-1-D exemptions).
"""

from __future__ import annotations

import torch
from torch import nn


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two parameter groups: decayed and exempt."""
    skip = set(getattr(model, "no_weight_decay", lambda: set())())
    decay, no_decay, seen = [], [], set()
    for name, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        if p.ndim <= 1 or name in skip or name.endswith(".bias"):
            no_decay.append(p)
        else:
            decay.append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def build_optimizer(
    model: nn.Module,
    lr: float,
    weight_decay: float,
    betas: tuple[float, float] = (0.9, 0.999),
) -> torch.optim.AdamW:
    """AdamW over :func:`param_groups`."""
    return torch.optim.AdamW(param_groups(model, weight_decay), lr=lr, betas=betas)
