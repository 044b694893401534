"""RingFormer's input-dependent level signals (RingFormer sec. 3.2, eq. 5-7).

A level signal is a level-specific linear map of the block input, g_i(x) = M_i x, with M_i
factored as M_i = A_i B_i^T (eq. 5), A_i, B_i in R^{d x r}, r << d. It is computed in rank
space, x -> x B_i (r values) -> (x B_i) A_i^T (d values), never by forming the d x d matrix.

Initialisation: one factor starts at zero so every signal is exactly zero at step 0 and the
model begins as a plain shared block (RingFormer sec. 3.2, following LoRA). The paper's prose
calls the zero-initialised A the "down-projection"; in eq. 5 A is the factor that maps rank
space back to width d, i.e. the up-projection, which is the one zeroed here (DESIGN.md), as in
the authors' code (``model_Ring.py``: ``lev_param_*_01``, zeros, maps rank space to width).

The paper does not say how the other factor, the down-projection B (width -> rank), starts;
it draws the initialisation "from LoRA" (Hu et al. 2021), whose text draws it from a random
Gaussian and whose code from Kaiming's uniform rule. ``down_init`` chooses:

* ``normal`` (default): N(0, ``down_std``^2) with ``down_std`` = 1e-6, as the RingFormer
  authors' code (``model_Ring.py`` for translation, ``vringformer.py`` for images:
  ``nn.init.normal_(lev_param_*_02, std=1e-6)``);
* ``kaiming``: LoRA's code, ``kaiming_uniform_(a=sqrt(5))`` (PyTorch's ``nn.Linear`` rule:
  uniform in +-1/sqrt(d)); recurnmt's only initialisation before this option existed.

Either way the signal is zero at step 0; the choice sets how fast the zero factor's gradient
(proportional to ``x B``) first grows.

Several signals of one level that read the same input (Q, K and V, eq. 6) are computed by
one module with ``groups`` > 1: a single down-projection to ``groups * r`` values, then one
batched up-projection per group.

For decoding a low-rank signal is folded into the weight of the projection it feeds
(:meth:`LowRankSignal.folded_weight`): a signal added after a projection W gives W x + A B^T x =
(W + A B^T) x, one on its input gives W (x + A B^T x) = (W + (W A) B^T) x, the same linear map
by associativity (eq. 5-7 unchanged), computed as one matrix product per level. The folded
weight is made when a decoding session starts and lives as long as it
(:mod:`recurnmt.modules.decoding.session`), so a decoding step runs a RingFormer level with the
operations of a plain shared block. On a GPU a beam-search step is bound by the host's dispatch
of small operations (docs/gpu.md): at base size on an H100 the fold took RingFormer's step from
264 to 221 kernels (fairseq's transformer: 291; ``scripts/profile_decoding.py``). Every other
pass (training, evaluation passes, scoring) keeps the rank-space products: nothing derived
from the weights is ever kept on the module.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

DOWN_INITS = ("normal", "kaiming")
AUTHORS_DOWN_STD = 1e-6  # RingFormer's code: nn.init.normal_(lev_param_*_02, std=1e-6)


class LowRankSignal(nn.Module):
    """``groups`` low-rank signals g(x) = (x B) A^T read from one input (RingFormer eq. 5).

    Args:
        in_dim: width of the input x.
        out_dim: width of each signal.
        rank: rank r of every signal.
        groups: number of signals; the output is ``... x (groups * out_dim)``, grouped
            contiguously (all of signal 0, then signal 1, ...), matching a fused projection.
        down_init: how the down factor B starts: ``normal`` (N(0, ``down_std``^2), the
            RingFormer authors' code) or ``kaiming`` (LoRA's code); see the module docstring.
        down_std: standard deviation of ``normal``.

    Raises:
        ValueError: an impossible rank, an unknown ``down_init`` or a negative ``down_std``.
    """

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        rank: int,
        groups: int = 1,
        *,
        down_init: str = "normal",
        down_std: float = AUTHORS_DOWN_STD,
    ) -> None:
        super().__init__()
        if rank <= 0 or rank > min(in_dim, out_dim):
            raise ValueError(f"signal rank={rank} must lie in 1..{min(in_dim, out_dim)}")
        if down_init not in DOWN_INITS:
            raise ValueError(f"down_init={down_init!r}; choose one of {', '.join(DOWN_INITS)}")
        if down_std < 0:
            raise ValueError(f"down_std={down_std} must be >= 0")
        self.groups, self.rank, self.out_dim = groups, rank, out_dim
        self.down = nn.Parameter(torch.empty(groups * rank, in_dim))  # B^T of every group
        self.up = nn.Parameter(torch.zeros(groups, out_dim, rank))  # A, zero-initialised
        if down_init == "normal":
            nn.init.normal_(self.down, std=down_std)
        else:
            nn.init.kaiming_uniform_(self.down, a=math.sqrt(5))

    def folded_weight(self, weight: Tensor, into_input: bool) -> Tensor:
        """``weight`` (``groups * out`` x in) with the signals folded in (module docstring).

        Args:
            weight: the projection's weight W, its rows grouped as the signals' outputs.
            into_input: the signal is added to the projection's input (W (I + A B^T), so
                the signal's width is W's input width), else to its output (W + A B^T).
        """
        g = self.groups
        w = weight.view(g, weight.size(0) // g, weight.size(1))  # G x out x in
        up = torch.bmm(w, self.up) if into_input else self.up  # G x out x r: W A or A
        return torch.baddbmm(w, up, self.down.view(g, self.rank, -1)).view_as(weight)

    def forward(self, x: Tensor) -> Tensor:
        # flattened to N x in: two plain matrix products (a 3-D matmul adds a view and a copy
        # of its own per product, a noticeable share of a decoding step's small operations)
        lead = x.shape[:-1]  # shapes joined, not unpacked: torch.fx traces this too
        z = x.reshape(-1, x.size(-1)) @ self.down.t()  # N x (G * r)
        if self.groups == 1:
            return (z @ self.up[0].t()).view(lead + (self.out_dim,))  # ... x out
        # one batched product over the groups (a third faster than the equivalent einsum at a
        # decoding step, where these small products are a noticeable share of the level)
        z = z.view(-1, self.groups, self.rank).transpose(0, 1)  # G x N x r
        out = torch.bmm(z, self.up.transpose(1, 2))  # G x N x out
        return out.transpose(0, 1).reshape(lead + (self.groups * self.out_dim,))


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


def build_signal(
    kind: str,
    in_dim: int,
    out_dim: int,
    rank: int,
    groups: int = 1,
    *,
    down_init: str = "normal",
    down_std: float = AUTHORS_DOWN_STD,
) -> nn.Module:
    """A learned level signal of the given kind (``lowrank`` or ``full``); ``down_init`` and
    ``down_std`` start a low-rank signal's down factor (a full-rank one starts at zero)."""
    if kind == "lowrank":
        return LowRankSignal(in_dim, out_dim, rank, groups, down_init=down_init, down_std=down_std)
    if kind == "full":
        return FullRankSignal(in_dim, out_dim, groups)
    raise ValueError(f"{kind!r} is not a learned level signal kind (lowrank, full)")
