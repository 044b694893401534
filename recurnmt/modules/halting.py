"""Adaptive Computation Time halting for Universal Transformers.

Graves (2016), "Adaptive Computation Time for Recurrent Neural Networks", sec. 2, as used by
Dehghani et al. (2019), "Universal Transformers", sec. 2.2: every position decides, level by
level, whether to halt. At level t a shared halting unit gives p_t = sigmoid(w . s_t + b);
a position halts at the first level N where sum_{t<=N} p_t exceeds 1 - eps (eps = 0.01),
and its output is the mixture sum_t w_t y_t with w_t = p_t before N and the remainder
R = 1 - sum_{t<N} p_t at N. A position that reaches the last level halts there (Graves
eq. 5, N <= max levels). The ponder cost N + R (Graves eq. 11) is added to the loss.

As in the Universal Transformer code (the ``authors`` rule, the default), halted positions
keep being transformed (their states still serve as keys and values for positions that run
on), but their output no longer changes. The output is accumulated as
y <- w_t * s_t + (1 - w_t) * y. The ``paper`` rule (UT sec. 2.2: a halted symbol's state "is
simply copied to the next step") freezes a halted position instead and skips its work; the
bookkeeping here is the same for both, :mod:`recurnmt.modules.act_rule` runs the levels.

Precision: the halting unit, the cumulative halting probability, the remainders, the update
counts and the output mixture are computed in float32 whatever the model's dtype, and the
output is cast back to it. In bfloat16 (8 significant bits) the numbers between 0.5 and 1 lie
2^-8 = 0.0039 apart, so positions would halt at other levels than in float32: the threshold
0.99 itself rounds to 0.988; a cumulative probability near 0.99 stops growing when the next
p is below 0.002 (the sum rounds back) and the position runs on to the last level; three
levels of p = 0.3294 sum to 0.988 but to 0.992 in bf16, which halts a level early. The
remainder R = 1 - sum p would carry an error of up to 0.002 into every output mixture. In
float16 (11 bits) the same happens with p below 0.00024. The cost is a few B x T vectors and
one B x T x C output in float32; ``tests/test_nmt_precision.py`` holds both cases.
"""

from __future__ import annotations

import contextlib

import torch
from torch import Tensor, nn


class HaltingUnit(nn.Module):
    """The halting probability p_t = sigmoid(w . s_t + b) (Graves 2016 eq. 3).

    Args:
        embed_dim: width of the state s_t.
        bias_init: initial b; 1.0 as in the Universal Transformer, so positions start by
            pondering over a few levels.
        threshold: 1 - eps, the halting threshold (0.99 as in the Universal Transformer).
        rule: ``authors`` (halted positions are still transformed) or ``paper`` (they are
            frozen and skip the work), :mod:`recurnmt.modules.act_rule`.
    """

    def __init__(
        self,
        embed_dim: int,
        bias_init: float = 1.0,
        threshold: float = 0.99,
        rule: str = "authors",
    ) -> None:
        super().__init__()
        if not 0.0 < threshold <= 1.0:
            raise ValueError(f"act_threshold={threshold} must lie in (0, 1]")
        if rule not in ("authors", "paper"):
            raise ValueError(f"act_rule={rule!r}: choose authors or paper")
        self.threshold = threshold
        self.rule = rule
        self.proj = nn.Linear(embed_dim, 1)
        nn.init.constant_(self.proj.bias, bias_init)

    def forward(self, state: Tensor, params: tuple[Tensor, Tensor] | None = None) -> Tensor:
        """p_t (B x T) in float32 for a state of any dtype (see the module docstring);
        ``params``: w and b as :meth:`float_params` gives them, made once by a decoding
        session (:mod:`recurnmt.modules.decoding.session`), else here."""
        device = state.device.type
        # autocast would pick bf16; entering it only where it is on saves a decoding step's time
        off = torch.autocast(device, enabled=False) if torch.is_autocast_enabled(device) else None
        with off or contextlib.nullcontext():
            params = params or self.float_params()
            if params is None:  # not a plain linear (quantized): it takes the float32 state
                logit = self.proj(state.float())
            else:
                logit = nn.functional.linear(state.float(), *params)
        return torch.sigmoid(logit).squeeze(-1)

    def float_params(self) -> tuple[Tensor, Tensor] | None:
        """w and b in float32: a half-precision model's cast (differentiably; a decoding
        session casts once, at its first step), a float32 model's as they are; None where the
        projection is not a plain ``nn.Linear`` (dynamic quantisation replaces it by one that
        computes from the float32 state itself)."""
        proj = self.proj
        if type(proj) is not nn.Linear:
            return None
        weight, bias = proj.weight, proj.bias
        if weight.dtype == torch.float32 and bias.dtype == torch.float32:
            return weight, bias
        return weight.float(), bias.float()


class HaltingAccumulator:
    """Per-position ACT bookkeeping over the levels of one forward pass.

    All bookkeeping is float32 (see the module docstring); :attr:`output` has the dtype of
    ``like``. A decoding step runs this at every level, and on a GPU such a step is bound by
    the host's dispatch of its small operations, so the weights take five operations a level:
    a halted position's cumulative probability is set to 1, after which the same rule that
    halts a position gives it weight 0 at every later level (1 + p exceeds the threshold), and
    no running mask is needed. The ponder cost N + R (training and scoring) keeps the running
    mask, the update counts and the remainders besides, three operations more; incremental
    decoding asks for no ponder cost and skips them.

    Args:
        like: the state tensor (B x T x C), for shapes, device and dtype.
        threshold: 1 - eps.
        ponder: keep what :attr:`ponder_cost` needs.
    """

    def __init__(self, like: Tensor, threshold: float = 0.99, ponder: bool = True) -> None:
        shape = like.shape[:-1]
        self.threshold = threshold
        self.dtype = like.dtype
        fp32 = {"dtype": torch.float32, "device": like.device}
        # sum_{t<=l} p_t while the position runs, 1 once it has halted
        self.halting_prob = torch.zeros(shape, **fp32)
        self._output = torch.zeros(like.shape, **fp32)
        self.finished = False  # the last level has run
        self.ponder = ponder
        if ponder:
            self.n_updates = torch.zeros(shape, **fp32)
            self.running = torch.ones(shape, **fp32)  # 1.0 while the position runs
            self._remainders = torch.zeros(shape, **fp32)

    def weights(self, p: Tensor, last: bool) -> Tensor:
        """Updates the bookkeeping with this level's p (B x T); returns the mixing weights
        (float32): p for a position that runs on, its remainder R = 1 - sum_{t<N} p_t at the
        level N where it halts (Graves eq. 5-6), 0 after."""
        p = p.float()
        before = self.halting_prob
        if last:  # every position still running halts at the last level
            weights = 1.0 - before  # 0 where it halted before (its sum is 1)
            halts = None
            self.finished = True
        else:
            total = before + p
            # an explicit test: sum p + R may round to just below 1; a position that halted
            # before has 1 + p > threshold and takes weight 1 - 1 = 0 again
            halts = total > self.threshold
            weights = torch.where(halts, 1.0 - before, p)
            self.halting_prob = total.masked_fill(halts, 1.0)
        if self.ponder:
            running = self.running
            halted = running if halts is None else halts * running  # halting at this level
            self.n_updates = self.n_updates + running
            self._remainders = torch.addcmul(self._remainders, halted, weights)  # R = w here
            self.running = running - halted
        return weights

    def accumulate(self, state: Tensor, weights: Tensor) -> None:
        """y <- w * s + (1 - w) * y (the module docstring), in float32."""
        self._output = torch.lerp(self._output, state.float(), weights.unsqueeze(-1))

    @property
    def output(self) -> Tensor:
        """The mixture sum_t w_t y_t (B x T x C) in the dtype of the states."""
        return self._output.to(self.dtype)

    @property
    def remainders(self) -> Tensor:
        """R = 1 - sum_{t<N} p_t per position (B x T, float32): the weight each position took
        at its halting level; 0 for a position that has not halted yet."""
        self._need_ponder("remainders")
        return self._remainders

    def halted(self) -> Tensor:
        """True (B x T) where a position has halted: its weights are spent (sum p + R = 1) and
        its :attr:`output` no longer changes."""
        return self.halting_prob >= 1.0

    def halt(self, mask: Tensor) -> None:
        """Positions ``mask`` (B x T) take no part from now on, with no weight and no ponder
        cost (padding under the paper rule, :mod:`recurnmt.modules.act_rule`)."""
        self.halting_prob = self.halting_prob.masked_fill(mask, 1.0)
        if self.ponder:
            self.running = self.running.masked_fill(mask, 0.0)

    def select(self, rows: Tensor) -> HaltingAccumulator:
        """The bookkeeping of the batch rows ``rows`` alone (rows that run on in a decoding
        step, :func:`recurnmt.modules.decoding.exits.run_halting`)."""
        picked = object.__new__(HaltingAccumulator)
        picked.__dict__.update(
            {
                key: value.index_select(0, rows) if isinstance(value, Tensor) else value
                for key, value in self.__dict__.items()
            }
        )
        return picked

    def all_halted(self) -> bool:
        if self.finished:
            return True
        if self.ponder:
            return not bool(self.running.any())
        return bool((self.halting_prob >= 1.0).all())

    @property
    def ponder_cost(self) -> Tensor:
        """N + R per position (Graves 2016 eq. 11), B x T, float32."""
        self._need_ponder("ponder_cost")
        return self.n_updates + self._remainders

    def _need_ponder(self, what: str) -> None:
        if not self.ponder:
            raise RuntimeError(f"{what} needs HaltingAccumulator(..., ponder=True)")
