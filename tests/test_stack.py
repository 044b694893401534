"""The level loop: sharing by identity, untied equivalence, per-level parts."""

from __future__ import annotations

import pytest
import torch

from recurnmt.modules import ConfigError, RecurrentStack, SignalConfig, StackConfig

RING = StackConfig(
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
    stack = RecurrentStack(RING)
    blocks = [stack.block_of_level(i) for i in range(4)]
    assert all(b is blocks[0] for b in blocks)
    w = [b.self_attn.qkv_proj.weight for b in blocks]
    assert all(t is w[0] for t in w)
    assert len(stack.blocks) == 1 and len(stack.levels) == 4


def test_levels_own_distinct_norms_and_signals():
    stack = RecurrentStack(RING)
    ids = {id(p) for parts in stack.levels for p in parts.parameters()}
    assert len(ids) == sum(1 for parts in stack.levels for _ in parts.parameters())
    assert stack.blocks[0].norms is None


@pytest.mark.parametrize("cross", [False, True])
def test_untied_copy_computes_the_same_function(cross):
    stack = RecurrentStack(RING.replace(cross_attention=cross)).eval()
    perturb_signals(stack)
    untied = stack.untied().eval()
    assert len(untied.blocks) == 4
    assert (
        untied.blocks[0].self_attn.qkv_proj.weight is not untied.blocks[1].self_attn.qkv_proj.weight
    )
    x = torch.randn(2, 5, 32)
    mem = torch.randn(2, 3, 32) if cross else None
    y, _ = stack(x, memory=mem, causal=cross)
    y_ref, _ = untied(x, memory=mem, causal=cross)
    torch.testing.assert_close(y, y_ref)


def test_signals_change_the_output_once_trained():
    stack = RecurrentStack(RING).eval()
    x = torch.randn(1, 3, 32)
    before, _ = stack(x)
    perturb_signals(stack)
    after, _ = stack(x)
    assert not torch.allclose(before, after)


def test_memory_is_projected_once_per_unique_block(monkeypatch):
    stack = RecurrentStack(RING.replace(cross_attention=True)).eval()
    calls = []
    block = stack.blocks[0]
    original = block.cross_attn.project_memory
    monkeypatch.setattr(
        block.cross_attn, "project_memory", lambda m: calls.append(1) or original(m)
    )
    cache: dict = {}
    mem = torch.randn(1, 4, 32)
    for _ in range(3):
        stack(torch.randn(1, 1, 32), memory=mem, causal=True, cache=cache)
    assert len(calls) == 1
    assert {"m0.k", "m0.v"} <= set(cache) and {f"{i}.k" for i in range(4)} <= set(cache)


def test_static_signal_adds_a_level_embedding():
    cfg = RING.replace(signal=SignalConfig(kind="static"))
    stack = RecurrentStack(cfg)
    assert stack.level_embedding.shape == (4, 32)
    assert not any("signal" in n for n, _ in stack.named_parameters())


def test_return_states_gives_every_level():
    stack = RecurrentStack(RING)
    _, states = stack(torch.randn(1, 2, 32), return_states=True)
    assert len(states) == 4


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"num_heads": 5}, "num_heads=5 does not divide embed_dim=32"),
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
    stack = RecurrentStack(cfg.replace(drop_path=0.99))
    x = torch.randn(64, 3, 32)
    stack.eval()
    assert torch.equal(stack(x)[0], stack(x)[0])
    stack.train()
    torch.manual_seed(0)
    a = stack(x)[0]
    assert not torch.equal(a, stack(x)[0])


def test_final_norm_and_eps_are_configurable():
    assert RecurrentStack(RING).final_norm is None
    assert RecurrentStack(RING.replace(normalize_before=True)).final_norm is not None
    stack = RecurrentStack(RING.replace(normalize_before=True, final_norm=False, norm_eps=1e-6))
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
