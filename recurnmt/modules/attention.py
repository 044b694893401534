"""Multi-head attention on ``torch.nn.functional.scaled_dot_product_attention``.

Shape legend: B batch, T query length, S key length, C width, H heads, D = C / H head width.
Tensors are batch-first (B x T x C); keys and values are kept split by head (B x H x S x D),
which is also the layout of the incremental decoding cache (:mod:`recurnmt.modules.decoding.kv_cache`).

Self-attention computes Q, K and V with one fused projection. Everything a level or an
extension adds to one attention call arrives as one :class:`AttentionTerms` object, so this
module knows nothing of levels or papers:

* RingFormer's level signals (RingFormer eq. 6) are additive terms on Q, K and V, after the
  projection (``qkv_delta``) or on the input of each projection (``qkv_input_delta``, Table 4
  "before attn");
* a relaxed level's own low-rank terms on the projections (Relaxed Recursive Transformers
  eq. 3): on Q, K and V through ``qkv_delta`` (the same equation as RingFormer's), on a
  cross-attention's query (``q_delta``) and on the output projection (``out_delta``, a
  function of the attention output, applied where the projection is);
* an additive term on the logits (``bias``; DVT eq. 9, relationship reuse);
* probes, which receive the attention logits (DVT's relationship reuse reads them, fairseq's
  alignment output and the analysis recorder turn them into probabilities);
* sliced group attention (``slicing``; SReT sec. 4).

Attention logits and probabilities are computed in one place, :func:`attention_logits`; the
fast path (no probe) never materialises them and lets SDPA pick a fused kernel. Masks reach
SDPA in the forms its flash and memory-efficient kernels take: full causal attention as
``is_causal`` (no mask), causal queries on top of a cache as the lower-right causal bias
(on CUDA; on a CPU a boolean band, cheaper there: :func:`causal_lower_right`), padding as a
boolean key mask broadcast over queries (B x 1 x 1 x S), and a T x S mask only where a decoder target has padding between real tokens. The logit ``bias`` is an additive
float mask, which the memory-efficient kernel takes.

Cross-attention splits the work in two: :meth:`CrossAttention.project_memory` turns the encoder
output into keys and values once, and :meth:`CrossAttention.forward` consumes them. A decoder
whose cross-attention is shared across levels therefore projects the memory once per sentence.
In beam search the hypotheses of one sentence read the same memory: a memory projected with
``group=g`` holds one row per sentence, and the g consecutive query rows of each sentence
attend to it as g x T queries of one row (fairseq's "beamable" encoder-decoder attention,
which its BART enables through ``set_beam_size``), so the memory is projected, kept and read
once per sentence instead of once per hypothesis. Every query's attention is the same as with
the memory repeated for every row.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from recurnmt.modules import sdpa
from recurnmt.modules.decoding.kv_cache import KVCache
from recurnmt.modules.sliced_attention import SlicedGroups


def causal_lower_right(t: int, s: int, device: torch.device):
    """The causal mask of ``t`` new queries on top of ``s`` keys (the last ``t`` of them),
    lower-right aligned. On a GPU torch's lower-right causal bias, which its fused kernels
    apply without a T x S mask; imported at the first call: ``torch.nn.attention.bias`` imports
    ``torch._dynamo``, about a second of every command's start-up, and only several queries on
    a cache (speculative verification) make one (:func:`recurnmt.modules.sdpa.is_causal_bias`
    reads it back). Elsewhere a boolean T x S mask, made once for the levels of a pass that
    share t and s: the bias reaches SDPA through a tensor subclass's Python dispatch, which on
    a CPU costs several times the attention call it masks (one thread, 4 heads of 32, T = 4,
    S = 20: 75 microseconds a call with the bias, 18 with a boolean mask made before)."""
    if device.type == "cuda":
        from torch.nn.attention.bias import causal_lower_right as bias

        return bias(t, s)
    return _lower_right_mask(t, s, device, torch.is_inference_mode_enabled())


@functools.lru_cache(maxsize=8)
def _lower_right_mask(t: int, s: int, device: torch.device, inference: bool) -> Tensor:
    # attention_mask's causal band, kept; ``inference``: a mask made under inference_mode is
    # an inference tensor, which autograd outside it refuses, so each mode has its own;
    # nothing here derives from weights
    return attention_mask(None, True, t, s, device)


Probe = Callable[[Tensor], None]
# the weight and bias a level runs in place of one of its shared block's linears: the block's
# own with the level's signals or LoRA folded in, made when a decoding session starts
# (:mod:`recurnmt.modules.decoding.session`)
LinearReplacement = tuple[Tensor, Tensor | None]


class MemoryKV(NamedTuple):
    """The projected encoder memory one cross-attention reads.

    Attributes:
        k: keys, B x H x S x D.
        v: values, B x H x S x D.
        padding_mask: B x S, True at memory padding (None: no padding).
        group: query rows per memory row: the queries are ``group`` consecutive rows (the
            hypotheses of one sentence in beam search) for each of the B memory rows.
        attn_mask: the padding as the additive mask SDPA's kernels take as it is, B x 1 x 1 x
            S, 0 at real keys and ``-inf`` at padding, in the keys' dtype; made once with the
            keys (:meth:`CrossAttention.project_memory`) instead of a boolean mask negated
            and converted at every level and step (None: made from ``padding_mask`` there).
        rows: the query rows that run (indices into the B x group rows; None: all): rows that
            exited a decoding step early (:mod:`recurnmt.modules.decoding.exits`) ask nothing,
            and the queries of those that run are attended at their places in the batch, so
            that the memory is read as it is, never gathered row by row.
    """

    k: Tensor
    v: Tensor
    padding_mask: Tensor | None = None
    group: int = 1
    attn_mask: Tensor | None = None
    rows: Tensor | None = None


@dataclass(frozen=True, eq=False)  # holds tensors: compare by identity
class AttentionTerms:
    """What a level and its extensions add to one attention call; ``a + b`` combines two.

    Attributes:
        qkv_delta: added after the Q/K/V projections, B x T x 3C (RingFormer eq. 6; a relaxed
            level's LoRA on them, Relaxed Recursive Transformers eq. 3).
        qkv_input_delta: added to the input of each projection, B x T x 3 x C (RingFormer
            Table 4 "before attn"): Q = W_Q (x + g_Q(x)) and so on.
        qkv_linear: the weight and bias used in place of the fused Q/K/V projection's own
            (:data:`LinearReplacement`): a level's signals or LoRA folded into them for a
            decoding session (:mod:`recurnmt.modules.decoding.session`).
        q_delta: added after a cross-attention's query projection, B x T x C (a relaxed
            level's LoRA on W_Q; self-attention takes its Q term in ``qkv_delta``).
        q_linear: in place of a cross-attention's query projection, as ``qkv_linear``.
        out_delta: called with the attention output before the output projection (B x T x C,
            heads merged); what it returns is added to the projection's output (a relaxed
            level's LoRA on W_O).
        out_linear: in place of the output projection, as ``qkv_linear``.
        bias: float, broadcastable to B x H x T x S, added to the logits (DVT eq. 9).
        probes: called with the logits (B x H x T x S, ``QK^T / sqrt(D)`` plus ``bias``,
            ``-inf`` where masked); their presence makes the call compute attention
            explicitly instead of through SDPA.
        slicing: sliced group self-attention (SReT sec. 4); None is global attention.
    """

    qkv_delta: Tensor | None = None
    qkv_input_delta: Tensor | None = None
    qkv_linear: LinearReplacement | None = None
    q_delta: Tensor | None = None
    q_linear: LinearReplacement | None = None
    out_delta: Callable[[Tensor], Tensor] | None = None
    out_linear: LinearReplacement | None = None
    bias: Tensor | None = None
    probes: tuple[Probe, ...] = ()
    slicing: SlicedGroups | None = None

    def __add__(self, other: AttentionTerms | None) -> AttentionTerms:
        if other is None:
            return self
        if self.slicing is not None and other.slicing is not None:
            raise ValueError("two sliced group settings for one attention call")
        return AttentionTerms(
            qkv_delta=_add(self.qkv_delta, other.qkv_delta),
            qkv_input_delta=_add(self.qkv_input_delta, other.qkv_input_delta),
            qkv_linear=_one_replacement("Q/K/V", self.qkv_linear, other.qkv_linear),
            q_delta=_add(self.q_delta, other.q_delta),
            q_linear=_one_replacement("query", self.q_linear, other.q_linear),
            out_delta=_add_functions(self.out_delta, other.out_delta),
            out_linear=_one_replacement("output", self.out_linear, other.out_linear),
            bias=_add(self.bias, other.bias),
            probes=self.probes + other.probes,
            slicing=self.slicing if self.slicing is not None else other.slicing,
        )


NO_TERMS = AttentionTerms()


def combine_terms(*terms: AttentionTerms | None) -> AttentionTerms | None:
    """The sum of the given terms, None when none is given."""
    out = None
    for t in terms:
        if t is not None:
            out = t if out is None else out + t
    return out


def _one_replacement(
    what: str, a: LinearReplacement | None, b: LinearReplacement | None
) -> LinearReplacement | None:
    if a is not None and b is not None:
        raise ValueError(f"two replacements of the {what} projection for one attention call")
    return a if a is not None else b


def _hooked(module: nn.Module) -> bool:
    """Whether a forward hook (or pre-hook) watches ``module``: it is then called, not
    bypassed."""
    return bool(module._forward_hooks or module._forward_pre_hooks)


def linear(x: Tensor, module: nn.Module, replacement: LinearReplacement | None) -> Tensor:
    """``module(x)`` (its hooks fire), or the linear map with ``replacement``'s weight and bias."""
    if replacement is None:
        return module(x)
    return F.linear(x, *replacement)


def _add(a: Tensor | None, b: Tensor | None) -> Tensor | None:
    if a is None:
        return b
    return a if b is None else a + b


def _add_functions(
    f: Callable[[Tensor], Tensor] | None, g: Callable[[Tensor], Tensor] | None
) -> Callable[[Tensor], Tensor] | None:
    if f is None or g is None:
        return f if g is None else g
    return lambda z: f(z) + g(z)


def _split_heads(x: Tensor, num_heads: int) -> Tensor:
    # B x T x C -> B x H x T x D
    b, t, c = x.shape
    return x.view(b, t, num_heads, c // num_heads).transpose(1, 2)


def _merge_heads(x: Tensor, group: int = 1) -> Tensor:
    # B x H x T x D -> B x T x C; grouped: B/g x H x gT x D -> B x T x C
    b, h, t, d = x.shape
    if group == 1:
        return x.transpose(1, 2).reshape(b, t, h * d)
    t //= group
    return x.view(b, h, group, t, d).permute(0, 2, 3, 1, 4).reshape(b * group, t, h * d)


def _group_rows(x: Tensor, group: int) -> Tensor:
    # B x H x T x X -> B/g x H x gT x X: the g rows of a group become one row's queries
    b, h, t, d = x.shape
    return x.view(b // group, group, h, t, d).transpose(1, 2).reshape(b // group, h, group * t, d)


def _ungroup_rows(x: Tensor, group: int) -> Tensor:
    # B/g x H x gT x X -> B x H x T x X
    b, h, t, d = x.shape
    t //= group
    return x.view(b, h, group, t, d).transpose(1, 2).reshape(b * group, h, t, d)


def attention_mask(
    key_padding_mask: Tensor | None,
    causal: bool,
    query_len: int,
    key_len: int,
    device: torch.device,
) -> Tensor | None:
    """Boolean mask (True = may attend) for SDPA, broadcastable to B x H x T x S.

    Queries are the last ``query_len`` positions of the ``key_len`` keys, which covers both the
    full causal pass and incremental steps on top of a cache. With causal and padding masks
    together (left-padded targets), a query may always attend to its own position so that no
    row is fully masked (that would give NaN); such rows belong to padding and are unused.
    """
    mask = None
    if key_padding_mask is not None:
        mask = ~key_padding_mask[:, None, None, :]  # B x 1 x 1 x S
    if causal:
        offset = key_len - query_len
        allowed = torch.ones(query_len, key_len, dtype=torch.bool, device=device).tril(offset)
        mask = allowed if mask is None else mask & allowed
    if causal and key_padding_mask is not None:
        diagonal = torch.zeros(query_len, key_len, dtype=torch.bool, device=device)
        diagonal.diagonal(key_len - query_len).fill_(True)
        mask = mask | diagonal
    return mask


def attention_logits(
    q: Tensor, k: Tensor, mask: Tensor | None = None, bias: Tensor | None = None
) -> Tensor:
    """``Q K^T / sqrt(D) + bias``, ``-inf`` where ``mask`` forbids (Vaswani et al. eq. 1).

    The one place where recurnmt materialises attention logits; their softmax over the last
    axis is the attention probability.

    Args:
        q: B x H x T x D.
        k: B x H x S x D.
        mask: boolean, True = may attend, broadcastable to B x H x T x S.
        bias: float, broadcastable to B x H x T x S.

    Returns:
        B x H x T x S, in float32 for half-precision inputs.
    """
    if q.dtype in (torch.float16, torch.bfloat16):
        # in float32, as SDPA's kernels and fairseq's attention compute logits and softmax: a
        # half-precision logit of 100 is 0.06 coarse, which moved decoding's logits by up to 1
        q, k = q.float(), k.float()
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))  # B x H x T x S
    if bias is not None:
        scores = scores + bias.to(scores.dtype)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores


torch.fx.wrap(
    "attention_logits"
)  # one call in a torch.fx graph (timm's and torchvision's fx tools): its dtype test runs with it


class _Attention(nn.Module):
    def __init__(self, embed_dim: int, num_heads: int, dropout: float, bias: bool) -> None:
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError(f"num_heads={num_heads} does not divide embed_dim={embed_dim}")
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.dropout = dropout
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        # analysis probes, called with the logits of every call (see AttentionRecorder)
        self.probes: list[Probe] = []

    def _probed(self, terms: AttentionTerms) -> bool:
        return bool(terms.probes or self.probes)

    def _project_out(self, z: Tensor, terms: AttentionTerms) -> Tensor:
        # z: B x T x C, heads merged; a relaxed level adds its own term on W_O
        out = linear(z, self.out_proj, terms.out_linear)
        return out if terms.out_delta is None else out + terms.out_delta(z)

    def _attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None,
        terms: AttentionTerms,
        is_causal: bool = False,
        group: int = 1,
        rows: Tensor | None = None,
    ) -> Tensor:
        # q: B x H x T x D, k/v: B/group x H x S x D -> B x T x C; ``rows``: q holds those
        # rows of the B (their keys' rows) alone, and the output is theirs
        p = self.dropout if self.training else 0.0
        probes = terms.probes + tuple(self.probes)
        if rows is not None:
            if probes:
                raise ValueError("attention probes read every row: not with rows that exit")
            full = q.new_zeros(k.size(0) * group, *q.shape[1:])
            q = full.index_copy_(0, rows, q)
        if group > 1:
            if terms.bias is not None or is_causal:
                raise ValueError("grouped queries take no logit bias and no causal mask")
            q = _group_rows(q, group)
        if not probes:
            if terms.bias is not None:
                bias = terms.bias.to(q.dtype)
                mask = bias if mask is None else bias.masked_fill(~mask, float("-inf"))
            out = sdpa.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=p, is_causal=is_causal
            )
            z = _merge_heads(out, group)
            return self._project_out(z if rows is None else z.index_select(0, rows), terms)
        if is_causal:
            mask = attention_mask(None, True, q.size(2), k.size(2), q.device)
        logits = attention_logits(q, k, mask, terms.bias)
        for probe in probes:
            probe(logits if group == 1 else _ungroup_rows(logits, group))
        probs = F.dropout(logits.softmax(-1), p) if p > 0 else logits.softmax(-1)
        return self._project_out(_merge_heads(probs.to(v.dtype) @ v, group), terms)


class SelfAttention(_Attention):
    """Multi-head self-attention (Vaswani et al. 2017, eq. 1) with an optional KV cache.

    Args:
        embed_dim: width C.
        num_heads: heads H; must divide C.
        dropout: dropout on the attention probabilities.
        bias: biases in the projections.
        causal: each query attends only to itself and earlier positions (decoders).
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        causal: bool = False,
    ) -> None:
        super().__init__(embed_dim, num_heads, dropout, bias)
        self.causal = causal
        self.qkv_proj = nn.Linear(embed_dim, 3 * embed_dim, bias=bias)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # Q, K and V are initialised as three separate C x C matrices would be.
        for w in self.qkv_proj.weight.chunk(3, dim=0):
            nn.init.xavier_uniform_(w, gain=1 / math.sqrt(2))
        nn.init.xavier_uniform_(self.out_proj.weight)
        for lin in (self.qkv_proj, self.out_proj):
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)

    def project(self, x: Tensor, terms: AttentionTerms = NO_TERMS) -> Tensor:
        """Q, K, V of ``x`` (B x T x C) as B x T x 3C, with the terms' level signals."""
        qkv = linear(x, self.qkv_proj, terms.qkv_linear)
        if terms.qkv_delta is not None:
            qkv = qkv + terms.qkv_delta
        if terms.qkv_input_delta is not None:
            c = self.embed_dim
            w = self.qkv_proj.weight.view(3, c, c)
            qkv = qkv + torch.einsum("btjc,jdc->btjd", terms.qkv_input_delta, w).flatten(2)
        return qkv

    def keys_values(self, x: Tensor, terms: AttentionTerms | None = None) -> Tensor:
        """The keys and values :meth:`forward` writes to a cache for ``x`` (B x T x C), as
        2 x B x H x T x D (state propagation: the levels an exited row skipped,
        :mod:`recurnmt.modules.decoding.exits`)."""
        terms = NO_TERMS if terms is None else terms
        weight_bias = terms.qkv_linear
        if weight_bias is None and type(self.qkv_proj) is nn.Linear and not _hooked(self.qkv_proj):
            weight_bias = (self.qkv_proj.weight, self.qkv_proj.bias)
        if weight_bias is None or terms.qkv_input_delta is not None:
            return self._heads(self.project(x, terms)).narrow(0, 1, 2)
        # the key and value rows of the fused projection alone: two thirds of its work
        c = self.embed_dim
        weight, bias = weight_bias
        kv = F.linear(
            x, weight.narrow(0, c, 2 * c), None if bias is None else bias.narrow(0, c, 2 * c)
        )
        if terms.qkv_delta is not None:
            kv = kv + terms.qkv_delta.narrow(-1, c, 2 * c)
        b, t, _ = kv.shape
        return kv.view(b, t, 2, self.num_heads, c // self.num_heads).permute(2, 0, 3, 1, 4)

    def _heads(self, qkv: Tensor) -> Tensor:
        """B x T x 3C as 3 x B x H x T x D: Q, K and V split by head with three operations (a
        view, a permutation, and the caller's unbind), and K and V reach the cache as one
        tensor."""
        b, t, c = qkv.shape
        return qkv.view(b, t, 3, self.num_heads, c // (3 * self.num_heads)).permute(2, 0, 3, 1, 4)

    def forward(
        self,
        x: Tensor,
        *,
        key_padding_mask: Tensor | None = None,
        terms: AttentionTerms | None = None,
        cache: KVCache | None = None,
    ) -> Tensor:
        """Self-attention over ``x`` (B x T x C), returns B x T x C.

        Args:
            key_padding_mask: B x S, True at padding keys.
            terms: what the level and its extensions add (:class:`AttentionTerms`).
            cache: incremental decoding state of this level; the new keys and values are
                appended to it and attention reads all of them.
        """
        terms = NO_TERMS if terms is None else terms
        heads = self._heads(self.project(x, terms))  # 3 x B x H x T x D
        q, k, v = heads.unbind(0)
        if terms.slicing is not None and terms.slicing.groups > 1:
            if self.causal or cache is not None or terms.bias is not None or self._probed(terms):
                raise ValueError(
                    "sliced group attention works on full, non-causal attention without "
                    "logit terms or probes (its logits are per slice, so they cannot be "
                    "recorded or biased as a T x T map)"
                )
            p = self.dropout if self.training else 0.0
            out = terms.slicing(q, k, v, key_padding_mask, p, self.training)
            return self._project_out(_merge_heads(out), terms)
        if cache is not None:
            k, v = cache.append_pair(heads.narrow(0, 1, 2))
            if cache.query_rows is not None:  # rows that run on after others exited
                return self._attend(q, k, v, None, terms, rows=cache.query_rows)
            if cache.key_mask is not None:
                # a static-shape cache: its whole buffer, the positions not yet written masked
                # (one query per step; modules/decoding/static_cache.py)
                return self._attend(q, k, v, cache.key_mask, terms)
        t, s = q.size(2), k.size(2)
        causal = self.causal and t > 1
        if causal and key_padding_mask is None and terms.bias is None:
            if t == s:
                # the common training case: SDPA's fused causal kernel, no mask tensor
                return self._attend(q, k, v, None, terms, is_causal=True)
            if not self._probed(terms):
                # several new queries on top of a cache: the lower-right causal band (torch's
                # bias on CUDA, which the fused kernels apply without a T x S mask)
                return self._attend(q, k, v, causal_lower_right(t, s, x.device), terms)
        mask = attention_mask(key_padding_mask, causal, t, s, x.device)
        return self._attend(q, k, v, mask, terms)


class CrossAttention(_Attention):
    """Multi-head attention from queries onto a fixed memory (the encoder output)."""

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        memory_dim: int | None = None,
        dropout: float = 0.0,
        bias: bool = True,
    ) -> None:
        super().__init__(embed_dim, num_heads, dropout, bias)
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.kv_proj = nn.Linear(memory_dim or embed_dim, 2 * embed_dim, bias=bias)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.xavier_uniform_(self.q_proj.weight, gain=1 / math.sqrt(2))
        for w in self.kv_proj.weight.chunk(2, dim=0):
            nn.init.xavier_uniform_(w, gain=1 / math.sqrt(2))
        nn.init.xavier_uniform_(self.out_proj.weight)
        for lin in (self.q_proj, self.kv_proj, self.out_proj):
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)

    def project_memory(
        self, memory: Tensor, padding_mask: Tensor | None = None, group: int = 1
    ) -> MemoryKV:
        """Keys and values of the memory (B x S x C_mem), each B x H x S x D.

        They are stored contiguous: they are read at every level and decoding step, and a
        head-split view would make every read that materialises logits (fairseq's alignment
        at the last level, probes) copy K^T and V first. ``group``: each memory row serves
        ``group`` consecutive query rows (see :class:`MemoryKV`).
        """
        if group < 1:
            raise ValueError(f"group={group}: a memory row serves at least one query row")
        k, v = self.kv_proj(memory).chunk(2, dim=-1)
        k, v = (_split_heads(t, self.num_heads).contiguous() for t in (k, v))
        return MemoryKV(k, v, padding_mask, group, additive_mask(padding_mask, k.dtype))

    def forward(
        self, x: Tensor, memory: MemoryKV, *, terms: AttentionTerms | None = None
    ) -> Tensor:
        """Attends ``x`` (B x T x C) to keys/values from :meth:`project_memory`.

        Args:
            terms: ``q_delta``, ``out_delta``, ``bias`` and ``probes`` apply to
                cross-attention (a probe gives fairseq's alignment output); a level's own
                term on the memory's keys and values is in ``memory``
                (:func:`add_to_memory`).
        """
        terms = NO_TERMS if terms is None else terms
        q = linear(x, self.q_proj, terms.q_linear)
        if terms.q_delta is not None:
            q = q + terms.q_delta
        q = _split_heads(q, self.num_heads)
        rows = memory.rows
        if rows is None and q.size(0) != memory.k.size(0) * memory.group:
            raise ValueError(
                f"{q.size(0)} query rows for a memory of {memory.k.size(0)} rows x group "
                f"{memory.group}"
            )
        pad, mask = memory.padding_mask, memory.attn_mask
        if mask is not None and terms.bias is None and not self._probed(terms):
            mask = mask if mask.dtype == q.dtype else mask.to(q.dtype)
        elif pad is not None:
            # B x 1 x 1 x S; a view, as indexing with ``:`` costs a slice each on torch 2.6
            mask = ~pad.view(pad.size(0), 1, 1, pad.size(1))
        return self._attend(q, memory.k, memory.v, mask, terms, group=memory.group, rows=rows)


# the memory-efficient SDPA kernel wants a mask whose rows start at multiples of this many
# elements; torch pads (copies) any other mask at every call (``preprocess_mask`` in ATen)
MASK_ALIGNMENT = 8


def additive_mask(padding_mask: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    """``padding_mask`` (B x S, True at padding) as B x 1 x 1 x S: 0 at real keys, ``-inf`` at
    padding; None for None. Its rows are laid out :data:`MASK_ALIGNMENT` elements apart (a view
    of a wider tensor), so that SDPA's memory-efficient kernel takes it without a copy."""
    if padding_mask is None:
        return None
    b, s = padding_mask.shape
    wide = -(-s // MASK_ALIGNMENT) * MASK_ALIGNMENT
    mask = torch.zeros(b, 1, 1, wide, dtype=dtype, device=padding_mask.device).narrow(3, 0, s)
    return mask.masked_fill_(padding_mask.view(b, 1, 1, s), float("-inf"))


def add_to_memory(kv: MemoryKV, delta: Tensor) -> MemoryKV:
    """``kv`` with ``delta`` added after the key and value projections.

    A relaxed level's LoRA on a shared cross-attention's K/V projection (Relaxed Recursive
    Transformers eq. 3) changes that level's keys and values: the block's projection is
    computed once and each relaxed level adds its own low-rank term.

    Args:
        kv: the block's projected memory (k, v: B x H x S x D).
        delta: B x S x 2C, the K terms then the V terms (as the fused projection's output).
    """
    h = kv.k.size(1)
    dk, dv = (_split_heads(t, h) for t in delta.chunk(2, dim=-1))  # B x H x S x D each
    # contiguous, as project_memory keeps them (they are read at every step)
    return kv._replace(k=(kv.k + dk).contiguous(), v=(kv.v + dv).contiguous())
