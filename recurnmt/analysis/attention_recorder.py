"""Self-attention probabilities of our stacks, recorded for analysis only.

:class:`~recurnmt.modules.attention.SelfAttention` runs on
``torch.nn.functional.scaled_dot_product_attention``, which never materialises the
attention probabilities. Rather than give the module a second code path,
:class:`AttentionRecorder` attaches forward hooks (with keyword arguments) to the
self-attention modules of a stack while it is open, and each hooked call recomputes
``softmax(Q K^T / sqrt(D) + mask)`` from the very inputs the call received: the same
projection (:meth:`SelfAttention.project`, with the level's RingFormer signals), the same
mask (:func:`~recurnmt.modules.attention.attention_mask`). The normal forward pass is
untouched, and costs nothing once the recorder is closed.

A weight-shared stack calls one attention module at several levels, so the hook cannot tell
the level from the module; it counts calls instead: the k-th recorded call of a forward pass
is the k-th level the stack ran (``RecurrentStack`` runs its levels in order, one
self-attention call each).

Shape legend: B batch, H heads, T query length, S key length, D head width.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from recurnmt.modules.attention import SelfAttention, _split_heads, attention_mask

ProbsFn = Callable[[int, Tensor], None]

# SelfAttention.forward keywords that the recomputation honours; others are refused, so a new
# keyword (say an attention bias) cannot silently make the recorded probabilities wrong
_KNOWN = {
    "key_padding_mask",
    "causal",
    "qkv_delta",
    "qkv_input_delta",
    "cache",
    "cache_key",
    "groups",
    "permute",
    "attn_bias",
    "logits_out",  # an output list; the recorder leaves it to the real call
}


def attention_probs(module: SelfAttention, x: Tensor, **kwargs: Any) -> Tensor:
    """The attention probabilities of ``module(x, **kwargs)``, B x H x T x S.

    Dropout is not applied (analysis runs in evaluation mode). Incremental decoding (``cache``)
    and sliced group attention (``groups > 1``) are refused.

    Raises:
        ValueError: a cache, sliced groups, or a keyword this recomputation does not know.
    """
    unknown = sorted(k for k, v in kwargs.items() if k not in _KNOWN and v is not None)
    if unknown:
        raise ValueError(f"cannot recompute attention probabilities with {unknown}")
    if kwargs.get("cache") is not None:
        raise ValueError("attention probabilities are recorded for full passes, not with a cache")
    if kwargs.get("groups", 1) > 1:
        raise ValueError(
            "sliced group attention (SReT) lets each token attend only within its group; "
            "recording it is not supported"
        )
    qkv = module.project(x, kwargs.get("qkv_delta"), kwargs.get("qkv_input_delta"))
    q, k, _ = (_split_heads(t, module.num_heads) for t in qkv.chunk(3, dim=-1))
    t, s = q.size(2), k.size(2)
    causal = bool(kwargs.get("causal", False))
    mask = attention_mask(kwargs.get("key_padding_mask"), causal and t > 1, t, s, x.device)
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))  # B x H x T x S
    if kwargs.get("attn_bias") is not None:  # additive logits (DVT relationship reuse)
        scores = scores + kwargs["attn_bias"].to(scores.dtype)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(dim=-1)


class AttentionRecorder:
    """Records the self-attention probabilities of every level of ``module`` (a context manager).

    Args:
        module: a stack, encoder, decoder or whole model; every
            :class:`~recurnmt.modules.attention.SelfAttention` inside it is hooked.
        on_probs: called as ``on_probs(call_index, probs)`` for every call (probs
            B x H x T x S, detached); by default the probabilities are kept in :attr:`probs`.
            Pass a reducer to keep memory flat over many batches.

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
        self._handles: list[Any] = []

    def __enter__(self) -> AttentionRecorder:
        attns = [m for m in self.module.modules() if isinstance(m, SelfAttention)]
        if not attns:
            raise ValueError(f"{type(self.module).__name__} has no SelfAttention to record")
        for m in attns:
            self._handles.append(m.register_forward_hook(self._hook, with_kwargs=True))
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def reset(self) -> None:
        """Forgets the recorded calls; the next call is call 0 again."""
        self.probs.clear()
        self.calls = 0

    def _hook(self, module: SelfAttention, args: tuple, kwargs: dict, output: Tensor) -> None:
        x = args[0] if args else kwargs["x"]
        rest = {k: v for k, v in kwargs.items() if k != "x"}
        with torch.no_grad():
            probs = attention_probs(module, x, **rest)
        if self.on_probs is None:
            self.probs.append(probs)
        else:
            self.on_probs(self.calls, probs)
        self.calls += 1
