"""Adaptive Computation Time halting for Universal Transformers.

Graves (2016), "Adaptive Computation Time for Recurrent Neural Networks", sec. 2, as used by
Dehghani et al. (2019), "Universal Transformers", sec. 2.2: every position decides, level by
level, whether to halt. At level t a shared halting unit gives p_t = sigmoid(w . s_t + b);
a position halts at the first level N where sum_{t<=N} p_t exceeds 1 - eps (eps = 0.01),
and its output is the mixture sum_t w_t y_t with w_t = p_t before N and the remainder
R = 1 - sum_{t<N} p_t at N. A position that reaches the last level halts there (Graves
eq. 5, N <= max levels). The ponder cost N + R (Graves eq. 11) is added to the loss.

As in the Universal Transformer code, halted positions keep being transformed (their
states still serve as keys and values for positions that run on), but their output no
longer changes. The output is accumulated as y <- w_t * s_t + (1 - w_t) * y.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class HaltingUnit(nn.Module):
    """The halting probability p_t = sigmoid(w . s_t + b) (Graves 2016 eq. 3).

    Args:
        embed_dim: width of the state s_t.
        bias_init: initial b; 1.0 as in the Universal Transformer, so positions start by
            pondering over a few levels.
        threshold: 1 - eps, the halting threshold (0.99 as in the Universal Transformer).
    """

    def __init__(self, embed_dim: int, bias_init: float = 1.0, threshold: float = 0.99) -> None:
        super().__init__()
        if not 0.0 < threshold <= 1.0:
            raise ValueError(f"act_threshold={threshold} must lie in (0, 1]")
        self.threshold = threshold
        self.proj = nn.Linear(embed_dim, 1)
        nn.init.constant_(self.proj.bias, bias_init)

    def forward(self, state: Tensor) -> Tensor:
        return torch.sigmoid(self.proj(state)).squeeze(-1)  # B x T


class HaltingAccumulator:
    """Per-position ACT bookkeeping over the levels of one forward pass.

    Args:
        like: the state tensor (B x T x C), for shapes, device and dtype.
        threshold: 1 - eps.
    """

    def __init__(self, like: Tensor, threshold: float = 0.99) -> None:
        shape = like.shape[:-1]
        self.threshold = threshold
        self.halting_prob = like.new_zeros(shape)
        self.remainders = like.new_zeros(shape)
        self.n_updates = like.new_zeros(shape)
        self.running = torch.ones(shape, dtype=torch.bool, device=like.device)
        self.output = torch.zeros_like(like)

    def weights(self, p: Tensor, last: bool) -> Tensor:
        """Updates the bookkeeping with this level's p (B x T); returns the mixing weights."""
        # an explicit mask: halting_prob + remainder may round to just below 1
        running = self.running.to(p)
        total = self.halting_prob + p * running
        if last:
            new_halted = running
            running = torch.zeros_like(running)
        else:
            new_halted = (total > self.threshold).to(p) * running
            running = (total <= self.threshold).to(p) * running
        self.halting_prob = self.halting_prob + p * running
        self.remainders = self.remainders + new_halted * (1.0 - self.halting_prob)
        self.halting_prob = self.halting_prob + new_halted * self.remainders
        self.n_updates = self.n_updates + running + new_halted
        self.running = running.bool()
        return p * running + new_halted * self.remainders

    def accumulate(self, state: Tensor, weights: Tensor) -> None:
        w = weights.unsqueeze(-1)
        self.output = state * w + self.output * (1.0 - w)

    def all_halted(self) -> bool:
        return not bool(self.running.any())

    @property
    def ponder_cost(self) -> Tensor:
        """N + R per position (Graves 2016 eq. 11), B x T."""
        return self.n_updates + self.remainders
