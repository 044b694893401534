"""Which fused kernel ``scaled_dot_product_attention`` may take on a GPU, for recurnmt's attention.

On Hopper GPUs (H100, H200) torch tries cuDNN's attention first for fp16 and bf16. cuDNN
builds an execution plan for every new problem shape (batch, heads, query and key lengths,
mask) the first time it meets it, and a plan costs milliseconds of host time, much more than
the call itself (``scripts/sdpa_first_call.py`` measures both; docs/gpu.md has the figures).
Where shapes repeat, the plans are built once and cached (``TORCH_CUDNN_V8_API_LRU_CACHE_LIMIT``
plans); where they keep changing, every call may pay one. Beam search is the extreme case: the
keys of the self-attention cache grow by one at every step and the batch shrinks as sentences
finish, so nearly every decoding step meets a shape never seen before. fairseq's own
incremental attention is not on SDPA and never pays this.

``RECURNMT_SDPA`` (an environment variable, read once at import; :func:`set_policy` in a
program) chooses, for recurnmt's attention calls only:

* ``no-cudnn`` (default): cuDNN's kernels are left out; flash attention or the memory-efficient
  kernel take the call (the math path where neither can), and they build nothing per shape.
  Measured on an H100 (fp16, docs/gpu.md): a new shape cost cuDNN 40-55 ms in decoding and
  120-145 ms in a training step against under 0.1 ms for flash and memory-efficient, and on
  shapes already seen flash and memory-efficient were as fast or faster (decoding 0.054 vs
  0.053-0.061 ms per call, cross-attention 0.095 vs 0.106-0.113, training 0.34 vs 0.57-0.70);
* ``torch``: torch's own choice (recurnmt changes nothing);
* ``no-cudnn-anywhere``: cuDNN's attention switched off for the whole process when the policy
  is set (at import, or by :func:`set_policy`; switched back on when another policy is set), so
  that every model's attention, fairseq's own ``transformer`` included, goes without it: for
  comparing fairseq's models with recurnmt's on equal terms, or a first epoch with and without
  cuDNN's plans (``RECURNMT_SDPA=no-cudnn-anywhere fairseq-train --user-dir user_dir ...``, or
  ``scripts/fairseq_speed.py --sdpa no-cudnn-anywhere``).

On a CPU, under ``torch.compile`` (whose generated code picks its own kernels) and where cuDNN's
attention is switched off already, both policies are torch's choice. Leaving cuDNN out is one
process-wide flag switched off around the call and back on after it, as torch's own
``sdpa_kernel`` does: another thread's attention call in that instant also goes without cuDNN,
which changes its kernel, not its result beyond rounding. fairseq's own models (its
``transformer``) keep torch's choice: their training pays cuDNN's plans once per batch shape,
mostly in the first epoch.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import Tensor

ENV = "RECURNMT_SDPA"
POLICIES = ("no-cudnn", "torch", "no-cudnn-anywhere")


def parse_policy(value: str | None) -> str:
    """``value`` as a policy name (None or empty: ``no-cudnn``); a bad one names the setting."""
    name = (value or "no-cudnn").strip().lower()
    if name not in POLICIES:
        raise ValueError(f"{ENV}={value!r}: one of {', '.join(POLICIES)}")
    return name


_policy = "no-cudnn"
_switched_off = False  # cuDNN's attention switched off process-wide by no-cudnn-anywhere


def get_policy() -> str:
    return _policy


def set_policy(name: str) -> str:
    """Sets the policy (one of :data:`POLICIES`); returns the previous one."""
    global _policy, _switched_off
    previous, _policy = _policy, parse_policy(name)
    anywhere = _policy == "no-cudnn-anywhere"
    if anywhere and not _switched_off and torch.backends.cuda.cudnn_sdp_enabled():
        torch.backends.cuda.enable_cudnn_sdp(False)
        _switched_off = True
    elif not anywhere and _switched_off:  # only what this module switched off
        torch.backends.cuda.enable_cudnn_sdp(True)
        _switched_off = False
    return previous


set_policy(os.environ.get(ENV))


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
) -> Tensor:
    """``torch.nn.functional.scaled_dot_product_attention`` under the policy (same arguments,
    same result up to the rounding of the kernel taken)."""
    leave_out = (
        q.is_cuda
        and _policy == "no-cudnn"
        and not torch.compiler.is_compiling()
        and torch.backends.cuda.cudnn_sdp_enabled()
    )
    if leave_out:
        torch.backends.cuda.enable_cudnn_sdp(False)
    try:
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal
        )
    finally:
        if leave_out:
            torch.backends.cuda.enable_cudnn_sdp(True)
