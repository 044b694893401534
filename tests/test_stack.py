"""The level loop: sharing by identity, untied equivalence, per-level parts."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from recurnmt.modules import (
    ConfigError,
    DepthPlan,
    LevelHook,
    LevelOutputs,
    LevelParts,
    Memory,
    RecurrentStack,
    SignalConfig,
    StackCache,
    StackConfig,
    build_stack,
)

RING = StackConfig.from_options(
    embed_dim=32,
    ffn_dim=64,
    num_heads=4,
    num_levels=4,
    num_unique=1,
    norms_per_level=True,
    signal=SignalConfig(kind="lowrank", rank=4),
    dropout=0.0,
)


def perturb_signals(stack: RecurrentStack) -> None:
    """Gives the zero-initialised signal factors values, as training would."""
    for parts in stack.levels:
        for sig in (parts.attn_signal, parts.ffn_signal):
            if sig is not None:
                for p in sig.parameters():
                    torch.nn.init.normal_(p, std=0.3)


def test_shared_block_is_one_object_at_every_level():
    stack = build_stack(RING)
    blocks = [stack.block_of_level(i) for i in range(4)]
    assert all(b is blocks[0] for b in blocks)
    w = [b.self_attn.qkv_proj.weight for b in blocks]
    assert all(t is w[0] for t in w)
    assert len(stack.blocks) == 1 and len(stack.levels) == 4


def test_levels_own_distinct_norms_and_signals():
    stack = build_stack(RING)
    ids = {id(p) for parts in stack.levels for p in parts.parameters()}
    assert len(ids) == sum(1 for parts in stack.levels for _ in parts.parameters())
    assert stack.blocks[0].norms is None


@pytest.mark.parametrize("cross", [False, True])
def test_untied_copy_computes_the_same_function(cross):
    stack = build_stack(RING.replace(cross_attention=cross, causal=cross)).eval()
    perturb_signals(stack)
    untied = stack.untied().eval()
    assert len(untied.blocks) == 4
    assert (
        untied.blocks[0].self_attn.qkv_proj.weight is not untied.blocks[1].self_attn.qkv_proj.weight
    )
    x = torch.randn(2, 5, 32)
    mem = Memory(torch.randn(2, 3, 32)) if cross else None
    y = stack(x, memory=mem).output
    y_ref = untied(x, memory=mem).output
    torch.testing.assert_close(y, y_ref)


def test_signals_change_the_output_once_trained():
    stack = build_stack(RING).eval()
    x = torch.randn(1, 3, 32)
    before = stack(x).output
    perturb_signals(stack)
    after = stack(x).output
    assert not torch.allclose(before, after)


def test_memory_is_projected_once_per_unique_block(monkeypatch):
    stack = build_stack(RING.replace(cross_attention=True, causal=True)).eval()
    calls = []
    block = stack.blocks[0]
    original = block.cross_attn.project_memory
    monkeypatch.setattr(
        block.cross_attn,
        "project_memory",
        lambda m, pad, group=1: calls.append(1) or original(m, pad, group),
    )
    cache = StackCache()
    mem = Memory(torch.randn(1, 4, 32))
    for _ in range(3):
        stack(torch.randn(1, 1, 32), memory=mem, cache=cache)
    assert len(calls) == 1
    assert set(cache.memory) == {0} and set(cache.levels) == {0, 1, 2, 3}
    assert all(cache.levels[i].keys.size(2) == 3 for i in range(4))  # B x H x steps x D


def test_static_signal_adds_a_level_embedding():
    cfg = RING.replace(signal=SignalConfig(kind="static"))
    stack = build_stack(cfg)
    assert all(parts.level_embedding.shape == (32,) for parts in stack.levels)
    assert not torch.equal(stack.levels[0].level_embedding, stack.levels[1].level_embedding)
    assert not any("signal" in n for n, _ in stack.named_parameters())


def test_level_outputs_hook_records_every_level():
    stack = build_stack(RING)
    states = LevelOutputs()
    out = stack(torch.randn(1, 2, 32), hooks=[states])
    assert len(states.outputs) == 4 and out.ponder is None


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"num_heads": 5}, "num_heads=5: does not divide embed_dim=32"),
        ({"num_levels": 0}, "num_levels=0"),
        ({"signal": SignalConfig(kind="lowrank", rank=33)}, "rank=33"),
        ({"signal": SignalConfig(kind="lowrank", rank=0)}, "rank=0"),
        ({"sharing": "zigzag"}, "sharing='zigzag'"),
        ({"num_unique": 5}, "num_unique=5"),
        ({"signal": SignalConfig(kind="wavy")}, "signal.kind='wavy'"),
        ({"dropout": 1.5}, "dropout=1.5"),
    ],
)
def test_impossible_settings_name_the_setting(changes, message):
    with pytest.raises(ConfigError, match=message):
        RING.replace(**changes)


def test_drop_path_grows_linearly_and_is_off_in_eval():
    cfg = RING.replace(drop_path=0.3)
    assert [cfg.drop_path_rate(i) for i in range(4)] == pytest.approx([0.0, 0.1, 0.2, 0.3])
    stack = build_stack(cfg.replace(drop_path=0.99))
    assert [parts.drop_path for parts in stack.levels] == pytest.approx([0.0, 0.33, 0.66, 0.99])
    x = torch.randn(64, 3, 32)
    stack.eval()
    assert torch.equal(stack(x).output, stack(x).output)
    stack.train()
    torch.manual_seed(0)
    a = stack(x).output
    assert not torch.equal(a, stack(x).output)


def test_final_norm_and_eps_are_configurable():
    assert build_stack(RING).final_norm is None
    assert build_stack(RING.replace(normalize_before=True)).final_norm is not None
    stack = build_stack(RING.replace(normalize_before=True, final_norm=False, norm_eps=1e-6))
    assert stack.final_norm is None
    assert stack.levels[0].norms[0].eps == 1e-6


def test_explicit_level_rates_and_single_level():
    cfg = RING.replace(level_drop_path=(0.0, 0.1, 0.1, 0.3))
    assert [cfg.drop_path_rate(i) for i in range(4)] == [0.0, 0.1, 0.1, 0.3]
    assert RING.replace(num_levels=1, drop_path=0.2).drop_path_rate(0) == 0.0
    with pytest.raises(ConfigError, match="level_drop_path"):
        RING.replace(level_drop_path=(0.1,))
    with pytest.raises(ConfigError, match="attn_permute"):
        RING.replace(attn_permute=("reference",))


def test_stack_refuses_parts_that_do_not_match_the_plan():
    stack = build_stack(RING)
    with pytest.raises(ValueError, match="2 blocks for a plan of 1"):
        RecurrentStack([stack.blocks[0]] * 2, list(stack.levels), stack.plan)
    with pytest.raises(ValueError, match="3 level parts for a plan of 4"):
        RecurrentStack(list(stack.blocks), list(stack.levels)[:3], stack.plan)
    with pytest.raises(ConfigError, match="5 levels"):
        build_stack(RING, DepthPlan((0,) * 5))


# ----------------------------------------------------- extending without touching stack.py


def test_a_new_sharing_scheme_is_a_plan():
    """A palindrome order (0, 1, 1, 0), which no built-in scheme gives, is just a plan."""
    cfg = RING.replace(num_unique=2, norms_per_level=False, signal=SignalConfig())
    stack = build_stack(cfg, DepthPlan((0, 1, 1, 0))).eval()
    assert stack.block_of_level(0) is stack.block_of_level(3)
    assert stack.block_of_level(1) is stack.block_of_level(2)
    assert stack.block_of_level(0) is not stack.block_of_level(1)
    x = torch.randn(2, 3, 32)
    blocks = [stack.block_of_level(i) for i in (0, 1, 1, 0)]
    ref = x
    for i, block in enumerate(blocks):
        ref = block(ref, stack.levels[i])
    torch.testing.assert_close(stack(x).output, ref)


class LevelGate(LevelHook):
    """A new per-level part: a learned scalar gate on each level's residual update."""

    def __init__(self, gates: nn.Parameter) -> None:
        self.gates, self.inputs = gates, {}

    def before_level(self, level: int, x: Tensor) -> Tensor:
        self.inputs[level] = x
        return x

    def after_level(self, level: int, x: Tensor) -> Tensor:
        before = self.inputs.pop(level)
        return before + self.gates[level] * (x - before)


def test_a_new_per_level_part_is_a_hook():
    stack = build_stack(RING).eval()
    gates = nn.Parameter(torch.zeros(4))
    x = torch.randn(2, 3, 32)
    # closed gates: every level leaves its input unchanged
    torch.testing.assert_close(stack(x, hooks=[LevelGate(gates)]).output, x)
    with torch.no_grad():
        gates.fill_(1.0)
    torch.testing.assert_close(stack(x, hooks=[LevelGate(gates)]).output, stack(x).output)
    # the gates train through the stack
    gates.data.fill_(0.5)
    stack(x, hooks=[LevelGate(gates)]).output.sum().backward()
    assert gates.grad is not None and bool((gates.grad != 0).all())


class Rescaled(LevelParts):
    """A new per-level part as parts: each level scales its output by a learned scalar."""

    def __init__(self, parts: LevelParts) -> None:
        super().__init__(parts.index, norms=parts.norms, drop_path=parts.drop_path)
        self.scale = nn.Parameter(torch.full((), 2.0))

    def leave(self, x: Tensor) -> Tensor:
        return self.scale * x


def test_a_new_per_level_part_is_a_level_parts_subclass():
    base = build_stack(RING.replace(signal=SignalConfig())).eval()
    stack = RecurrentStack(list(base.blocks), [Rescaled(p) for p in base.levels], base.plan)
    x = torch.randn(1, 3, 32)
    ref = x
    for i in range(4):
        ref = 2.0 * base.blocks[0](ref, base.levels[i])
    torch.testing.assert_close(stack(x).output, ref)
