"""Every NMT family in reduced precision: bf16 on the CPU, fp16 too on CUDA.

Two ways of running a model in half precision, both tested:

* a half-precision model, as fairseq's ``--fp16`` / ``--bf16`` make it (``model.half()`` /
  ``model.to(torch.bfloat16)``; fairseq keeps float32 master weights in its optimizer);
* float32 weights under ``torch.autocast``, as fairseq's ``--amp`` (fp16 on CUDA).

Then the quantities that reduced precision would get wrong: ACT's cumulative halting
probability (computed in float32 by ``recurnmt.modules.halting``), SReT's learnable residual
coefficients and RingFormer's level signals (their gradients, and the coefficients' updates).
"""

from __future__ import annotations

import pytest
import torch

from recurnmt.nmt.architectures import FAMILIES
from tests.nmt_helpers import batch, build, full_and_stepwise, train_signals

HALF = {"bf16": torch.bfloat16, "fp16": torch.float16}
PRECISIONS = ["fp32", "bf16", "fp16"]


def _dtype(precision: str, device: torch.device) -> torch.dtype:
    if precision == "fp16" and device.type == "cpu":
        pytest.skip("fp16 is the CUDA half precision (fairseq's --fp16 needs CUDA); bf16 on CPU")
    return HALF.get(precision, torch.float32)


def _model(family: str, device: torch.device):
    model, _, _ = build(f"{family}_tiny")
    train_signals(model)  # RingFormer's signals non-zero, so their down factors get gradients
    return model.to(device)


def _loss(model, device: torch.device) -> torch.Tensor:
    src, lengths, prev = (t.to(device) for t in batch())
    logits, _ = model(src, lengths, prev)
    return logits.float().log_softmax(-1).mean()


def _assert_finite_gradients(model) -> None:
    grads = {n: p.grad for n, p in model.named_parameters()}
    missing = [n for n, g in grads.items() if g is None or not g.abs().sum()]
    assert not missing, missing  # every parameter takes part, in every precision
    bad = [n for n, g in grads.items() if not torch.isfinite(g).all()]
    assert not bad, bad


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.smoke
def test_every_family_trains_a_step_in_each_precision(family, precision, device):
    """Forward and backward of every family: a half-precision model (fairseq --fp16/--bf16)
    and float32 weights under autocast (fairseq --amp) give finite losses and gradients."""
    dtype = _dtype(precision, device)
    model = _model(family, device).train()
    reference = _loss(model, device)
    if dtype is torch.float32:
        reference.backward()
        _assert_finite_gradients(model)
        return
    # losses scaled as fairseq's FP16 optimizer starts (--fp16-init-scale 128): small fp16
    # gradients would otherwise underflow to zero
    with torch.autocast(device.type, dtype=dtype):
        loss = _loss(model, device)
    (loss * 128).backward()
    _assert_finite_gradients(model)
    model.zero_grad(set_to_none=True)
    half = model.to(dtype)
    assert next(half.parameters()).dtype is dtype
    half_loss = _loss(half, device)
    (half_loss * 128).backward()
    _assert_finite_gradients(half)
    # a mean log-probability of about -4.5, to one bf16 step there (2^-6 = 0.016; the
    # logits' rounding errors largely cancel in the mean: measured at most 0.003 on the CPU)
    for value in (loss, half_loss):
        assert value.item() == pytest.approx(reference.item(), abs=0.02)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_step_by_step_decoding_equals_full_pass_in_bf16(family, device):
    model = _model(family, device).eval().to(torch.bfloat16)
    src, lengths, prev = (t.to(device) for t in batch())
    full, steps, _, _ = full_and_stepwise(model, src, lengths, prev)
    assert full.dtype is steps.dtype is torch.bfloat16
    # bf16 has 8 significant bits, so one rounding moves a logit of magnitude < 8 by up to
    # 2^-6 = 0.016; a step that multiplies other shapes (one query instead of six) may round
    # several sums differently: 0.05 allows about three such steps. Measured on the CPU: 0.
    torch.testing.assert_close(steps, full, atol=0.05, rtol=2**-7)
    fp32, _, _, _ = full_and_stepwise(model.float(), src, lengths, prev)
    # and the bf16 model tracks float32: logits of magnitude up to about 5 (measured: 0.04)
    torch.testing.assert_close(full.float(), fp32, atol=0.15, rtol=2**-6)


def _naive_levels(p: torch.Tensor, threshold: float = 0.99) -> int:
    """Levels run by ACT bookkeeping kept in p's dtype, as without float32 accumulation."""
    total = torch.zeros((), dtype=p.dtype)
    for level, p_t in enumerate(p):
        if level == len(p) - 1 or total + p_t > threshold:
            return level + 1
        total = total + p_t
    raise AssertionError("unreachable")


def test_halting_accumulates_bf16_probabilities_in_float32():
    """A position whose cumulative probability nears 0.99 by small steps: in bf16 the sum
    stops growing (0.984 + 0.0015 rounds back to 0.984) and the position would run to the last
    level; the float32 bookkeeping halts it where float32 does."""
    from recurnmt.modules.halting import HaltingAccumulator

    p = torch.tensor([0.984375] + [0.0015] * 7, dtype=torch.bfloat16)  # 8 levels
    assert _naive_levels(p) == 8
    assert _naive_levels(p.float()) == 5  # 0.984 + 4 x 0.0015 > 0.99
    runs = {}
    for dtype in (torch.bfloat16, torch.float32):
        acc = HaltingAccumulator(torch.zeros(1, 1, 4, dtype=dtype))
        for level, p_t in enumerate(p.to(dtype)):
            weights = acc.weights(p_t.view(1, 1), last=level == len(p) - 1)
            acc.accumulate(torch.full((1, 1, 4), float(level), dtype=dtype), weights)
        assert acc.output.dtype is dtype
        runs[dtype] = (acc.n_updates.item(), acc.ponder_cost.item(), acc.output)
    assert runs[torch.bfloat16][0] == runs[torch.float32][0] == 5
    assert runs[torch.bfloat16][1] == pytest.approx(runs[torch.float32][1], abs=1e-6)
    # the mixture, accumulated in float32, is rounded once to bf16 (8 significant bits)
    out_bf16, out_fp32 = runs[torch.bfloat16][2].float(), runs[torch.float32][2]
    torch.testing.assert_close(out_bf16, out_fp32, atol=0, rtol=2**-8)


def test_bf16_act_model_halts_at_the_float32_level(device):
    """A universal_transformer_act model whose halting unit gives every position the same
    p = sigmoid(-0.7109375) = 0.3294 at every level: float32 halts after 4 levels (3p =
    0.9882 <= 0.99). Computed in bf16 (p rounds to 0.3301, 3p to 0.9922, the threshold to
    0.9883) every position would halt after 3; the bf16 model halts after 4, like float32."""
    bias = -0.7109375  # exact in bf16, so both models hold the same halting unit
    p = torch.sigmoid(torch.tensor([bias] * 6, dtype=torch.bfloat16))
    assert _naive_levels(p) == 3 and _naive_levels(torch.sigmoid(torch.tensor([bias] * 6))) == 4
    model, _, _ = build("universal_transformer_act_tiny", "--decoder-layers", "6")
    unit = model.decoder.stack.halting
    torch.nn.init.zeros_(unit.proj.weight)
    torch.nn.init.constant_(unit.proj.bias, bias)
    model.to(device).eval()
    src, lengths, prev = (t.to(device) for t in batch())
    ponder = {}
    for dtype in (torch.float32, torch.bfloat16):
        with torch.no_grad():
            model.to(dtype)
            _, extra = model.decoder(prev, model.encoder(src, lengths))
        ponder[dtype] = extra["ponder"]
    assert ponder[torch.bfloat16].dtype is torch.float32
    assert (ponder[torch.float32].floor() == 4).all()  # N = 4 levels, R = 1 - 3p in N + R
    torch.testing.assert_close(ponder[torch.bfloat16], ponder[torch.float32])


def test_act_halting_stays_float32_under_autocast():
    from recurnmt.modules.halting import HaltingUnit

    unit = HaltingUnit(8)
    state = torch.randn(2, 3, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        p = unit(state)
    assert p.dtype is torch.float32
    torch.testing.assert_close(p, unit(state))


def _grads(model, device, names: str) -> torch.Tensor:
    model.zero_grad(set_to_none=True)
    _loss(model, device).backward()
    return torch.cat([p.grad.float().flatten() for n, p in model.named_parameters() if names in n])


@pytest.mark.parametrize(
    ("family", "names"),
    [("ringformer", "signal"), ("sret", "lrc"), ("relaxed_transformer", ".lora.")],
)
def test_bf16_gradients_of_signals_and_residual_coefficients_follow_float32(family, names, device):
    """RingFormer's level signals and a relaxed model's LoRA (zero-initialised up factors
    included) and SReT's residual coefficients get the float32 gradient, to bf16 rounding, in
    a bf16 model. Their products
    are rounded once to bf16 with the branch they scale, like any weight's: no float32 path
    would change what the next layer reads."""
    model = _model(family, device).train()
    for n, p in model.named_parameters():  # the signals as the first updates see them:
        if n.endswith(("signal.up", "lowrank.up")):  # the low-rank up factors start at zero
            torch.nn.init.zeros_(p)
    fp32 = _grads(model, device, names)
    half = _grads(model.to(torch.bfloat16), device, names)
    assert fp32.numel() > 0 and torch.isfinite(half).all()
    cosine = torch.nn.functional.cosine_similarity(fp32, half, dim=0)
    assert cosine > 0.999, cosine.item()  # measured on the CPU: 0.9999 for both


def test_residual_coefficient_updates_need_float32_master_weights():
    """Why fairseq's --fp16/--bf16/--amp (float32 master copies in the optimizer) suit SReT's
    LRC and --memory-efficient-fp16/-bf16 (parameters updated in half precision) do not: an
    Adam step of 1e-3 on a coefficient of 1 is lost in bf16 (numbers just below 1 lie 2^-8
    apart) and rounded to 2^-10 in fp16 (2^-11 apart)."""
    from fairseq.optim.adam import Adam

    moved = {}
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        coefficient = torch.nn.Parameter(torch.ones(1, dtype=dtype))
        coefficient.grad = torch.ones(1, dtype=dtype)
        Adam([coefficient], lr=1e-3).step()  # fairseq's Adam: float32 maths, cast back
        moved[dtype] = 1.0 - coefficient.item()
    assert moved[torch.float32] == pytest.approx(1e-3, rel=1e-3)
    assert moved[torch.bfloat16] == 0.0
    assert moved[torch.float16] == pytest.approx(2**-10)
