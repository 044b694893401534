"""RingFormer level signals (RingFormer eq. 5-7)."""

from __future__ import annotations

import pytest
import torch

from recurnmt.modules import FullRankSignal, LowRankSignal, build_signal


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
