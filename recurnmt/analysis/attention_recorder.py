"""Self-attention probabilities of our stacks, recorded for analysis only.

:class:`~recurnmt.modules.attention.SelfAttention` runs on
``torch.nn.functional.scaled_dot_product_attention``, which never materialises the
attention probabilities. While an :class:`AttentionRecorder` is open, it adds a probe to the
self-attention modules of a model; a module with a probe computes its attention explicitly
through :func:`~recurnmt.modules.attention.attention_logits`, the one place where logits are
formed, and hands them to the probe, whose softmax is the recorded probability. Whatever a
call receives (level signals, padding and causal masks, a logit bias, a cache) is therefore
reflected in what is recorded. Closing the recorder removes the probes and restores SDPA.

A weight-shared stack calls one attention module at several levels, so the probe cannot tell
the level from the module; it counts calls instead: the k-th recorded call of a forward pass
is the k-th level the stack ran (``RecurrentStack`` runs its levels in order, one
self-attention call each).

Shape legend: B batch, H heads, T query length, S key length.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor, nn

from recurnmt.modules.attention import SelfAttention

ProbsFn = Callable[[int, Tensor], None]


class AttentionRecorder:
    """Records the self-attention probabilities of every level of ``module`` (a context manager).

    Args:
        module: a stack, encoder, decoder or whole model; every
            :class:`~recurnmt.modules.attention.SelfAttention` inside it is probed.
        on_probs: called as ``on_probs(call_index, probs)`` for every call (probs
            B x H x T x S, detached); by default the probabilities are kept in :attr:`probs`.
            Pass a reducer to keep memory flat over many batches.

    Sliced group attention (SReT) attends within groups only; a probed module refuses it.

    Example::

        with AttentionRecorder(model.stack) as rec:
            model(images)
        level_3 = rec.probs[3]  # B x H x T x T

    Call :meth:`reset` between forward passes (the call index restarts at 0).
    """

    def __init__(self, module: nn.Module, on_probs: ProbsFn | None = None) -> None:
        self.module = module
        self.on_probs = on_probs
        self.probs: list[Tensor] = []
        self.calls = 0
        self._probed: list[SelfAttention] = []

    def __enter__(self) -> AttentionRecorder:
        attns = [m for m in self.module.modules() if isinstance(m, SelfAttention)]
        if not attns:
            raise ValueError(f"{type(self.module).__name__} has no SelfAttention to record")
        for m in attns:
            m.probes.append(self._probe)
            self._probed.append(m)
        return self

    def __exit__(self, *exc: Any) -> None:
        for m in self._probed:
            m.probes.remove(self._probe)
        self._probed.clear()

    def reset(self) -> None:
        """Forgets the recorded calls; the next call is call 0 again."""
        self.probs.clear()
        self.calls = 0

    def _probe(self, logits: Tensor) -> None:
        probs = logits.detach().softmax(dim=-1)  # B x H x T x S
        if self.on_probs is None:
            self.probs.append(probs)
        else:
            self.on_probs(self.calls, probs)
        self.calls += 1
