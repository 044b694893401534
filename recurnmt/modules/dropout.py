"""Dropout (Srivastava et al. 2014) with a cheaper mask on the CPU.

``torch.nn.functional.dropout`` on the CPU draws its mask with ``bernoulli_`` into a float
tensor, scales it in place and keeps that float mask for the backward pass. Drawing uniform
numbers with ``rand_like`` and comparing them with ``p`` gives the same distribution (each
element kept with probability exactly ``1 - p``, scaled by ``1 / (1 - p)``) in half the
time on the CPU, and the mask kept for backward is boolean (1 byte an element instead of 4).
With a dropout on every residual branch this is about 8% of a training step of a
Transformer on a CPU; ``scripts/benchmark_nmt.py`` measures the models with it.

On other devices, in reduced precision and for ``inplace`` dropout, :class:`Dropout` is
``torch.nn.Dropout`` (CUDA fuses mask and product in one kernel). Both draw from the device's
default generator, so seeding, checkpoint resume and activation checkpointing (which
restores the RNG state before recomputing) reproduce the same masks.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.autograd.function import once_differentiable


class _MaskedScale(torch.autograd.Function):
    """``x * mask * scale`` with a boolean ``mask`` kept for backward."""

    @staticmethod
    def forward(ctx, x: Tensor, mask: Tensor, scale: float) -> Tensor:  # noqa: D102
        ctx.save_for_backward(mask)
        ctx.scale = scale
        return torch.mul(x, mask).mul_(scale)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):  # noqa: D102
        (mask,) = ctx.saved_tensors
        return torch.mul(grad, mask).mul_(ctx.scale), None, None


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """``torch.nn.functional.dropout(x, p, training)``, with the cheaper CPU mask for fp32."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or x.dtype != torch.float32 or p >= 1.0:
        return nn.functional.dropout(x, p, training)
    mask = torch.rand_like(x) >= p
    return _MaskedScale.apply(x, mask, 1.0 / (1.0 - p))


class Dropout(nn.Dropout):
    """``torch.nn.Dropout`` (same arguments and state), drawing its mask as :func:`dropout`."""

    def forward(self, x: Tensor) -> Tensor:
        if self.inplace:
            return super().forward(x)
        return dropout(x, self.p, self.training)
