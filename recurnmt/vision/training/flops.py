"""Model cost: multiply-accumulates and throughput (parameters: :mod:`recurnmt.parameters`).

FLOPs are counted by running one forward pass under ``torch.utils.flop_counter.FlopCounterMode``,
which counts 2 floating-point operations per multiply-accumulate of every matrix product,
convolution and attention kernel (element-wise operations, softmax and norms are not counted). Attention is counted under
PyTorch's reference ("math") attention kernel, whose matrix products the counter sees on
every device; fused CPU kernels would otherwise go uncounted.
Vision papers, SReT and DeiT included, report multiply-accumulates under the name "FLOPs"
(DeiT-Ti: 1.3G), so :func:`count_macs` halves the count; :func:`count_flops` does not.
"""

from __future__ import annotations

import time

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode


@torch.no_grad()
def count_flops(model: nn.Module, input_shape: tuple[int, ...]) -> int:
    """Floating-point operations (2 per multiply-accumulate) of one forward pass."""
    p = next(model.parameters())
    x = torch.zeros(input_shape, device=p.device, dtype=p.dtype)
    was_training = model.training
    model.eval()
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(x)
    model.train(was_training)
    return int(counter.get_total_flops())


def count_macs(model: nn.Module, input_shape: tuple[int, ...]) -> int:
    """Multiply-accumulates of one forward pass, what vision papers call "FLOPs"."""
    return count_flops(model, input_shape) // 2


@torch.no_grad()
def throughput(
    model: nn.Module, input_shape: tuple[int, ...], steps: int = 10, warmup: int = 3
) -> float:
    """Images per second of the forward pass on a batch of ``input_shape`` (B x C x H x W)."""
    p = next(model.parameters())
    x = torch.randn(input_shape, device=p.device, dtype=p.dtype)
    was_training = model.training
    model.eval()
    for _ in range(warmup):
        model(x)
    if p.device.type == "cuda":
        torch.cuda.synchronize(p.device)
    start = time.perf_counter()
    for _ in range(steps):
        model(x)
    if p.device.type == "cuda":
        torch.cuda.synchronize(p.device)
    model.train(was_training)
    return steps * input_shape[0] / (time.perf_counter() - start)
