"""Multi-head attention on ``torch.nn.functional.scaled_dot_product_attention``.

Shape legend: B batch, T query length, S key length, C width, H heads, D = C / H head width.
Tensors are batch-first (B x T x C); keys and values are kept split by head (B x H x S x D),
which is also the layout of the incremental decoding cache.

Self-attention computes Q, K and V with one fused projection. RingFormer's level signals
(RingFormer eq. 6) are additive terms on Q, K and V: the caller passes them as ``qkv_delta``
(added after the projection) or ``qkv_input_delta`` (added to the input of each projection,
Table 4 "before attn"), so this module knows nothing of levels.

Cross-attention splits the work in two: :meth:`CrossAttention.project_memory` turns the encoder
output into keys and values once, and :meth:`CrossAttention.forward` consumes them. A decoder
whose cross-attention is shared across levels therefore projects the memory once per sentence.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from recurnmt.modules.sliced_attention import group_permutation, sliced_group_attention

KVCache = dict[str, Tensor]


def _split_heads(x: Tensor, num_heads: int) -> Tensor:
    # B x T x C -> B x H x T x D
    b, t, c = x.shape
    return x.view(b, t, num_heads, c // num_heads).transpose(1, 2)


def _merge_heads(x: Tensor) -> Tensor:
    # B x H x T x D -> B x T x C
    b, h, t, d = x.shape
    return x.transpose(1, 2).reshape(b, t, h * d)


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


class _Attention(nn.Module):
    def __init__(self, embed_dim: int, num_heads: int, dropout: float, bias: bool) -> None:
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError(f"num_heads={num_heads} does not divide embed_dim={embed_dim}")
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.dropout = dropout
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        # q: B x H x T x D, k/v: B x H x S x D -> B x T x C
        p = self.dropout if self.training else 0.0
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
        return self.out_proj(_merge_heads(out))


class SelfAttention(_Attention):
    """Multi-head self-attention (Vaswani et al. 2017, eq. 1) with an optional KV cache."""

    def __init__(
        self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True
    ) -> None:
        super().__init__(embed_dim, num_heads, dropout, bias)
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

    def project(
        self, x: Tensor, qkv_delta: Tensor | None = None, qkv_input_delta: Tensor | None = None
    ) -> Tensor:
        """Q, K, V as B x T x 3C, with optional additive level signals.

        Args:
            x: input, B x T x C.
            qkv_delta: added after the projections, B x T x 3C (RingFormer eq. 6).
            qkv_input_delta: added to the input of each projection, B x T x 3 x C
                (RingFormer Table 4 "before attn"): Q = W_Q (x + g_Q(x)) and so on.
        """
        qkv = self.qkv_proj(x)
        if qkv_delta is not None:
            qkv = qkv + qkv_delta
        if qkv_input_delta is not None:
            c = self.embed_dim
            w = self.qkv_proj.weight.view(3, c, c)
            qkv = qkv + torch.einsum("btjc,jdc->btjd", qkv_input_delta, w).flatten(2)
        return qkv

    def forward(
        self,
        x: Tensor,
        *,
        key_padding_mask: Tensor | None = None,
        causal: bool = False,
        qkv_delta: Tensor | None = None,
        qkv_input_delta: Tensor | None = None,
        cache: KVCache | None = None,
        cache_key: str = "",
        groups: int = 1,
        permute: bool = True,
        attn_bias: Tensor | None = None,
        logits_out: list[Tensor] | None = None,
    ) -> Tensor:
        """Self-attention over ``x`` (B x T x C), returns B x T x C.

        Args:
            key_padding_mask: B x S, True at padding keys.
            causal: each query attends only to itself and earlier positions.
            cache: incremental decoding state; keys and values of earlier steps are read from
                and appended to ``cache[cache_key + "k"]`` / ``cache[cache_key + "v"]``.
            groups: sliced group self-attention with this many groups (SReT sec. 4);
                1 is ordinary attention. Not combinable with ``causal`` or ``cache``.
            permute: sliced attention permutes the tokens first; otherwise the slices are
                contiguous runs of tokens.
            attn_bias: float B x H x T x S (or broadcastable) added to the attention logits
                before the softmax, passed to SDPA as its additive mask (DVT eq. 9).
            logits_out: if given, the attention is computed explicitly and its logits
                (B x H x T x S, ``QK^T / sqrt(D)`` plus ``attn_bias``) are appended to it.
        """
        q, k, v = self.project(x, qkv_delta, qkv_input_delta).chunk(3, dim=-1)
        q, k, v = (_split_heads(t, self.num_heads) for t in (q, k, v))
        if (attn_bias is not None or logits_out is not None) and (groups > 1 or cache is not None):
            raise ValueError("attn_bias/logits_out need full attention without a cache")
        if groups > 1:
            if causal or cache is not None:
                raise ValueError("sliced group attention does not support causal attention")
            t = x.size(1)
            perm = (
                group_permutation(t, self.training, x.device)
                if permute
                else torch.arange(t, device=x.device)
            )
            p = self.dropout if self.training else 0.0
            out = sliced_group_attention(q, k, v, groups, perm, key_padding_mask, p)
            return self.out_proj(_merge_heads(out))
        if cache is not None:
            if cache_key + "k" in cache:
                k = torch.cat([cache[cache_key + "k"], k], dim=2)
                v = torch.cat([cache[cache_key + "v"], v], dim=2)
            cache[cache_key + "k"], cache[cache_key + "v"] = k, v
        t, s = q.size(2), k.size(2)
        plain = attn_bias is None and logits_out is None
        if causal and key_padding_mask is None and t == s and plain:
            # the common training case: let SDPA pick its fused causal kernel
            p = self.dropout if self.training else 0.0
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
            return self.out_proj(_merge_heads(out))
        mask = attention_mask(key_padding_mask, causal and t > 1, t, s, x.device)
        if plain:
            return self._attend(q, k, v, mask)
        if attn_bias is not None:
            attn_bias = attn_bias.to(q.dtype)
            mask = attn_bias if mask is None else attn_bias.masked_fill(~mask, float("-inf"))
        if logits_out is None:
            return self._attend(q, k, v, mask)
        # the logits are wanted downstream (DVT relationship reuse): compute them once here
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))  # B x H x T x S
        if mask is not None and mask.is_floating_point():
            scores = scores + mask
        elif mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        logits_out.append(scores)
        probs = scores.softmax(-1)
        if self.training and self.dropout > 0:
            probs = F.dropout(probs, self.dropout)
        return self.out_proj(_merge_heads(probs @ v))


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

    def project_memory(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values of the memory (B x S x C_mem), each B x H x S x D."""
        k, v = self.kv_proj(memory).chunk(2, dim=-1)
        return _split_heads(k, self.num_heads), _split_heads(v, self.num_heads)

    def forward(
        self,
        x: Tensor,
        memory_kv: tuple[Tensor, Tensor],
        *,
        memory_padding_mask: Tensor | None = None,
        weights_out: dict[str, Tensor] | None = None,
    ) -> Tensor:
        """Attends ``x`` (B x T x C) to keys/values from :meth:`project_memory`.

        Args:
            weights_out: if given, receives ``"attn"``, the attention probabilities averaged
                over heads (B x T x S), as fairseq's ``--print-alignment`` expects; the
                attention is then computed explicitly instead of by SDPA.
        """
        q = _split_heads(self.q_proj(x), self.num_heads)
        k, v = memory_kv
        mask = None if memory_padding_mask is None else ~memory_padding_mask[:, None, None, :]
        if weights_out is None:
            return self._attend(q, k, v, mask)
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))  # B x H x T x S
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        probs = scores.softmax(-1)
        weights_out["attn"] = probs.mean(dim=1)
        if self.training and self.dropout > 0:
            probs = F.dropout(probs, self.dropout)
        return self.out_proj(_merge_heads(probs @ v))
