"""Which fused kernel ``scaled_dot_product_attention`` takes for recurnmt's attention.

On Hopper and Blackwell GPUs torch 2.10 and later try cuDNN's attention first for fp16 and
bf16. cuDNN builds an execution plan for every new problem shape (batch, heads, query and key
lengths, mask) the first time it meets it, and a plan costs milliseconds of host time, much more
than the call itself (``scripts/sdpa_first_call.py`` measures both; docs/gpu.md has the
figures). Beam search is the extreme case: the keys of the self-attention cache grow by one at
every step and the batch shrinks as sentences finish, so nearly every step meets a new shape.
Flash attention and the memory-efficient kernel build nothing per shape, and on an H100 they
were as fast or faster on shapes already seen (docs/gpu.md).

What is chosen, and how to change it (``docs/gpu.md``, "Attention kernels"):

* **By default** recurnmt asks torch itself to put cuDNN's attention last in its priority
  order, with torch's own switch: ``TORCH_CUDNN_SDPA_DEPRIORITIZED=1`` (and
  ``TORCH_CUDNN_SDPA_PREFERRED=0``, the spelling of the releases before it), set in the
  environment when recurnmt is imported, unless the user set either. torch reads it once, at
  the process's first attention call on a GPU, for every model in the process (fairseq's
  ``transformer`` too: comparisons are on equal terms). cuDNN's attention stays enabled: a call
  that only cuDNN may take (``sdpa_kernel(SDPBackend.CUDNN_ATTENTION)``) takes it.
* ``RECURNMT_SDPA=torch`` (the environment, or :func:`set_policy` before the first GPU
  attention call) sets nothing: torch's own order. ``no-cudnn-anywhere``, a policy of earlier
  releases, is the default's old name.
* **An explicit choice of the user wins**: ``torch.nn.attention.sdpa_kernel([...])`` (the
  backends it enables, and with ``set_priority=True`` their order),
  ``torch.backends.cuda.enable_*_sdp``, the two environment variables. recurnmt never changes
  torch's backend flags or priority order, per call or otherwise, so there is nothing to race
  with in other threads (until 2026-11 it switched cuDNN's flag off around each call, which
  could disable every backend inside a user's ``sdpa_kernel([CUDNN_ATTENTION])``, and undo or
  leave switched another thread's choice).
* **A choice for one thread**: torch's ``sdpa_kernel`` and flags are process-wide, so two
  threads cannot run attention on different kernels with them. :func:`kernel` is a context
  variable (each thread and asyncio task its own) that recurnmt's attention honours by calling
  the chosen backend's own operator: the first of the given backends that takes the call.

``TORCH_CUDNN_SDPA_AVOID_RECOMPILE=1`` is torch's opt-in to reuse cuDNN's plans across sequence
lengths (calls without a mask or bias); recurnmt neither sets nor needs it. Under
``torch.compile`` the compiled code picks its kernels, and :func:`kernel` is not consulted.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import sys
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention import SDPBackend

logger = logging.getLogger(__name__)

ENV = "RECURNMT_SDPA"
POLICIES = ("no-cudnn", "torch", "no-cudnn-anywhere")
# torch's switches (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp): the first is read
# by torch 2.10 and later, the second by the releases that preferred cuDNN before it
TORCH_SWITCHES = {"TORCH_CUDNN_SDPA_DEPRIORITIZED": "1", "TORCH_CUDNN_SDPA_PREFERRED": "0"}


def parse_policy(value: str | None) -> str:
    """``value`` as a policy name (None or empty: ``no-cudnn``); a bad one names the setting."""
    name = (value or "no-cudnn").strip().lower()
    if name not in POLICIES:
        raise ValueError(f"{ENV}={value!r}: one of {', '.join(POLICIES)}")
    return "no-cudnn" if name == "no-cudnn-anywhere" else name


_policy = "no-cudnn"
_ours: set[str] = set()  # the switches recurnmt put in the environment (and may take back)


def get_policy() -> str:
    return _policy


def set_policy(name: str) -> str:
    """Sets the policy (one of :data:`POLICIES`) by putting torch's switches in the
    environment, or taking back the ones recurnmt put there; a switch the user set is never
    touched. torch reads them at the process's first attention call on a GPU: a later change
    has no effect. Returns the previous policy."""
    global _policy
    previous, _policy = _policy, parse_policy(name)
    users = [k for k in TORCH_SWITCHES if k in os.environ and k not in _ours]
    for key, value in TORCH_SWITCHES.items():
        if users:
            break
        if _policy == "no-cudnn":
            os.environ[key] = value
            _ours.add(key)
        elif key in _ours:
            del os.environ[key]
            _ours.discard(key)
    return previous


set_policy(os.environ.get(ENV))
if _policy == "no-cudnn" and _ours:
    _order = getattr(torch._C, "_get_sdp_priority_order", lambda: ())()
    if _order and _order[0] == int(SDPBackend.CUDNN_ATTENTION):
        logger.warning(
            "torch put cuDNN's attention first before recurnmt was imported (an attention "
            "call on the GPU came first): set TORCH_CUDNN_SDPA_DEPRIORITIZED=1 in the "
            "environment to leave it last (recurnmt/modules/sdpa.py)"
        )

# the backends the calling thread (or task) chose for recurnmt's attention (kernel())
_KERNELS: contextvars.ContextVar[tuple[SDPBackend, ...] | None] = contextvars.ContextVar(
    "recurnmt_sdpa_kernels", default=None
)


@contextlib.contextmanager
def kernel(*backends: SDPBackend) -> Iterator[None]:
    """Runs recurnmt's attention calls of this thread (or asyncio task) on the first of
    ``backends`` that takes each call, by that backend's own operator: no process-wide flag
    is read or changed, so other threads keep theirs. ``MATH`` takes every call; on a CPU
    ``FLASH_ATTENTION`` too; on CUDA flash, memory-efficient and cuDNN attention take what torch
    says they can (``torch.backends.cuda.can_use_*``).

    Raises:
        ValueError: no backend given, or a backend recurnmt cannot call by itself.
    """
    if not backends:
        raise ValueError("kernel(): name at least one SDPBackend")
    unknown = [b for b in backends if b not in _CALLERS]
    if unknown:
        raise ValueError(f"kernel(): {unknown} not one of {list(_CALLERS)}")
    token = _KERNELS.set(tuple(backends))
    try:
        yield
    finally:
        _KERNELS.reset(token)


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
) -> Tensor:
    """``torch.nn.functional.scaled_dot_product_attention`` (same arguments, same result up
    to the rounding of the kernel taken): torch's choice, or the calling thread's
    (:func:`kernel`); TorchScript compiles torch's choice only."""
    if not torch.jit.is_scripting():
        chosen = _KERNELS.get()
        if chosen is not None and not torch.compiler.is_compiling():
            return _chosen_kernel(chosen, q, k, v, attn_mask, dropout_p, is_causal)
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal
    )


def _chosen_kernel(chosen, q, k, v, attn_mask, dropout_p, is_causal) -> Tensor:
    """The first of the ``chosen`` kernels that takes the call."""
    for backend in chosen:
        out = _CALLERS[backend](q, k, v, attn_mask, dropout_p, is_causal)
        if out is not None:
            return out
    names = ", ".join(b.name for b in chosen)
    raise RuntimeError(f"none of the attention kernels chosen ({names}) takes this call")


def is_causal_bias(mask: object) -> bool:
    """Whether ``mask`` is torch's causal bias (a tensor subclass). Its module is imported only
    where one is made (:func:`recurnmt.modules.attention.causal_lower_right`, which keeps
    ``torch._dynamo`` out of the start-up): where it is not loaded, no mask can be one."""
    bias = sys.modules.get("torch.nn.attention.bias")
    return bias is not None and isinstance(mask, bias.CausalBias)


def _float_mask(mask: Tensor | None, q: Tensor, k: Tensor) -> Tensor | None:
    """``mask`` as an additive float mask in q's dtype (True keeps a key, as in torch)."""
    if mask is None:
        return None
    if is_causal_bias(mask):  # causal queries on top of a cache: the lower-right band
        t, s = q.size(-2), k.size(-2)
        mask = torch.ones(t, s, dtype=torch.bool, device=q.device).tril(s - t)
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill(
            ~mask, float("-inf")
        )
    return mask.to(q.dtype)


def _math(q, k, v, mask, dropout_p, is_causal) -> Tensor:
    return torch.ops.aten._scaled_dot_product_attention_math(
        q, k, v, _float_mask(mask, q, k), dropout_p, is_causal
    )[0]


def _flash(q, k, v, mask, dropout_p, is_causal) -> Tensor | None:
    if q.device.type == "cpu":
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, dropout_p, is_causal, attn_mask=_float_mask(mask, q, k)
        )[0]
    if not q.is_cuda or mask is not None or not _can_use("flash", q, k, v, None, dropout_p):
        return None
    return torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, dropout_p, is_causal)[0]


def _efficient(q, k, v, mask, dropout_p, is_causal) -> Tensor | None:
    bias = _aligned_bias(_float_mask(mask, q, k), q, k)
    if not q.is_cuda or not _can_use("efficient", q, k, v, bias, dropout_p):
        return None
    return torch.ops.aten._scaled_dot_product_efficient_attention(
        q, k, v, bias, _needs_grad(q, k, v), dropout_p, is_causal
    )[0]


def _cudnn(q, k, v, mask, dropout_p, is_causal) -> Tensor | None:
    bias = _float_mask(mask, q, k)
    bias = None if bias is None else bias.expand(q.size(0), q.size(1), q.size(2), k.size(2))
    if not q.is_cuda or not _can_use("cudnn", q, k, v, bias, dropout_p):
        return None
    return torch.ops.aten._scaled_dot_product_cudnn_attention(
        q, k, v, bias, _needs_grad(q, k, v), dropout_p, is_causal, False
    )[0]


def _needs_grad(*tensors: Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def _aligned_bias(bias: Tensor | None, q: Tensor, k: Tensor) -> Tensor | None:
    """B x H x T x S, its rows 16-element aligned, as the memory-efficient kernel reads them
    (what ``F.scaled_dot_product_attention`` prepares for it)."""
    if bias is None:
        return None
    b, h, t, s = q.size(0), q.size(1), q.size(2), k.size(2)
    padded = bias.new_empty(b, h, t, s + (-s) % 16)[..., :s]
    return padded.copy_(bias.expand(b, h, t, s))


def _can_use(which: str, q, k, v, mask, dropout_p) -> bool:
    params = torch.backends.cuda.SDPAParams(q, k, v, mask, dropout_p, False, False)
    return getattr(torch.backends.cuda, f"can_use_{which}_attention")(params, False)


_CALLERS = {
    SDPBackend.MATH: _math,
    SDPBackend.FLASH_ATTENTION: _flash,
    SDPBackend.EFFICIENT_ATTENTION: _efficient,
    SDPBackend.CUDNN_ATTENTION: _cudnn,
}
