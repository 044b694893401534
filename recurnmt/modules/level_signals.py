"""RingFormer's input-dependent level signals (RingFormer sec. 3.2, eq. 5-7).

A level signal is a level-specific linear map of the block input, g_i(x) = M_i x, with M_i
factored as M_i = A_i B_i^T (eq. 5), A_i, B_i in R^{d x r}, r << d. It is computed in rank
space, x -> x B_i (r values) -> (x B_i) A_i^T (d values), never by forming the d x d matrix.

Initialisation: one factor starts at zero so every signal is exactly zero at step 0 and the
model begins as a plain shared block (RingFormer sec. 3.2, following LoRA). The paper's prose
calls the zero-initialised A the "down-projection"; in eq. 5 A is the factor that maps rank
space back to width d, i.e. the up-projection, which is the one zeroed here (DESIGN.md).

Several signals of one level that read the same input (Q, K and V, eq. 6) are computed by
one module with ``groups`` > 1: a single down-projection to ``groups * r`` values, then one
batched up-projection per group.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


class LowRankSignal(nn.Module):
    """``groups`` low-rank signals g(x) = (x B) A^T read from one input (RingFormer eq. 5).

    Args:
        in_dim: width of the input x.
        out_dim: width of each signal.
        rank: rank r of every signal.
        groups: number of signals; the output is ``... x (groups * out_dim)``, grouped
            contiguously (all of signal 0, then signal 1, ...), matching a fused projection.
    """

    def __init__(self, in_dim: int, out_dim: int, rank: int, groups: int = 1) -> None:
        super().__init__()
        if rank <= 0 or rank > min(in_dim, out_dim):
            raise ValueError(f"signal rank={rank} must lie in 1..{min(in_dim, out_dim)}")
        self.groups, self.rank, self.out_dim = groups, rank, out_dim
        self.down = nn.Parameter(torch.empty(groups * rank, in_dim))  # B^T of every group
        self.up = nn.Parameter(torch.zeros(groups, out_dim, rank))  # A, zero-initialised
        nn.init.kaiming_uniform_(self.down, a=math.sqrt(5))

    def forward(self, x: Tensor) -> Tensor:
        z = x @ self.down.t()  # ... x (G * r)
        if self.groups == 1:
            return z @ self.up[0].t()  # ... x out
        lead = z.shape[:-1]
        # one batched product over the groups (a third faster than the equivalent einsum at a
        # decoding step, where these small products are a noticeable share of the level)
        z = z.reshape(-1, self.groups, self.rank).transpose(0, 1)  # G x N x r
        out = torch.bmm(z, self.up.transpose(1, 2))  # G x N x out
        return out.transpose(0, 1).reshape(*lead, self.groups * self.out_dim)


class FullRankSignal(nn.Module):
    """``groups`` full-rank signals g(x) = M x (RingFormer Table 4 "full-rank signal").

    M starts at zero, like the low-rank signals, so training starts from the shared block.
    """

    def __init__(self, in_dim: int, out_dim: int, groups: int = 1) -> None:
        super().__init__()
        self.groups, self.out_dim = groups, out_dim
        self.weight = nn.Parameter(torch.zeros(groups * out_dim, in_dim))

    def forward(self, x: Tensor) -> Tensor:
        return x @ self.weight.t()  # ... x (G * out)


def build_signal(kind: str, in_dim: int, out_dim: int, rank: int, groups: int = 1) -> nn.Module:
    """A learned level signal of the given kind (``lowrank`` or ``full``)."""
    if kind == "lowrank":
        return LowRankSignal(in_dim, out_dim, rank, groups)
    if kind == "full":
        return FullRankSignal(in_dim, out_dim, groups)
    raise ValueError(f"{kind!r} is not a learned level signal kind (lowrank, full)")
