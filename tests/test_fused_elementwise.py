"""The fused element-wise ops of the shared stack: dropout with a boolean CPU mask
(recurnmt.modules.dropout) and the LRC weighted sum (recurnmt.modules.residual)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from recurnmt.modules.dropout import Dropout, dropout, keep_mask
from recurnmt.modules.residual import ResidualCoefficients, weighted_sum


def saved_dtypes(fn):
    """dtypes of the tensors autograd saves while ``fn()`` runs."""
    dtypes = []

    def pack(t):
        dtypes.append(t.dtype)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, dtypes


def test_dropout_keeps_each_element_with_probability_1_minus_p_and_scales_it():
    torch.manual_seed(0)
    x = torch.rand(400, 500) + 1.0  # no zeros of its own
    p = 0.3
    y = dropout(x, p)
    kept = y != 0
    assert abs(kept.float().mean().item() - (1 - p)) < 0.005  # 200k draws: sd 0.001
    torch.testing.assert_close(y[kept], x[kept] / (1 - p))


@pytest.mark.parametrize("p", [0.02, 0.5, 0.9])
def test_keep_mask_probability_for_odd_sizes_and_any_shape(p):
    torch.manual_seed(1)
    x = torch.empty(3, 333, 201)  # 200,799 elements: an odd count, half of a 64-bit draw left
    mask = keep_mask(x, p)
    assert mask.shape == x.shape and mask.dtype == torch.bool
    sd = (p * (1 - p) / x.numel()) ** 0.5
    assert abs(mask.float().mean().item() - (1 - p)) < 5 * sd
    # the two 32-bit halves of a draw are independent: neighbours agree as often as chance
    flat = mask.flatten()[: x.numel() - 1].float()
    both = (flat[0::2] * flat[1::2]).mean().item()
    assert abs(both - (1 - p) ** 2) < 0.01
    assert keep_mask(torch.empty(0, 4), p).shape == (0, 4)
    assert keep_mask(x, 0.0).all() and not keep_mask(x, 1.0).any()


def test_dropout_gradient_uses_the_forward_mask_and_keeps_a_boolean_mask():
    torch.manual_seed(0)
    x = torch.randn(64, 32, requires_grad=True)
    y, dtypes = saved_dtypes(lambda: dropout(x, 0.25))
    assert dtypes == [torch.bool]  # 1 byte an element for backward, not a float mask
    g = torch.randn_like(y)
    y.backward(g)
    torch.testing.assert_close(x.grad, torch.where(y != 0, g / 0.75, 0.0))


def test_dropout_same_seed_same_mask_and_eval_identity():
    x = torch.randn(8, 16)
    torch.manual_seed(3)
    a = dropout(x, 0.5)
    torch.manual_seed(3)
    b = dropout(x, 0.5)
    assert torch.equal(a, b)
    module = Dropout(0.5).eval()
    assert module(x) is x
    assert dropout(x, 0.0) is x
    assert torch.equal(dropout(x, 1.0), torch.zeros_like(x))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
def test_dropout_other_dtypes_are_torch_dropout(dtype):
    x = torch.randn(32, 32, dtype=dtype)
    torch.manual_seed(1)
    ours = dropout(x, 0.2)
    torch.manual_seed(1)
    assert torch.equal(ours, nn.functional.dropout(x, 0.2))


def test_dropout_module_is_a_torch_dropout():
    module = Dropout(0.1)
    assert isinstance(module, nn.Dropout) and module.p == 0.1
    assert repr(module) == repr(nn.Dropout(0.1))
    assert module.state_dict() == {}


def plain(skip, main, a, b):
    return (a * skip if a is not None else skip) + (b * main if b is not None else main)


@pytest.mark.parametrize("mode", ["both", "identity", "main", "none"])
def test_weighted_sum_values_and_gradients_match_plain_autograd(mode):
    torch.manual_seed(0)
    lrc = ResidualCoefficients(3, mode)
    with torch.no_grad():
        for p in lrc.parameters():
            p.uniform_(0.5, 1.5)
    skip = torch.randn(4, 7, 16, requires_grad=True)
    main = torch.randn(4, 7, 16, requires_grad=True)
    g = torch.randn(4, 7, 16)
    out = lrc(skip, main, 1)
    out.backward(g)
    grads = [skip.grad, main.grad] + [p.grad for p in lrc.parameters()]
    skip.grad = main.grad = None
    lrc.zero_grad()
    a = lrc.skip[1] if lrc.skip is not None else None
    b = lrc.main[1] if lrc.main is not None else None
    expected = plain(skip, main, a, b)
    expected.backward(g)
    torch.testing.assert_close(out, expected)
    refs = [skip.grad, main.grad] + [p.grad for p in lrc.parameters()]
    for ours, ref in zip(grads, refs, strict=True):
        torch.testing.assert_close(ours, ref)


@pytest.mark.parametrize("mode", ["both", "identity", "main", "none"])
def test_inference_reads_the_coefficients_without_indexing_and_sees_every_update(mode):
    from recurnmt.analysis.dispatch import count_dispatch

    lrc = ResidualCoefficients(3, mode)
    skip, main = torch.randn(2, 5, 8), torch.randn(2, 5, 8)

    def expected(index):
        a = lrc.skip[index].detach() if lrc.skip is not None else None
        b = lrc.main[index].detach() if lrc.main is not None else None
        return plain(skip, main, a, b)

    with torch.no_grad():
        lrc(skip, main, 0)  # the views are made on the first call
        with count_dispatch() as log:
            out = lrc(skip, main, 2)
        assert "aten.select" not in log.ops, log.ops
        torch.testing.assert_close(out, expected(2))
        for p in lrc.parameters():  # an optimizer's in-place step
            p.mul_(1.5).add_(0.25)
        torch.testing.assert_close(lrc(skip, main, 1), expected(1))
    lrc.double()  # new storage: new views
    skip, main = skip.double(), main.double()
    with torch.no_grad():
        out = lrc(skip, main, 1)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, expected(1))


def test_weighted_sum_gradcheck():
    torch.manual_seed(0)
    args = [torch.randn(3, 5, dtype=torch.float64, requires_grad=True) for _ in range(2)]
    coefs = [torch.randn((), dtype=torch.float64, requires_grad=True) for _ in range(2)]
    assert torch.autograd.gradcheck(weighted_sum, (*args, *coefs))
    assert torch.autograd.gradcheck(lambda s, m, a: weighted_sum(s, m, a, None), (*args, coefs[0]))


def test_weighted_sum_keeps_bf16_activations_and_fp32_coefficient_gradients():
    torch.manual_seed(0)
    skip = torch.randn(16, 64, 32).bfloat16().requires_grad_()
    main = torch.randn(16, 64, 32).bfloat16().requires_grad_()
    a = torch.tensor(0.9, requires_grad=True)
    b = torch.tensor(1.1, requires_grad=True)
    out = weighted_sum(skip, main, a, b)
    assert out.dtype == torch.bfloat16
    assert out.dtype == plain(skip, main, a, b).dtype
    out.float().sum().backward()
    assert a.grad.dtype == b.grad.dtype == torch.float32
    torch.testing.assert_close(a.grad, skip.double().sum().float(), rtol=1e-5, atol=1e-3)
    torch.testing.assert_close(b.grad, main.double().sum().float(), rtol=1e-5, atol=1e-3)


def test_weighted_sum_broadcasts_like_plain_arithmetic():
    skip = torch.randn(2, 3, 4, requires_grad=True)
    main = torch.randn(1, 3, 4, requires_grad=True)
    a = torch.tensor(0.5, requires_grad=True)
    torch.testing.assert_close(weighted_sum(skip, main, a, None), 0.5 * skip + main)
