"""Dropout (Srivastava et al. 2014) with a cheaper mask on the CPU.

``torch.nn.functional.dropout`` on the CPU draws its mask with ``bernoulli_`` into a float
tensor, scales it in place and keeps that float mask for the backward pass. Here the mask
compares uniform 32-bit integers with a threshold (:func:`keep_mask`): each element is kept
with probability ``1 - p`` to within 2^-33 (``torch.rand``'s float32 uniforms, which
``bernoulli_`` and a ``rand_like(x) >= p`` mask compare, resolve ``p`` only to 2^-24) and
scaled by ``1 / (1 - p)``. The integers come from full-range 64-bit draws, two elements per
draw, so the CPU generator, which runs on one thread, does about half the work of
``rand_like`` and a third of ``bernoulli_`` (0.9 against 1.5 and 3.0 ms for 2048 x 256 on
this project's 2-core machine). The mask kept for backward is boolean (1 byte an element
instead of 4). With a dropout on every residual branch this is several percent of a
training step of a Transformer on a CPU; ``scripts/benchmark_nmt.py`` measures the models
with it.

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


def keep_mask(x: Tensor, p: float) -> Tensor:
    """A boolean mask shaped like ``x``, True with probability ``1 - p`` (to within 2^-33).

    Each element compares a uniform 32-bit integer ``r`` in [-2^31, 2^31) with
    ``t = round(p * 2^32) - 2^31``: ``P(r >= t) = 1 - round(p * 2^32) / 2^32``. The integers
    are the halves of full-range 64-bit draws from the device's default generator.
    """
    threshold = round(p * 2**32) - 2**31
    if threshold >= 2**31:  # p within 2^-33 of 1: no int32 reaches it
        return torch.zeros(x.shape, dtype=torch.bool, device=x.device)
    n = x.numel()
    words = torch.empty((n + 1) // 2, dtype=torch.int64, device=x.device)
    words.random_(-(2**63), None)  # every 64-bit pattern equally likely
    uniform = words.view(torch.int32)[:n].view(x.shape)
    return uniform >= threshold


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """``torch.nn.functional.dropout(x, p, training)``, with the cheaper CPU mask for fp32."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or x.dtype != torch.float32 or p >= 1.0:
        return nn.functional.dropout(x, p, training)
    return _MaskedScale.apply(x, keep_mask(x, p), 1.0 / (1.0 - p))


class Dropout(nn.Dropout):
    """``torch.nn.Dropout`` (same arguments and state), drawing its mask as :func:`dropout`."""

    def forward(self, x: Tensor) -> Tensor:
        if self.inplace:
            return super().forward(x)
        return dropout(x, self.p, self.training)
