"""Relaxed recursion in the block library: per-level LoRA (Relaxed Recursive Transformers eq. 3)
and the conversion of a trained stack (stepwise / average / lower + SVD initialisation)."""

from __future__ import annotations

import pytest
import torch

from recurnmt.analysis.dispatch import count_dispatch
from recurnmt.modules import ConfigError, DepthPlan, Memory, SignalConfig, StackConfig, build_stack
from recurnmt.modules.decoding.cache import StackCache
from recurnmt.modules.level_lora import LINEARS, LevelLoRA, LowRankDelta
from recurnmt.modules.relaxed_init import relax_stack, source_layers

DECODER = dict(embed_dim=16, ffn_dim=24, num_heads=4, cross_attention=True, causal=True)


def _cfg(**kw) -> StackConfig:
    return StackConfig.from_options(**{**DECODER, "num_levels": 4, "dropout": 0.0, **kw})


def _randomise(module: torch.nn.Module, std: float = 0.3) -> None:
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(std=std)


def _run(stack, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x, memory = torch.randn(2, 5, 16, generator=g), torch.randn(2, 7, 16, generator=g)
    pad = torch.zeros(2, 7, dtype=torch.bool)
    pad[1, :2] = True
    with torch.no_grad():
        return stack.eval()(x, memory=Memory(memory, pad)).output


def test_shared_blocks_are_one_object_and_every_level_owns_its_lora():
    stack = build_stack(_cfg(num_unique=2, lora_rank=4))
    assert stack.block_of_level(0) is stack.block_of_level(2)
    assert stack.block_of_level(1) is stack.block_of_level(3)
    block_params = {id(p) for b in stack.blocks for p in b.parameters()}
    lora_params = [id(p) for parts in stack.levels for p in parts.lora.parameters()]
    assert len(lora_params) == len(set(lora_params))  # no level shares a LoRA
    assert not block_params & set(lora_params)
    assert set(stack.levels[0].lora) == set(LINEARS)


def test_lora_is_low_rank_below_the_full_rank():
    """Nothing C x C per level: every LoRA tensor is r x in, out x r or a bias."""
    lora = LevelLoRA(64, 128, 4, cross_attention=True)
    shapes = {"qkv": (64, 64, 3), "cross_kv": (64, 64, 2), "ffn_up": (64, 128, 1)}
    for name, delta in lora.items():
        i, o, g = shapes.get(name, (128, 64, 1) if name == "ffn_down" else (64, 64, 1))
        assert sum(p.numel() for p in delta.lowrank.parameters()) == g * 4 * (i + o), name
        assert delta.bias.shape == (g * o,)
    cap = LevelLoRA(16, 8, 16)  # a 16 -> 8 FFN has rank 8 at most
    assert cap["ffn_up"].rank == cap["ffn_down"].rank == 8 and cap["qkv"].rank == 16


def test_a_relaxed_stack_starts_as_plain_sharing():
    """LoRA's initialisation (zero up factor, zero bias deltas): the function of the blocks."""
    relaxed = build_stack(_cfg(num_unique=2, lora_rank=4))
    _randomise(relaxed.blocks)
    plain = build_stack(_cfg(num_unique=2))
    plain.blocks.load_state_dict(relaxed.blocks.state_dict())
    torch.testing.assert_close(_run(relaxed), _run(plain), atol=1e-6, rtol=0)


@pytest.mark.parametrize("rank", [1, 3, 8])
def test_svd_initialisation_is_the_best_rank_r_approximation(rank):
    g = torch.Generator().manual_seed(1)
    diff = torch.randn(3 * 8, 8, generator=g)
    delta = LowRankDelta(8, 8, rank, groups=3)
    delta.set_difference(diff, torch.ones(24))
    for group, approx in zip(diff.chunk(3), delta.weight_delta().chunk(3), strict=True):
        s = torch.linalg.svdvals(group.double())
        err = torch.linalg.matrix_norm((group - approx).double())
        torch.testing.assert_close(err, s[rank:].norm(), atol=1e-5, rtol=1e-5)  # Eckart-Young
    # the singular values go into the up factor (the authors' B = U_r S_r), down is V_r^T
    down = delta.lowrank.down.view(3, rank, 8).double()
    eye = torch.eye(rank, dtype=torch.float64).expand(3, -1, -1)
    torch.testing.assert_close(down @ down.transpose(1, 2), eye, atol=1e-5, rtol=0)
    assert torch.equal(delta.bias, torch.ones(24))


def test_stepwise_average_and_lower_pick_the_authors_layers():
    cycle, sequence = DepthPlan.build(6, 3, "cycle"), DepthPlan.build(6, 3, "sequence")
    # the first author's code: round(np.linspace(0, 5, 3)) = [0, 2, 5] (2.5 rounds to even)
    assert source_layers(cycle, 6, "stepwise") == [[0], [2], [5]]
    assert source_layers(cycle, 6, "lower") == [[0], [1], [2]]
    assert source_layers(cycle, 6, "average") == [[0, 3], [1, 4], [2, 5]]
    assert source_layers(sequence, 6, "average") == [[0, 1], [2, 3], [4, 5]]
    assert source_layers(DepthPlan.build(3, 2, "cycle"), 3, "average") == [[0, 2], [1]]
    with pytest.raises(ValueError, match="init='upper'"):
        source_layers(cycle, 6, "upper")


def _trained_vanilla(**kw):
    source = build_stack(_cfg(norms_per_level=False, **kw))
    _randomise(source, 0.2)
    with torch.no_grad():
        for block in source.blocks:
            for norm in block.norms:
                norm.weight.add_(1.0)
    return source


@pytest.mark.parametrize("init", ["stepwise", "average", "lower"])
@pytest.mark.parametrize("pre_ln", [False, True], ids=["post-LN", "pre-LN"])
def test_full_rank_conversion_is_the_source_exactly(init, pre_ln):
    source = _trained_vanilla(normalize_before=pre_ln)
    target = build_stack(
        _cfg(num_unique=2, lora_rank=16, norms_per_level=True, normalize_before=pre_ln)
    )
    relax_stack(source, target, init)
    assert (_run(target) - _run(source)).abs().max() <= 1e-5


def test_rank_zero_conversion_is_plain_sharing_of_the_chosen_layers():
    source = _trained_vanilla()
    target = build_stack(_cfg(num_unique=2, norms_per_level=True))
    relax_stack(source, target, "average")
    assert not any(parts.lora for parts in target.levels)
    want = (source.blocks[0].ffn.up.weight + source.blocks[2].ffn.up.weight) / 2
    torch.testing.assert_close(target.blocks[0].ffn.up.weight, want)
    low = build_stack(_cfg(num_unique=2, lora_rank=2, norms_per_level=True))
    relax_stack(source, low, "average")
    err = [(_run(t) - _run(source)).abs().max() for t in (target, low)]
    assert err[1] < err[0]  # a little rank recovers part of the source


def test_a_shared_source_is_untied_first_and_the_result_is_exact():
    source = build_stack(_cfg(num_unique=2, norms_per_level=True))
    _randomise(source, 0.2)
    target = build_stack(_cfg(num_unique=1, lora_rank=16, norms_per_level=True))
    relax_stack(source, target, "stepwise")
    assert (_run(target) - _run(source)).abs().max() <= 1e-5


def test_conversion_refuses_what_it_cannot_start():
    ringformer = build_stack(_cfg(signal=SignalConfig(kind="lowrank", rank=2)))
    target = build_stack(_cfg(num_unique=1, lora_rank=2))
    with pytest.raises(ValueError, match="owns attn_signal"):
        relax_stack(ringformer, target)
    with pytest.raises(ValueError, match="has 3 levels, the source 4"):
        relax_stack(_trained_vanilla(), build_stack(_cfg(num_levels=3, num_unique=1)))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"lora_rank": 17}, "lora_rank=17: must lie between 0 (no relaxation) and embed_dim=16"),
        ({"lora_rank": -1}, "lora_rank=-1: must lie between 0"),
        (
            {"lora_rank": 2, "signal": SignalConfig(kind="lowrank", rank=2, attn="before")},
            "lora_rank=2: a level LoRA reads the input of the Q/K/V projection",
        ),
    ],
)
def test_impossible_ranks_fail_naming_the_setting(changes, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        _cfg(**changes)


def _both_ways(stack, seed: int = 0):
    """The stack decoded step by step in inference (a decoding session: LoRA folded) and its
    full pass with gradients on (the LoRA computed beside the shared linears)."""
    g = torch.Generator().manual_seed(seed)
    x, memory = torch.randn(2, 5, 16, generator=g), torch.randn(2, 7, 16, generator=g)
    mem = Memory(memory, torch.zeros(2, 7, dtype=torch.bool))
    cache, logs, steps = StackCache(), [], []
    with torch.no_grad():
        for t in range(x.size(1)):
            with count_dispatch() as log:
                steps.append(stack(x[:, t : t + 1], memory=mem, cache=cache).output)
            logs.append(log)
    with torch.enable_grad():
        beside = stack(x, memory=mem).output.detach()
    return torch.cat(steps, 1), beside, logs


@pytest.mark.parametrize("bias", [True, False], ids=["biases", "no-biases"])
def test_decoding_folds_every_levels_lora_into_its_linears(bias):
    """A decoding session runs each relaxed level's linears with W' + B A and b' + db (Relaxed
    Recursive Transformers eq. 3 by associativity): the output of the LoRA computed beside
    the shared linears, up to rounding. The folds are made at the session's first step and
    kept for its later steps; a change of weights between sessions (an optimizer step's kind,
    on a level's factors and on the shared block) is seen by the next session."""
    stack = build_stack(_cfg(num_unique=2, lora_rank=3, bias=bias))
    _randomise(stack)
    stack.eval()
    folded, beside, logs = _both_ways(stack)
    torch.testing.assert_close(folded, beside, atol=1e-5, rtol=1e-5)
    assert logs[0].ops["aten.baddbmm"] > 0  # the folds, at the first step
    assert all(log.ops["aten.baddbmm"] == 0 for log in logs[1:])  # kept by the session
    assert logs[1].total < logs[0].total
    with torch.no_grad():
        stack.levels[1].lora["ffn_down"].lowrank.up.data.add_(0.1)  # no version bump
        stack.blocks[0].self_attn.out_proj.weight.mul_(1.1)
        if bias:
            stack.levels[2].lora["cross_q"].bias.data.add_(0.5)
    changed, beside, _ = _both_ways(stack)
    torch.testing.assert_close(changed, beside, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(changed, folded)


def test_passes_without_a_cache_keep_nothing():
    """An evaluation pass without a cache computes the LoRA beside the linears: nothing is
    derived from the weights, so nothing can outlive them."""
    stack = build_stack(_cfg(num_unique=2, lora_rank=3)).eval()
    _randomise(stack)
    before = _run(stack)
    stack.levels[0].lora["qkv"].lowrank.up.data.add_(0.5)  # a write no version sees
    after = _run(stack)
    assert not torch.allclose(before, after)
    assert not any(isinstance(v, torch.Tensor) for m in stack.modules() for v in vars(m).values())
