"""One Wide FFN sharing, Universal Transformer coordinate embeddings and ACT halting."""

from __future__ import annotations

import pytest
import torch

from recurnmt.analysis.dispatch import count_dispatch
from recurnmt.modules import (
    AddAtEveryLevel,
    ConfigError,
    CrossAttentionWeights,
    LevelOutputs,
    Memory,
    SignalConfig,
    StackCache,
    StackConfig,
    build_stack,
)
from recurnmt.modules.halting import HaltingAccumulator, HaltingUnit
from recurnmt.modules.level_embedding import sinusoidal_level_embedding

BASE = StackConfig.from_options(embed_dim=16, ffn_dim=32, num_heads=2, num_levels=4, dropout=0.0)


def test_one_wide_ffn_is_one_object_with_unshared_attention():
    stack = build_stack(BASE.replace(ffn_sharing="shared", ffn_dim=64))
    ffns = [b.ffn for b in stack.blocks]
    assert all(f is ffns[0] for f in ffns) and ffns[0].up.out_features == 64
    attn = [b.self_attn.qkv_proj.weight for b in stack.blocks]
    assert len({id(w) for w in attn}) == 4


def test_ffn_can_be_removed():
    stack = build_stack(BASE.replace(ffn_sharing="none", cross_attention=True, causal=True))
    assert all(b.ffn is None for b in stack.blocks)
    assert len(stack.blocks[0].norms) == 2  # self- and cross-attention only
    mem = Memory(torch.randn(1, 3, 16))
    assert stack(torch.randn(1, 2, 16), memory=mem).output.shape == (1, 2, 16)


def test_removed_ffn_cannot_carry_a_signal():
    with pytest.raises(ConfigError, match="ffn_sharing='none'"):
        BASE.replace(ffn_sharing="none", signal=SignalConfig(kind="lowrank", rank=2))


def test_positions_are_added_at_every_level():
    cfg = BASE.replace(num_unique=1, signal=SignalConfig(kind="static"), positions_every_level=True)
    stack = build_stack(cfg).eval()
    x, pos = torch.randn(1, 3, 16), torch.randn(1, 3, 16)
    out = stack(x, hooks=[AddAtEveryLevel(pos)]).output
    manual = x
    for i in range(4):
        level_embedding = sinusoidal_level_embedding(4, 16)[i]
        manual = stack.blocks[0](manual + level_embedding + pos, stack.levels[i])
    torch.testing.assert_close(out, manual)


def test_act_weights_sum_to_one_and_ponder_counts_levels():
    acc = HaltingAccumulator(torch.zeros(1, 3, 2))
    p = torch.tensor([[0.995, 0.5, 0.1]])
    total = torch.zeros(1, 3)
    for level in range(4):
        total += acc.weights(p, last=level == 3)
    torch.testing.assert_close(total, torch.ones(1, 3))
    # halts at level 1, level 2 (0.5 + 0.5 > 0.99) and the last level (forced)
    torch.testing.assert_close(acc.n_updates, torch.tensor([[1.0, 2.0, 4.0]]))
    torch.testing.assert_close(acc.ponder_cost, torch.tensor([[2.0, 2.5, 4.7]]))
    assert acc.all_halted()


def _graves_weights(p: list[float], threshold: float) -> list[float]:
    """ACT's mixing weights of one position, one level at a time (Graves 2016 eq. 5-6)."""
    weights, total = [], 0.0
    for level, p_t in enumerate(p):
        if level == len(p) - 1 or total + p_t > threshold:
            return weights + [1.0 - total] + [0.0] * (len(p) - level - 1)
        weights.append(p_t)
        total += p_t
    raise AssertionError("unreachable")


@pytest.mark.parametrize("threshold", [0.99, 0.5, 1.0])
def test_act_weights_are_the_same_without_the_ponder_bookkeeping(threshold):
    """Incremental decoding keeps no running mask (a halted position's sum is set to 1): its
    weights are those of the bookkeeping for the ponder cost, bit for bit, and Graves's."""
    torch.manual_seed(0)
    p = torch.rand(6, 2, 50) ** 2  # 6 levels: positions halt at every level, some run out
    p[:, 0, :3] = torch.tensor([0.5, 0.25, 0.25])  # sums of exactly 1 (threshold 1.0)
    runs = {}
    for ponder in (True, False):
        acc = HaltingAccumulator(torch.zeros(2, 50, 4), threshold, ponder=ponder)
        runs[ponder] = torch.stack([acc.weights(p_t, last=i == 5) for i, p_t in enumerate(p)])
        assert acc.all_halted()
    assert torch.equal(runs[True], runs[False])
    reference = [_graves_weights(p[:, 0, j].tolist(), threshold) for j in range(50)]
    torch.testing.assert_close(runs[False][:, 0].T, torch.tensor(reference))
    with pytest.raises(RuntimeError, match="ponder=True"):
        _ = acc.ponder_cost


def test_halting_unit_runs_in_float32_from_the_weights_of_now():
    """A half-precision model's halting unit runs in float32 from its weights as they are at
    the call (an in-place write through ``.data`` included); a decoding session passes the
    cast made at its first step, so that a step casts the state alone; a quantized projection
    takes the float32 state itself."""
    unit = HaltingUnit(8).half()
    state = torch.randn(2, 3, 8).half()
    with torch.no_grad():
        params = unit.float_params()
        with count_dispatch() as log:
            p = unit(state, params)
        assert log.ops["aten._to_copy"] == 1  # the state alone
        unit.proj.weight.data.mul_(-1)  # no version bump
        w, b = unit.proj.weight.float(), unit.proj.bias.float()
        expected = torch.sigmoid(state.float() @ w.T + b).squeeze(-1)
        torch.testing.assert_close(unit(state), expected)
        assert not torch.allclose(unit(state), p)
    assert unit(state).requires_grad  # training casts at every call, with gradients
    quantized = torch.ao.quantization.quantize_dynamic(HaltingUnit(8), {torch.nn.Linear})
    assert quantized.float_params() is None
    assert quantized(state.float()).shape == (2, 3)


def test_act_stack_reports_ponder_and_gets_gradients():
    cfg = BASE.replace(num_unique=1, act=True, signal=SignalConfig(kind="static"))
    stack = build_stack(cfg)
    result = stack(torch.randn(2, 5, 16))
    assert result.ponder.shape == (2, 5) and (result.ponder >= 1).all()
    (result.output.sum() + result.ponder.sum()).backward()
    assert stack.halting.proj.weight.grad.abs().sum() > 0
    assert stack.halting.proj.bias.item() == pytest.approx(1.0, abs=0.1)


def test_act_decoder_stops_early_only_without_cache(monkeypatch):
    cfg = BASE.replace(
        num_unique=1, act=True, act_bias_init=10.0, cross_attention=True, causal=True
    )
    stack = build_stack(cfg).eval()
    calls = []
    block = stack.blocks[0]
    original = block.forward
    monkeypatch.setattr(block, "forward", lambda *a, **k: calls.append(1) or original(*a, **k))
    mem = Memory(torch.randn(1, 3, 16))
    stack(torch.randn(1, 2, 16), memory=mem)
    assert len(calls) == 1  # p ~ 1 at the first level: everyone halts
    calls.clear()
    stack(torch.randn(1, 1, 16), memory=mem, cache=StackCache())
    assert len(calls) == 4  # incremental decoding fills every level's cache
    # positions at every level and recording the levels run do not keep ACT going ...
    calls.clear()
    x = torch.randn(1, 2, 16)
    states = LevelOutputs()
    stack(x, memory=mem, hooks=[AddAtEveryLevel(torch.zeros_like(x)), states])
    assert len(calls) == 1 and len(states.outputs) == 1
    # ... but a hook that reads a given level (the alignment of the last one) does
    calls.clear()
    alignment = CrossAttentionWeights(level=3)
    stack(x, memory=mem, hooks=[alignment])
    assert len(calls) == 4 and alignment.weights is not None
