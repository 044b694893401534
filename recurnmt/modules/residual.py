"""Learnable residual coefficients (LRC), SReT eq. 9-10 and appendix I.

SReT replaces every residual ``z + f(z)`` by ``main * f(z) + skip * z`` with learnable scalars
initialised to 1, trained without constraints (SReT sec. 3, "Learnable Residual Connection").
Appendix I compares three designs, all available here:

* ``both``: coefficients on both branches (the paper's design, eq. 9-10);
* ``identity``: a coefficient on the identity (skip) branch only;
* ``main``: a coefficient on the main (attention / MLP) branch only;
* ``none``: the plain residual, with no parameters (exactly ``z + f(z)``).

The weighted sum runs as one fused autograd function (:func:`weighted_sum`): one
``addcmul`` forward, and a backward whose coefficient gradients are dot products. Left to
autograd, ``skip * a + main * b`` costs three passes over the activations forward and six
backward (two products and two reductions for the scalars), which made SReT's stacks, with a
coefficient pair on every residual, train measurably slower than plain ones.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.autograd.function import once_differentiable
from torch.fx import Proxy

from recurnmt.modules.config import LRC_MODES


def _dot(grad: Tensor, x: Tensor) -> Tensor:
    """``sum(grad * x)`` accumulated in fp32 at least (a scalar coefficient's gradient)."""
    if grad.dtype in (torch.float32, torch.float64) and x.dtype == grad.dtype:
        return torch.dot(grad.reshape(-1), x.reshape(-1))
    return torch.mul(grad, x).sum(dtype=torch.float32)


class _WeightedSum(torch.autograd.Function):
    """``skip_coef * skip + main_coef * main`` for same-shaped ``skip`` and ``main`` and
    0-dim coefficients (either may be None: weight 1)."""

    @staticmethod
    def forward(ctx, skip, main, skip_coef, main_coef):  # noqa: D102
        ctx.save_for_backward(
            skip if skip_coef is not None else None,
            main if main_coef is not None else None,
            skip_coef,
            main_coef,
        )
        scaled = main * main_coef if main_coef is not None else main
        if skip_coef is None:
            return scaled + skip
        return torch.addcmul(scaled, skip, skip_coef)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):  # noqa: D102
        skip, main, skip_coef, main_coef = ctx.saved_tensors
        need = ctx.needs_input_grad
        g_skip = g_main = g_skip_coef = g_main_coef = None
        if need[0]:
            g_skip = grad * skip_coef if skip_coef is not None else grad
        if need[1]:
            g_main = grad * main_coef if main_coef is not None else grad
        if need[2]:
            g_skip_coef = _dot(grad, skip).to(skip_coef.dtype)
        if need[3]:
            g_main_coef = _dot(grad, main).to(main_coef.dtype)
        return g_skip, g_main, g_skip_coef, g_main_coef


def weighted_sum(
    skip: Tensor, main: Tensor, skip_coef: Tensor | None, main_coef: Tensor | None
) -> Tensor:
    """``skip_coef * skip + main_coef * main`` (SReT eq. 9); a None coefficient is 1.

    The result has the activations' dtype (a 0-dim fp32 coefficient does not promote bf16
    activations, as in plain PyTorch arithmetic), the coefficients' gradients their own.
    """
    if skip_coef is None and main_coef is None:
        return skip + main
    grad = torch.is_grad_enabled()
    if not torch.jit.is_scripting():  # TorchScript compiles no autograd function
        if grad and skip.shape == main.shape and skip.dtype == main.dtype:
            return _WeightedSum.apply(skip, main, skip_coef, main_coef)
    if grad:  # broadcasting (or TorchScript): plain autograd
        if main_coef is not None:
            main = main_coef * main
        return (skip_coef * skip if skip_coef is not None else skip) + main
    # inference: the same two operations, without the autograd function's own cost (a
    # decoding step calls this three times a level)
    scaled = main * main_coef if main_coef is not None else main
    if skip_coef is None:
        return scaled + skip
    return torch.addcmul(scaled, skip, skip_coef)


torch.fx.wrap(
    "weighted_sum"
)  # one call in a torch.fx graph (timm's and torchvision's fx tools): its dtype and shape tests run with it


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
        self.num = num
        self.main = nn.Parameter(torch.ones(num)) if mode in ("both", "main") else None
        self.skip = nn.Parameter(torch.ones(num)) if mode in ("both", "identity") else None
        # inference: every coefficient as its own view, made once per storage (see _inference)
        self._views: tuple[object, list[Tensor | None], list[Tensor | None]] | None = None

    def forward(self, skip: Tensor, main: Tensor, index: int) -> Tensor:
        """``main_coef[index] * main + skip_coef[index] * skip`` (SReT eq. 9)."""
        if self.mode == "none":  # the plain residual of every other family's blocks
            return skip + main
        if torch.is_grad_enabled() or torch.compiler.is_compiling() or isinstance(main, Proxy):
            skip_coef = self.skip[index] if self.skip is not None else None
            main_coef = self.main[index] if self.main is not None else None
        else:
            skips, mains = self._inference()
            skip_coef, main_coef = skips[index], mains[index]
        return weighted_sum(skip, main, skip_coef, main_coef)

    def _inference(self) -> tuple[list[Tensor | None], list[Tensor | None]]:
        """The coefficients as 0-dim views, skip then main, without autograd: indexing a
        parameter dispatches a ``select`` at every call (four per level and decoding step
        in a block of two sub-layers). The views alias the parameters' storage, nothing is
        copied: they see every in-place write (``.data`` and fused optimizers included), and a
        new storage (``to``, ``half``, ``.data = ...``, ``vector_to_parameters``) has another
        address, since the views keep the old one alive, and makes new ones. Under
        ``torch.compile`` and torch.fx the parameters are indexed (an address is no graph
        input)."""
        skip, main = self.skip, self.main
        # spelled out: a decoding step asks four times a level (SReT), and a generator here
        # made 24 of the 417 Python calls of a level
        key = (
            None if skip is None else (skip.data_ptr(), skip.dtype, skip.device),
            None if main is None else (main.data_ptr(), main.dtype, main.device),
        )
        if self._views is None or self._views[0] != key:
            views = [
                [None] * self.num if p is None else list(p.detach().unbind(0)) for p in (skip, main)
            ]
            self._views = (key, *views)
        return self._views[1], self._views[2]
