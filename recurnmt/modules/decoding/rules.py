"""How a decoding step's logits become the distribution a token is chosen from.

:class:`TokenRule` is one rule for every loop of the package: a front end's adjustment of the
log-probabilities (fairseq's forbidden pad, unk penalty and suppressed tokens; both front
ends' minimum and maximum lengths, :func:`limit_lengths`), the temperature, top-k and top-p.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor


def limit_lengths(lprobs: Tensor, step: int, min_len: int, max_len: int, eos: int) -> None:
    """End of sentence forbidden before output position ``min_len`` and the only choice from
    ``max_len`` on, in place, on B x T x V ``lprobs`` for the steps ``step`` ..
    ``step + T - 1`` (fairseq's ``SequenceGenerator``: eos keeps its own score at the
    maximum length). Views and ``fill_``, no indexing with a Python number (which makes a
    host tensor)."""
    early = min(min_len - step, lprobs.size(1))  # positions before the minimum length
    if early > 0:
        lprobs.narrow(1, 0, early).select(-1, eos).fill_(-math.inf)
    last = max(max_len - step, 0)  # positions from the maximum length on
    if last < lprobs.size(1):
        forced = lprobs.narrow(1, last, lprobs.size(1) - last)
        forced.narrow(-1, 0, eos).fill_(-math.inf)
        forced.narrow(-1, eos + 1, forced.size(-1) - eos - 1).fill_(-math.inf)


@dataclass
class TokenRule:
    """How the log-probabilities at a step become the distribution a token is chosen from.

    Attributes:
        adjust: ``adjust(lprobs, step)`` changes B x T x V log-probabilities in place for
            the steps ``step`` .. ``step + T - 1`` (fairseq: pad never, unk penalty, eos
            forbidden before the minimum length and forced at the maximum).
        sampling: sample instead of the argmax.
        temperature: divides the logits (sampling and greedy alike, as fairseq does).
        topk: sample among the k most likely (0: all).
        topp: sample among the smallest set whose probability exceeds p (0: all).
        steady: the steps at which ``adjust`` does the same at every step (fairseq: from the
            minimum length to before the maximum one), where it is an added :meth:`bias`;
            None: none known (every step adjusted by ``adjust``).
    """

    adjust: Callable[[Tensor, int], None] | None = None
    sampling: bool = False
    temperature: float = 1.0
    topk: int = 0
    topp: float = 0.0
    steady: range | None = None

    def steady_over(self, step: int, count: int) -> bool:
        """Whether steps ``step`` .. ``step + count - 1`` are all adjusted alike."""
        if self.adjust is None:
            return True
        return self.steady is not None and self.steady.start <= step <= self.steady.stop - count

    def bias(self, vocab: int, device: torch.device | str) -> Tensor:
        """What ``adjust`` does at a steady step, as a term added to the scores (V, float32):
        0, -inf where a token is forbidden (pad), minus the unk penalty at unk. Adding it
        gives exactly what ``adjust`` writes there (x + -inf = -inf; x + -p = x - p)."""
        bias = torch.zeros(1, 1, vocab, device=device)
        if self.adjust is not None:
            if self.steady is None or not len(self.steady):
                raise ValueError("the token rule has no steady step to take its bias from")
            self.adjust(bias, self.steady.start)
        return bias.view(vocab)

    def lprobs(self, logits: Tensor, step: int) -> Tensor:
        """Adjusted log-probabilities (float32), B x T x V, for steps ``step`` onwards (a NaN
        as -inf, as fairseq reads it)."""
        scores = scaled(logits, self.temperature)
        lprobs = torch.log_softmax(scores, dim=-1)
        if self.adjust is not None:
            self.adjust(lprobs, step)  # which reads a NaN as -inf too
        else:
            lprobs.masked_fill_(lprobs.isnan(), -math.inf)
        return lprobs

    def argmax(self, logits: Tensor, step: int) -> Tensor:
        """The greedy choice, B x T: the argmax of :meth:`lprobs`, taken on the adjusted
        logits (a log-softmax moves every logit of a position by one constant)."""
        scores = scaled(logits, self.temperature)
        if self.adjust is not None:
            self.adjust(scores, step)
        return scores.argmax(-1)

    def probs(self, lprobs: Tensor) -> Tensor:
        """The sampling distribution: exp(lprobs) restricted to top-k / top-p, normalised."""
        probs = lprobs.exp()
        if self.topk > 0:
            kth = probs.topk(min(self.topk, probs.size(-1)), dim=-1).values[..., -1:]
            probs = probs.masked_fill(probs < kth, 0.0)
        if self.topp > 0:
            sorted_probs, order = probs.sort(dim=-1, descending=True)
            before = sorted_probs.cumsum(-1) - sorted_probs  # mass of the tokens before each
            keep = before < self.topp
            probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs * keep)
        return probs / probs.sum(-1, keepdim=True)


def scaled(logits: Tensor, temperature: float) -> Tensor:
    """Logits as float32, divided by the temperature (fairseq's, greedy and sampling alike)."""
    scores = logits.float()
    return scores / temperature if temperature != 1.0 else scores
