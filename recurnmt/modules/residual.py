"""Learnable residual coefficients (LRC), SReT eq. 9-10 and appendix I.

SReT replaces every residual ``z + f(z)`` by ``main * f(z) + skip * z`` with learnable scalars
initialised to 1, trained without constraints (SReT sec. 3, "Learnable Residual Connection").
Appendix I compares three designs, all available here:

* ``both``: coefficients on both branches (the paper's design, eq. 9-10);
* ``identity``: a coefficient on the identity (skip) branch only;
* ``main``: a coefficient on the main (attention / MLP) branch only;
* ``none``: the plain residual, with no parameters (exactly ``z + f(z)``).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from recurnmt.modules.config import LRC_MODES


class ResidualCoefficients(nn.Module):
    """The LRC scalars of ``num`` residual connections.

    Args:
        num: number of residual connections (sub-layers) that use these coefficients.
        mode: one of :data:`LRC_MODES`.
    """

    def __init__(self, num: int, mode: str = "both") -> None:
        super().__init__()
        if mode not in LRC_MODES:
            raise ValueError(f"unknown LRC mode {mode!r}; choose one of {', '.join(LRC_MODES)}")
        self.mode = mode
        self.main = nn.Parameter(torch.ones(num)) if mode in ("both", "main") else None
        self.skip = nn.Parameter(torch.ones(num)) if mode in ("both", "identity") else None

    def forward(self, skip: Tensor, main: Tensor, index: int) -> Tensor:
        """``main_coef[index] * main + skip_coef[index] * skip`` (SReT eq. 9)."""
        if self.main is not None:
            main = self.main[index] * main
        if self.skip is not None:
            skip = self.skip[index] * skip
        return skip + main
