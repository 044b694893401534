"""Attention on SDPA against a direct softmax(QK^T/sqrt(d))V implementation."""

from __future__ import annotations

import math

import pytest
import torch

from recurnmt.modules import (
    AttentionTerms,
    CrossAttention,
    CrossAttentionWeights,
    KVCache,
    SelfAttention,
)


def naive_attention(q, k, v, allowed):
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))
    scores = scores.masked_fill(~allowed, float("-inf"))
    return scores.softmax(-1) @ v


def split(x, h):
    b, t, c = x.shape
    return x.view(b, t, h, c // h).transpose(1, 2)


def reference_self_attention(attn: SelfAttention, x, pad=None, causal=False):
    q, k, v = (split(t, attn.num_heads) for t in attn.qkv_proj(x).chunk(3, -1))
    b, t = x.shape[:2]
    allowed = torch.ones(b, 1, t, t, dtype=torch.bool)
    if pad is not None:
        allowed &= ~pad[:, None, None, :]
    if causal:
        allowed &= torch.ones(t, t, dtype=torch.bool).tril()
    out = naive_attention(q, k, v, allowed)
    return attn.out_proj(out.transpose(1, 2).reshape(b, t, -1))


@pytest.mark.parametrize("causal", [False, True])
def test_self_attention_matches_reference(causal):
    attn = SelfAttention(16, 4).eval()
    x = torch.randn(3, 7, 16)
    pad = torch.zeros(3, 7, dtype=torch.bool)
    pad[1, 5:] = True
    pad[2, 3:] = True
    attn.causal = causal
    out = attn(x, key_padding_mask=pad)
    ref = reference_self_attention(attn, x, pad, causal)
    real = ~pad
    torch.testing.assert_close(out[real], ref[real], atol=1e-5, rtol=1e-5)


def test_causal_fast_path_matches_masked_path():
    attn = SelfAttention(16, 2).eval()
    x = torch.randn(2, 6, 16)
    attn.causal = True
    fast = attn(x)
    ref = reference_self_attention(attn, x, causal=True)
    torch.testing.assert_close(fast, ref, atol=1e-5, rtol=1e-5)


def test_padding_content_does_not_leak():
    attn = SelfAttention(16, 4).eval()
    x = torch.randn(2, 5, 16)
    pad = torch.tensor([[0, 0, 0, 1, 1], [0, 0, 0, 0, 0]], dtype=torch.bool)
    y1 = attn(x, key_padding_mask=pad)
    x2 = x.clone()
    x2[0, 3:] = torch.randn(2, 16) * 100
    y2 = attn(x2, key_padding_mask=pad)
    torch.testing.assert_close(y1[0, :3], y2[0, :3])


def test_incremental_cache_equals_full_causal_pass():
    attn = SelfAttention(16, 4).eval()
    x = torch.randn(2, 6, 16)
    attn.causal = True
    full = attn(x)
    cache = KVCache()
    steps = [attn(x[:, t : t + 1], cache=cache) for t in range(6)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-6, rtol=1e-5)
    assert cache.keys.shape == (2, 4, 6, 4)


def test_left_padded_causal_rows_stay_finite():
    attn = SelfAttention(8, 2).eval()
    x = torch.randn(1, 4, 8)
    pad = torch.tensor([[1, 1, 0, 0]], dtype=torch.bool)
    attn.causal = True
    out = attn(x, key_padding_mask=pad)
    assert torch.isfinite(out).all()
    ref = reference_self_attention(attn, x, pad, causal=True)
    torch.testing.assert_close(out[0, 2:], ref[0, 2:], atol=1e-5, rtol=1e-5)


def test_qkv_delta_is_added_after_projection():
    attn = SelfAttention(8, 2)
    x = torch.randn(1, 3, 8)
    delta = torch.randn(1, 3, 24)
    torch.testing.assert_close(
        attn.project(x, AttentionTerms(qkv_delta=delta)), attn.qkv_proj(x) + delta
    )


def test_qkv_input_delta_goes_through_each_projection():
    attn = SelfAttention(8, 2)
    x = torch.randn(1, 3, 8)
    d = torch.randn(1, 3, 3, 8)
    w = attn.qkv_proj.weight.view(3, 8, 8)
    b = attn.qkv_proj.bias.view(3, 8)
    expected = torch.cat([(x + d[:, :, j]) @ w[j].t() + b[j] for j in range(3)], -1)
    torch.testing.assert_close(attn.project(x, AttentionTerms(qkv_input_delta=d)), expected)


def test_cross_attention_matches_reference():
    attn = CrossAttention(16, 4).eval()
    x, mem = torch.randn(2, 3, 16), torch.randn(2, 5, 16)
    pad = torch.tensor([[0, 0, 0, 0, 1], [0, 0, 0, 0, 0]], dtype=torch.bool)
    out = attn(x, attn.project_memory(mem, pad))
    q = split(attn.q_proj(x), 4)
    k, v = (split(t, 4) for t in attn.kv_proj(mem).chunk(2, -1))
    ref = naive_attention(q, k, v, ~pad[:, None, None, :])
    ref = attn.out_proj(ref.transpose(1, 2).reshape(2, 3, 16))
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("probed", [False, True])
def test_grouped_queries_equal_the_memory_repeated_for_every_row(probed):
    """A memory projected once per sentence (``group`` hypotheses each) gives every query
    the attention, logits and output of the memory repeated for every row."""
    torch.manual_seed(0)
    attn = CrossAttention(16, 4).eval()
    g, t = 3, 2
    mem = torch.randn(2, 5, 16)
    pad = torch.tensor([[0, 0, 0, 1, 1], [0, 0, 0, 0, 0]], dtype=torch.bool)
    x = torch.randn(2 * g, t, 16)
    repeated = attn.project_memory(mem.repeat_interleave(g, 0), pad.repeat_interleave(g, 0))
    grouped = attn.project_memory(mem, pad, group=g)
    assert grouped.k.shape == (2, 4, 5, 4) and grouped.group == g
    hooks = [CrossAttentionWeights(level=0) for _ in range(2)]
    terms = [hook.cross_attention(0) if probed else None for hook in hooks]
    out = attn(x, grouped, terms=terms[0])
    torch.testing.assert_close(out, attn(x, repeated, terms=terms[1]), atol=1e-6, rtol=1e-5)
    if probed:
        assert hooks[0].weights.shape == (2 * g, t, 5)
        torch.testing.assert_close(hooks[0].weights, hooks[1].weights)
    with pytest.raises(ValueError, match="5 query rows for a memory of 2 rows x group 3"):
        attn(x[:5], grouped)
    with pytest.raises(ValueError, match="group=0"):
        attn.project_memory(mem, pad, group=0)


def test_heads_must_divide_width():
    with pytest.raises(ValueError, match="num_heads=3"):
        SelfAttention(16, 3)


def test_cross_attention_weights_are_returned_on_request():
    attn = CrossAttention(16, 4).eval()
    x, mem = torch.randn(2, 3, 16), torch.randn(2, 5, 16)
    pad = torch.tensor([[0, 0, 0, 1, 1], [0, 0, 0, 0, 0]], dtype=torch.bool)
    kv = attn.project_memory(mem, pad)
    hook = CrossAttentionWeights(level=0)
    y = attn(x, kv, terms=hook.cross_attention(0))
    torch.testing.assert_close(y, attn(x, kv), atol=1e-6, rtol=1e-5)
    assert hook.weights.shape == (2, 3, 5)
    torch.testing.assert_close(hook.weights.sum(-1), torch.ones(2, 3))
    assert torch.all(hook.weights[0, :, 3:] == 0)
    assert hook.cross_attention(1) is None  # other levels: the fused path
