"""Every attention path hands SDPA its masks in a form the fused kernels take.

PyTorch's flash kernel takes no mask at all (only ``is_causal``) and its memory-efficient kernel
takes a boolean or additive mask; a materialised T x S boolean mask works there too, but costs
T x S memory per call for nothing when the rule is "causal" or "these keys are padding". The
first tests record what every path of every model passes to
``torch.nn.functional.scaled_dot_product_attention``; the last ones run each path with only the
fused kernels allowed (on CUDA that is the real check: the math fallback is switched off, so a
mask that no fused kernel accepts fails the test).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import CausalBias

from recurnmt.modules import AttentionTerms, CrossAttention, KVCache, SelfAttention, SlicedGroups
from recurnmt.nmt.architectures import FAMILIES
from recurnmt.vision import create_model, list_models
from tests.nmt_helpers import batch, build, full_and_stepwise
from tests.vision_fixtures import small_kwargs

FUSED = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]


def mask_form(attn_mask, is_causal: bool) -> str:
    """How one SDPA call was masked: none, is_causal, lower-right (a CausalBias), key (a key
    mask broadcast over queries, boolean or additive), additive (a float T x S bias) or full (a
    boolean T x S)."""
    if is_causal:
        return "is_causal"
    if attn_mask is None:
        return "none"
    if isinstance(attn_mask, CausalBias):
        return "lower-right"
    if attn_mask.size(-2) == 1:  # broadcast over queries: boolean, or 0 / -inf
        return "key"
    return "full" if attn_mask.dtype == torch.bool else "additive"


@pytest.fixture
def sdpa_calls(monkeypatch) -> list[str]:
    """The mask form of every SDPA call made while the test runs."""
    calls: list[str] = []
    sdpa = F.scaled_dot_product_attention

    def recording(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, **kwargs):
        calls.append(mask_form(attn_mask, is_causal))
        # the real function while the call runs: a CausalBias dispatches on identity with
        # it, and its own inner SDPA call is not one of the model's
        F.scaled_dot_product_attention = sdpa
        try:
            return sdpa(
                q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, **kwargs
            )
        finally:
            F.scaled_dot_product_attention = recording

    monkeypatch.setattr(F, "scaled_dot_product_attention", recording)
    return calls


def _padding(b: int, t: int, device="cpu") -> torch.Tensor:
    pad = torch.zeros(b, t, dtype=torch.bool, device=device)
    pad[0, -2:] = True  # the first sentence is two tokens shorter
    return pad


def _run_path(path: str, device: torch.device, dtype: torch.dtype = torch.float32):
    """Runs one attention path; returns (output, reference without the fast path)."""
    torch.manual_seed(0)
    c, h, b, t = 32, 4, 2, 7
    x = torch.randn(b, t, c, device=device, dtype=dtype)
    pad = _padding(b, t, device)
    if path == "cross":
        attn = CrossAttention(c, h).to(device, dtype).eval()
        memory = attn.project_memory(torch.randn(b, 5, c, device=device, dtype=dtype), pad[:, :5])
        return attn(x, memory), None
    attn = SelfAttention(c, h, causal=path.startswith("causal")).to(device, dtype).eval()
    if path == "padded":
        return attn(x, key_padding_mask=pad), None
    if path == "causal":
        return attn(x), None
    if path == "causal-step":
        cache = KVCache()
        steps = [attn(x[:, i : i + 1], cache=cache) for i in range(t)]
        return torch.cat(steps, 1), attn(x)
    if path == "causal-chunk":  # three tokens first, then four at once on top of the cache
        cache = KVCache()
        first = attn(x[:, :3], cache=cache)
        return torch.cat([first, attn(x[:, 3:], cache=cache)], 1), attn(x)
    if path == "sliced":  # 7 tokens in 2 slices: an odd slot and a padded sentence
        terms = AttentionTerms(slicing=SlicedGroups(2, permute=True, seed=1))
        return attn(x, key_padding_mask=pad, terms=terms), None
    if path == "bias":  # DVT eq. 9: an additive term on the logits
        bias = torch.randn(b, h, t, t, device=device, dtype=dtype)
        return attn(x, terms=AttentionTerms(bias=bias)), None
    raise ValueError(path)


PATHS = {
    "padded": ["key"],
    "cross": ["key"],
    "causal": ["is_causal"],
    "causal-step": ["none"] * 7 + ["is_causal"],
    # several queries on a cache: a boolean band on the CPU (torch's bias costs more there),
    # torch's lower-right causal bias on CUDA (test_speculative's simulated device, and
    # test_each_path_runs_on_the_fused_kernels_alone there)
    "causal-chunk": ["is_causal", "full", "is_causal"],
    "sliced": ["key"],
    "bias": ["additive"],
}


@pytest.mark.parametrize("path", sorted(PATHS))
def test_each_path_passes_the_mask_form_fused_kernels_take(path, sdpa_calls):
    out, reference = _run_path(path, torch.device("cpu"))
    assert sdpa_calls == PATHS[path]
    assert torch.isfinite(out).all()
    if reference is not None:  # the cached paths equal the full causal pass
        torch.testing.assert_close(out, reference, atol=1e-5, rtol=1e-5)


def test_a_cached_chunk_on_a_cpu_takes_one_band_for_every_level_and_mode():
    """Several queries on top of a cache (speculative verification): the lower-right band,
    made once for the levels of a pass that share its sizes, a mask of its own under
    inference_mode (an inference tensor that autograd outside it refuses); torch's causal
    bias, a tensor subclass dispatched in Python, only on CUDA."""
    from recurnmt.modules import attention

    cpu = torch.device("cpu")
    band = attention.causal_lower_right(3, 7, cpu)
    assert band.dtype == torch.bool and band.tolist() == [
        [True] * 5 + [False] * 2, [True] * 6 + [False], [True] * 7
    ]  # fmt: skip
    assert attention.causal_lower_right(3, 7, cpu) is band  # the next level's
    with torch.inference_mode():
        inner = attention.causal_lower_right(3, 7, cpu)
    assert inner is not band and inner.is_inference() and not band.is_inference()
    if torch.cuda.is_available():
        assert isinstance(attention.causal_lower_right(3, 7, torch.device("cuda")), CausalBias)


def test_sliced_key_mask_keeps_padding_out_and_rows_finite():
    torch.manual_seed(0)
    attn = SelfAttention(16, 2).eval()
    x = torch.randn(2, 9, 16)
    pad = torch.zeros(2, 9, dtype=torch.bool)
    pad[1, 3:] = True  # six padding tokens: with 4 slices some slices hold padding only
    terms = AttentionTerms(slicing=SlicedGroups(4, permute=False))
    out = attn(x, key_padding_mask=pad, terms=terms)
    assert torch.isfinite(out).all()
    changed = x.clone()
    changed[1, 3:] = torch.randn(6, 16)  # padding content must not reach the real tokens
    again = attn(changed, key_padding_mask=pad, terms=terms)
    torch.testing.assert_close(again[:, :3], out[:, :3])


def test_only_interior_target_padding_materialises_a_query_by_key_mask(sdpa_calls):
    attn = SelfAttention(16, 2, causal=True).eval()
    pad = torch.tensor([[False, True, False, False]])  # a real token after padding
    out = attn(torch.randn(1, 4, 16), key_padding_mask=pad)
    assert sdpa_calls == ["full"] and torch.isfinite(out).all()


@pytest.mark.parametrize("family", FAMILIES)
def test_translation_families_use_no_query_by_key_mask(family, sdpa_calls):
    """Training, full decoding and step-by-step decoding of every family, with a padded
    source: causal as is_causal, padding as key masks, nothing materialised."""
    model, _, _ = build(f"{family}_tiny")
    src, lengths, prev = batch()
    model.train()(src, lengths, prev)
    full_and_stepwise(model.eval(), src, lengths, prev)
    assert sdpa_calls and set(sdpa_calls) <= {"none", "is_causal", "key"}, set(sdpa_calls)


@pytest.mark.parametrize("name", list_models())
def test_vision_models_use_no_query_by_key_mask(name, sdpa_calls):
    model = create_model(name, num_classes=5, **small_kwargs(name)).eval()
    with torch.no_grad():
        model(torch.randn(2, 3, 32, 32))
    # DVT's relationship reuse is an additive logit term (DVT eq. 9); nothing else is masked
    allowed = {"none", "key", "additive"} if name.startswith("dvt") else {"none", "key"}
    assert set(sdpa_calls) <= allowed, set(sdpa_calls)


@pytest.mark.parametrize("path", sorted(PATHS))
def test_each_path_runs_on_the_fused_kernels_alone(path, device):
    """Only flash and memory-efficient attention allowed: SDPA raises when neither takes the
    call. The result equals the unrestricted call's (which may use the math kernel)."""
    expected, _ = _run_path(path, device)
    with sdpa_kernel(FUSED):
        out, reference = _run_path(path, device)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4)
    if reference is not None:
        torch.testing.assert_close(out, reference, atol=1e-5, rtol=1e-4)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("path", sorted(PATHS))
def test_each_path_runs_on_the_fused_kernels_in_half_precision(path, dtype):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device on this machine (fused half-precision kernels are CUDA's)")
    device = torch.device("cuda")
    with sdpa_kernel(FUSED):
        out, reference = _run_path(path, device, dtype)
    full, _ = _run_path(path, device)  # fp32
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), full, atol=2e-2, rtol=2e-2)
    if reference is not None:
        torch.testing.assert_close(out, reference, atol=2e-2, rtol=2e-2)
