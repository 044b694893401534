"""Recorded attention probabilities and mean attention distance (RingFormer Fig. 3, ViT D.7)."""

from __future__ import annotations

import math

import pytest
import torch

from recurnmt.analysis.attention_distance import (
    main,
    mean_attention_distance,
    model_attention_distance,
    patch_distances,
)
from recurnmt.analysis.attention_recorder import AttentionRecorder
from recurnmt.modules import AttentionTerms, SlicedGroups
from recurnmt.modules.attention import SelfAttention, _merge_heads, _split_heads
from recurnmt.vision.registry import create_model

# ------------------------------------------------------------------ recorded probabilities


def _outputs_from_probs(attn: SelfAttention, x: torch.Tensor, probs: torch.Tensor, terms=None):
    qkv = attn.project(x, terms or AttentionTerms())
    v = _split_heads(qkv.chunk(3, dim=-1)[2], attn.num_heads)
    return attn.out_proj(_merge_heads(probs @ v))


@pytest.mark.parametrize(
    "case",
    ["plain", "padding", "causal", "causal_padding", "qkv_delta", "qkv_input_delta", "bias"],
)
def test_recorded_probabilities_reproduce_the_sdpa_output(case):
    attn = SelfAttention(16, 4, causal="causal" in case).eval()
    x = torch.randn(3, 7, 16)
    pad = None
    if "padding" in case:
        pad = torch.zeros(3, 7, dtype=torch.bool)
        pad[1, :2] = True  # left padding
        pad[2, 5:] = True
    terms = AttentionTerms(
        bias=torch.randn(3, 4, 7, 7) if case == "bias" else None,
        qkv_delta=torch.randn(3, 7, 48) if case == "qkv_delta" else None,
        qkv_input_delta=torch.randn(3, 7, 3, 16) if case == "qkv_input_delta" else None,
    )
    out = attn(x, key_padding_mask=pad, terms=terms)  # SDPA: nothing is recorded
    with AttentionRecorder(attn) as rec:
        recorded_out = attn(x, key_padding_mask=pad, terms=terms)
    (probs,) = rec.probs
    assert probs.shape == (3, 4, 7, 7)
    assert torch.allclose(probs.sum(-1), torch.ones(3, 4, 7))
    recomputed = _outputs_from_probs(attn, x, probs, terms)
    if pad is not None:  # rows of padding queries are unused
        out, recomputed, recorded_out = out[~pad], recomputed[~pad], recorded_out[~pad]
    assert torch.allclose(out, recomputed, atol=1e-5)
    assert torch.allclose(out, recorded_out, atol=1e-5)
    if "causal" in case:
        assert probs[0].triu(1).abs().max() == 0


def test_recorder_sees_every_level_of_a_shared_stack_and_detaches():
    model = create_model("ringformer_vit_mini_patch4", img_size=16, in_chans=1, depth=4)
    for name, p in model.named_parameters():
        if "signal" in name:
            torch.nn.init.normal_(p, std=0.2)  # levels differ, as after training
    model.eval()
    seen = []
    hook = model.stack.blocks[0].self_attn.register_forward_hook(
        lambda m, args, kwargs, out: seen.append((args[0], kwargs, out)), with_kwargs=True
    )
    x = torch.randn(2, 1, 16, 16)
    with AttentionRecorder(model) as rec:
        model(x)
    hook.remove()
    assert rec.calls == 4 and len(rec.probs) == 4
    for probs, (h, kwargs, out) in zip(rec.probs, seen, strict=True):
        recomputed = _outputs_from_probs(model.stack.blocks[0].self_attn, h, probs, kwargs["terms"])
        assert torch.allclose(recomputed, out, atol=1e-5)
    assert not torch.allclose(rec.probs[0], rec.probs[3])
    assert not rec.probs[0].requires_grad
    # closed: the probes are gone and the fused path is back
    assert model.stack.blocks[0].self_attn.probes == []
    model(x)
    assert rec.calls == 4


def test_recorder_refuses_sliced_attention():
    attn = SelfAttention(8, 2)
    x = torch.randn(1, 4, 8)
    with AttentionRecorder(attn), pytest.raises(ValueError, match="sliced"):
        attn(x, terms=AttentionTerms(slicing=SlicedGroups(2)))


# ------------------------------------------------------------------- mean attention distance


def test_uniform_attention_on_a_known_grid_has_the_analytic_distance():
    # 2 x 2 patches of 4 pixels: from each patch, distances 0, 4, 4, 4 sqrt(2)
    dist = patch_distances((2, 2), (4, 4))
    probs = torch.full((1, 1, 5, 5), 0.2)  # class token + 4 patches, uniform
    expected = (0 + 4 + 4 + 4 * math.sqrt(2)) / 4
    assert mean_attention_distance(probs, dist).item() == pytest.approx(expected)
    # without renormalising, the class token's fifth counts as distance 0
    raw = mean_attention_distance(probs, dist, renormalize=False).item()
    assert raw == pytest.approx(0.2 * 4 * expected)
    # a 1 x 3 grid of 2 x 3 patches: column distances 0, 3, 6 pixels; mean over pairs 8/9 * 3
    probs = torch.full((2, 3, 3, 3), 1 / 3)
    mad = mean_attention_distance(probs, patch_distances((1, 3), (2, 3)), num_prefix_tokens=0)
    assert torch.allclose(mad, torch.full((2, 3), 8 / 3, dtype=torch.float64))


def test_attention_to_self_has_distance_zero():
    probs = torch.eye(10)[1:, 1:][None, None].expand(2, 3, 9, 9)  # 3 x 3 patches, no cls here
    mad = mean_attention_distance(probs, patch_distances((3, 3), (16, 16)), num_prefix_tokens=0)
    assert mad.abs().max() == 0


def test_model_distance_per_level_and_head():
    model = create_model("vit_mini_patch4", img_size=16, in_chans=1, num_classes=10)
    images = [torch.rand(3, 1, 16, 16), torch.rand(2, 1, 16, 16)]
    mad = model_attention_distance(model, images, progress=False)
    assert mad.shape == (6, 4)
    diameter = patch_distances((4, 4), (4, 4)).max().item()
    assert bool((mad > 0).all()) and bool((mad < diameter).all())


def test_sret_is_refused_with_a_reason():
    model = create_model("sret_mini", img_size=32, num_classes=10)
    with pytest.raises(ValueError, match="SReT"):
        model_attention_distance(model, [torch.rand(1, 3, 32, 32)], progress=False)


@pytest.mark.e2e
def test_cli_draws_figure_3_panels(tmp_path, capsys):
    out = tmp_path / "mad.png"
    report = main(
        ["--model", "vit_mini_patch4", "ringformer_vit_mini_patch4", "--num-images", "8"]
        + ["--no-progress", "-o", str(out), "--json", str(tmp_path / "mad.json")]
    )
    assert out.stat().st_size > 10_000 and (tmp_path / "mad.json").exists()
    assert [len(v) for v in report.values()] == [6, 6]
    assert "distance" in capsys.readouterr().out
