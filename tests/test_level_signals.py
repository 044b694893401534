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
        cfg = StackConfig(
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
