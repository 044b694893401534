"""The preallocated per-level key/value cache of incremental decoding."""

from __future__ import annotations

import pytest
import torch

from recurnmt.analysis.dispatch import count_dispatch
from recurnmt.modules import KVCache, SelfAttention, StackCache
from recurnmt.modules.attention import MASK_ALIGNMENT, MemoryKV, additive_mask
from recurnmt.modules.decoding.kv_cache import MIN_CAPACITY

# views and allocations: no kernel, no copy
NO_COPY = {"aten.narrow", "aten.slice", "aten.view", "aten.empty", "aten.new_empty"}


def kv(b: int = 2, t: int = 1, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, 3, t, 4, generator=g), torch.randn(b, 3, t, 4, generator=g)


def test_steps_write_in_place_until_the_buffer_is_full():
    cache = KVCache()
    cache.append(*kv())
    buffer = cache.buffer
    assert buffer.shape == (2, 2, 3, MIN_CAPACITY, 4)
    for step in range(1, MIN_CAPACITY):
        cache.append(*kv(seed=step))
        assert cache.buffer is buffer  # no concatenation, no new tensor
    assert cache.length == MIN_CAPACITY


def test_growing_keeps_every_position():
    cache, ks, vs = KVCache(), [], []
    for step in range(2 * MIN_CAPACITY + 3):
        k, v = kv(seed=step)
        ks.append(k)
        vs.append(v)
        keys, values = cache.append(k, v)
    assert cache.buffer.size(3) == 4 * MIN_CAPACITY  # doubled twice
    torch.testing.assert_close(keys, torch.cat(ks, 2), rtol=0, atol=0)
    torch.testing.assert_close(values, torch.cat(vs, 2), rtol=0, atol=0)


def test_reorder_selects_rows_of_keys_and_values_together():
    cache = KVCache()
    k, v = kv(b=3, t=5)
    cache.append(k, v)
    order = torch.tensor([2, 2, 0])
    moved = cache.reorder(order)
    torch.testing.assert_close(moved.keys, k[order], rtol=0, atol=0)
    torch.testing.assert_close(moved.values, v[order], rtol=0, atol=0)
    moved.append(*kv(b=3, seed=9))
    assert moved.length == 6


def test_a_reordered_cache_is_moved_and_says_so():
    cache = KVCache()
    cache.append(*kv(b=3, t=2))
    cache.reorder(torch.tensor([1, 0, 2]))
    for use in (
        lambda: cache.keys,
        lambda: cache.append(*kv(b=3)),
        lambda: cache.append_pair(torch.stack(kv(b=3))),
        lambda: cache.reorder(torch.tensor([0, 1, 2])),
    ):
        with pytest.raises(ValueError, match="moved by reorder"):
            use()
    with pytest.raises(ValueError, match="no step has run yet"):
        _ = KVCache().keys
    assert KVCache().reorder(torch.tensor([0])).buffer is None


def test_beam_search_reorders_take_turns_between_two_buffers():
    """Steps of beam search (reorder, then append) equal the same steps on plain tensors,
    through growth and a batch that shrinks; in the steady state no reorder allocates."""
    g = torch.Generator().manual_seed(0)
    cache, keys, values = KVCache(), None, None
    pointers, allocated = set(), []
    for step in range(2 * MIN_CAPACITY + 3):
        b = 6 if step < MIN_CAPACITY + 4 else 4  # two sentences of two beams finish
        if step:
            order = torch.randint(0, keys.size(0), (b,), generator=g)
            before = {
                cache.buffer.data_ptr(),
                cache.spare.data_ptr() if cache.spare is not None else None,
            }
            cache = cache.reorder(order)
            allocated.append(cache.buffer.data_ptr() not in before)
            keys, values = keys[order], values[order]
        k, v = kv(b=b, seed=step)
        out_k, out_v = cache.append_pair(torch.stack([k, v]))
        keys = k if keys is None else torch.cat([keys, k], 2)
        values = v if values is None else torch.cat([values, v], 2)
        torch.testing.assert_close(out_k, keys, rtol=0, atol=0)
        torch.testing.assert_close(out_v, values, rtol=0, atol=0)
        pointers.add(cache.buffer.data_ptr())
    # a new buffer only at the first reorder and after each growth (16 -> 32 -> 64 positions);
    # the shrunk batch is written into the memory of the larger one
    assert sum(allocated) <= 3, allocated
    assert len(pointers) <= 6


def test_off_the_cpu_no_spare_is_kept():
    """A GPU's caching allocator reuses the freed buffer itself: the state is held once."""
    cache = KVCache()
    cache.append_pair(torch.empty(2, 3, 2, 4, 8, device="meta"))
    for _ in range(3):
        cache = cache.reorder(torch.tensor([2, 0, 1], device="meta"))
        assert cache.spare is None and cache.buffer.device.type == "meta"
    assert cache.keys.shape == (3, 2, 4, 8)


def test_stack_cache_reorders_each_level_with_one_copy():
    cache = StackCache()
    for level in range(3):
        cache.level(level).append(*kv(b=2, t=2, seed=level))
    order = torch.tensor([1, 0])
    with count_dispatch() as log:
        cache.reorder(order)
    # keys and values of a level move together, with one kernel-launching operation
    copies = {op: n for op, n in log.ops.items() if op not in NO_COPY}
    assert copies == {"aten.index_select": 3}, log.ops


def test_keys_and_values_given_together_are_written_with_one_copy(monkeypatch):
    pair, separate, ks, vs = KVCache(), KVCache(), [], []
    copies = []
    original = torch.Tensor.copy_
    monkeypatch.setattr(torch.Tensor, "copy_", lambda t, *a: copies.append(1) or original(t, *a))
    for step in range(MIN_CAPACITY + 3):  # past the first capacity: a growth on the way
        k, v = kv(seed=step)
        ks.append(k)
        vs.append(v)
        copies.clear()
        keys, values = pair.append_pair(torch.stack([k, v]))
        assert len(copies) == (2 if step == MIN_CAPACITY else 1)  # a growth copies the history
        separate.append(k, v)
    torch.testing.assert_close(keys, torch.cat(ks, 2), rtol=0, atol=0)
    torch.testing.assert_close(values, torch.cat(vs, 2), rtol=0, atol=0)
    torch.testing.assert_close(pair.keys, separate.keys, rtol=0, atol=0)
    torch.testing.assert_close(pair.values, separate.values, rtol=0, atol=0)


def test_the_additive_memory_mask_is_zero_at_keys_and_minus_inf_at_padding():
    pad = torch.tensor([[False, False, True], [False, False, False]])
    mask = additive_mask(pad, torch.float16)
    assert mask.shape == (2, 1, 1, 3) and mask.dtype == torch.float16
    assert torch.equal(mask.isinf().view(2, 3), pad) and not mask[~pad.view(2, 1, 1, 3)].any()
    assert additive_mask(None, torch.float32) is None
    # rows MASK_ALIGNMENT elements apart: SDPA's memory-efficient kernel takes it without a copy
    assert aligned(mask) and aligned(
        additive_mask(torch.zeros(3, 16, dtype=torch.bool), mask.dtype)
    )


def aligned(mask: torch.Tensor) -> bool:
    return mask.stride(-1) == 1 and all(s % MASK_ALIGNMENT == 0 for s in mask.stride()[:-1])


def test_decoding_past_the_first_capacity_equals_the_full_pass():
    attn = SelfAttention(16, 4, causal=True).eval()
    steps = MIN_CAPACITY + 5
    x = torch.randn(2, steps, 16)
    cache = KVCache()
    out = torch.cat([attn(x[:, t : t + 1], cache=cache) for t in range(steps)], 1)
    torch.testing.assert_close(out, attn(x), atol=1e-5, rtol=1e-5)


def test_a_memory_kept_per_sentence_follows_beam_search_reorders():
    k = torch.arange(3.0).view(3, 1, 1, 1).expand(3, 2, 4, 8).contiguous()  # row i holds i
    pad = torch.tensor([[0, 0, 0, 1], [0, 0, 1, 1], [0, 0, 0, 0]], dtype=torch.bool)
    # 3 sentences x 2 beams; the additive mask made once with the keys travels with them
    memory = MemoryKV(k, -k, pad, group=2, attn_mask=additive_mask(pad, k.dtype))
    cache = StackCache(memory={0: memory})

    def rows(new_order):
        kv = cache.reorder(torch.tensor(new_order)).memory[0]
        assert torch.equal(kv.v, -kv.k)
        assert torch.equal(kv.attn_mask, additive_mask(kv.padding_mask, k.dtype))
        assert aligned(kv.attn_mask)
        return kv.k[:, 0, 0, 0].tolist(), kv.group, kv.padding_mask

    same = cache.reorder(torch.tensor([1, 1, 2, 3, 5, 4])).memory[0]
    assert same is cache.memory[0]  # beams reshuffled within their sentences: nothing to do
    # sentence 1 finished: the groups of sentences 2 and 0 stay, their beams in any order
    kept, group, mask = rows([5, 4, 0, 0])
    assert (kept, group) == ([2.0, 0.0], 2) and torch.equal(mask, pad[[2, 0]])
    # an order whose groups mix sentences: one memory row per hypothesis from here on
    kept, group, mask = rows([0, 2, 4, 5])
    assert (kept, group) == ([0.0, 1.0, 2.0, 2.0], 1) and torch.equal(mask, pad[[0, 1, 2, 2]])
    kept, group, _ = rows([3, 1, 0])  # not whole groups
    assert (kept, group) == ([1.0, 0.0, 0.0], 1)
