"""RingFormer level signals (RingFormer eq. 5-7)."""

from __future__ import annotations

import pytest
import torch

from recurnmt.modules import (
    ConfigError,
    FullRankSignal,
    LowRankSignal,
    SignalConfig,
    StackConfig,
    build_signal,
    build_stack,
)


def test_signal_is_zero_at_initialisation():
    sig = LowRankSignal(32, 32, rank=4, groups=3)
    assert torch.count_nonzero(sig(torch.randn(2, 5, 32))) == 0
    assert torch.count_nonzero(FullRankSignal(32, 32)(torch.randn(2, 5, 32))) == 0


def test_signal_is_computed_in_rank_space():
    sig = LowRankSignal(64, 64, rank=4, groups=3)
    shapes = sorted(tuple(p.shape) for p in sig.parameters())
    assert shapes == [(3, 64, 4), (12, 64)]  # never a 64 x 64 matrix
    assert sum(p.numel() for p in sig.parameters()) == 3 * 2 * 64 * 4


@pytest.mark.parametrize("lead", [(4,), (2, 3)], ids=["N x C", "B x T x C"])
def test_grouped_signal_equals_separate_products(lead):
    sig = LowRankSignal(16, 16, rank=2, groups=3)
    torch.nn.init.normal_(sig.up)
    x = torch.randn(*lead, 16)
    out = sig(x).view(*lead, 3, 16)
    down = sig.down.view(3, 2, 16)
    for g in range(3):
        m = sig.up[g] @ down[g]  # M_g = A_g B_g^T, 16 x 16 (eq. 5), formed only in the test
        torch.testing.assert_close(out[..., g, :], x @ m.t(), atol=1e-5, rtol=1e-5)


def test_every_factor_learns():
    sig = LowRankSignal(8, 8, rank=2)
    sig(torch.randn(3, 8)).sum().backward()
    assert sig.up.grad.abs().sum() > 0  # the zero factor gets a gradient at step 0


def test_inter_ffn_signal_maps_to_ffn_width():
    sig = build_signal("lowrank", 8, 32, rank=2)
    assert sig(torch.randn(5, 8)).shape == (5, 32)


@pytest.mark.parametrize("rank", [0, -1, 9])
def test_impossible_rank_is_refused(rank):
    with pytest.raises(ValueError, match=f"rank={rank}"):
        LowRankSignal(8, 8, rank=rank)


def test_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="'static'"):
        build_signal("static", 8, 8, 2)


def test_down_factor_starts_as_the_authors_code_by_default():
    """RingFormer's code (model_Ring.py, vringformer.py): up factors zero, down factors
    N(0, 1e-6); the paper itself says only that the up factor starts at zero."""
    torch.manual_seed(0)
    sig = LowRankSignal(256, 256, rank=16, groups=3)
    assert not sig.up.any()
    assert sig.down.std().item() == pytest.approx(1e-6, rel=0.05)
    assert sig.down.abs().max().item() < 1e-5


def test_kaiming_down_factor_is_loras_code():
    """LoRA's code: kaiming_uniform_(a=sqrt(5)), i.e. uniform in +-1/sqrt(fan_in)."""
    torch.manual_seed(0)
    sig = LowRankSignal(256, 256, rank=16, down_init="kaiming")
    bound = 1 / 256**0.5
    assert sig.down.abs().max().item() <= bound
    assert sig.down.std().item() == pytest.approx(bound / 3**0.5, rel=0.05)
    custom = LowRankSignal(64, 64, rank=4, down_std=0.02)
    assert custom.down.std().item() == pytest.approx(0.02, rel=0.2)


def test_down_init_reaches_every_signal_of_a_stack():
    def downs(**signal):
        cfg = StackConfig.from_options(
            embed_dim=64,
            ffn_dim=128,
            num_heads=4,
            num_levels=2,
            num_unique=1,
            signal=SignalConfig(kind="lowrank", rank=4, **signal),
        )
        stack = build_stack(cfg)
        return [
            getattr(level, name).down
            for level in stack.levels
            for name in ("attn_signal", "ffn_signal")
        ]

    assert all(d.abs().max() < 1e-5 for d in downs())
    assert all(d.abs().max() > 1e-3 for d in downs(down_init="kaiming"))
    assert all(d.abs().max() > 1e-3 for d in downs(down_std=0.1))


def test_unknown_down_init_is_refused():
    with pytest.raises(ValueError, match="down_init='zero'"):
        LowRankSignal(8, 8, rank=2, down_init="zero")
    with pytest.raises(ConfigError, match="signal.down_init"):
        StackConfig(signal=SignalConfig(kind="lowrank", down_init="zero"))
    with pytest.raises(ConfigError, match="signal.down_std"):
        StackConfig(signal=SignalConfig(kind="lowrank", down_std=-1.0))


def _trained_signal_stack(attn: str, ffn: str, cross: bool = False):
    cfg = StackConfig.from_options(
        embed_dim=32,
        ffn_dim=64,
        num_heads=4,
        num_levels=3,
        num_unique=1,
        dropout=0.0,
        causal=cross,
        cross_attention=cross,
        signal=SignalConfig(kind="lowrank", rank=4, attn=attn, ffn=ffn),
    )
    stack = build_stack(cfg)
    g = torch.Generator().manual_seed(0)
    for level in stack.levels:
        for sig in (level.attn_signal, level.ffn_signal):
            with torch.no_grad():  # as if trained: both factors non-zero
                sig.up.copy_(torch.randn(sig.up.shape, generator=g) * 0.3)
                sig.down.copy_(torch.randn(sig.down.shape, generator=g) * 0.3)
    return stack


@pytest.mark.parametrize(
    "attn,ffn", [("after", "input"), ("before", "inter")], ids=["eq. 6-7", "Table 4"]
)
def test_decoding_folds_the_signals_into_the_weights(attn, ffn, monkeypatch):
    """A decoding session folds each level's signals into the weights of the projections they
    feed (W + A B^T after a projection, W (I + A B^T) on its input): the same map as the
    rank-space products training runs, computed without them. A pass without a cache
    computes them in rank space."""
    from recurnmt.modules.decoding.cache import StackCache
    from recurnmt.modules.stack import Memory

    stack = _trained_signal_stack(attn, ffn, cross=True)
    x, memory = torch.randn(2, 5, 32), Memory(torch.randn(2, 6, 32), None, 1)
    stack.train()  # dropout 0: training mode computes the same function, in rank space
    expected = stack(x, memory=memory).output.detach()
    stack.eval()
    with torch.no_grad():
        torch.testing.assert_close(stack(x, memory=memory).output, expected)
        monkeypatch.setattr(LowRankSignal, "forward", lambda *a: pytest.fail("not folded"))
        cache = StackCache()
        steps = [stack(x[:, t : t + 1], memory=memory, cache=cache).output for t in range(5)]
    torch.testing.assert_close(torch.cat(steps, 1), expected, atol=1e-5, rtol=1e-5)


def test_folded_weight_is_the_same_linear_map():
    """W + A B^T for a signal after the projection, W (I + A B^T) for one on its input, per
    group of a fused projection; differentiable in the factors."""
    sig = LowRankSignal(8, 8, rank=2, groups=3)
    torch.nn.init.normal_(sig.up)
    weight, x = torch.randn(24, 8), torch.randn(5, 8)
    after = sig.folded_weight(weight, into_input=False)
    torch.testing.assert_close(x @ after.T, x @ weight.T + sig(x), atol=1e-5, rtol=1e-5)
    before = sig.folded_weight(weight, into_input=True)
    delta = sig(x).view(5, 3, 8)  # each projection's own input term
    want = torch.cat([(x + delta[:, g]) @ weight[8 * g : 8 * (g + 1)].T for g in range(3)], 1)
    torch.testing.assert_close(x @ before.T, want, atol=1e-5, rtol=1e-5)
    after.sum().backward()
    assert sig.up.grad is not None and sig.down.grad is not None
    assert not any(isinstance(v, torch.Tensor) for v in vars(sig).values())  # nothing kept


def test_step_by_step_decoding_with_folded_signals_equals_the_full_pass():
    from recurnmt.modules.decoding.cache import StackCache
    from recurnmt.modules.stack import Memory

    stack = _trained_signal_stack("after", "input", cross=True).eval()
    x, memory = torch.randn(2, 4, 32), torch.randn(2, 6, 32)
    with torch.no_grad():
        full = stack(x, memory=Memory(memory, None, 1)).output
        cache = StackCache()
        steps = [
            stack(x[:, t : t + 1], memory=Memory(memory, None, 1), cache=cache).output
            for t in range(x.size(1))
        ]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)
