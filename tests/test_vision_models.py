"""Every registered vision model: shapes, finiteness, gradients, weight sharing, resolution."""

from __future__ import annotations

import copy
import sys
import types

import pytest
import torch
from torch import nn

import recurnmt.vision.registry as registry
from recurnmt.modules import AddAtEveryLevel, RecurrentStack
from recurnmt.vision import create_model, list_models
from recurnmt.vision.models import DVTCascade, MRLAResNet, RecursiveMixer, SReT

NUM_CLASSES = 7


def small_kwargs(name: str) -> dict:
    """Shrinks widths and image size but keeps each model's structure (levels, sharing,
    signals, NLL, LRC, groups), so every registered model runs in a fraction of a second."""
    if name.startswith("sret"):
        return dict(dims=(16, 32, 64), heads=(1, 2, 4), img_size=32, stem_dims=(8, 16))
    if "mixer" in name:
        return dict(embed_dim=32, token_dim=16, channel_dim=64, img_size=32, patch_size=8)
    if "resnet" in name:  # 1/8 of the widths (d_k = 32 still divides) and two blocks a stage:
        # a stage's first MRLA level and a recurrent one (the depths: test_vision_params)
        return dict(channels=(8, 16, 32, 64), stem_width=8, layers=(2, 2, 2, 2))
    if name.startswith("dvt"):  # a DVT cascade of three such ViTs on 2x2 / 3x3 / 4x4 tokens
        return dict(
            embed_dim=32, ffn_dim=64, num_heads=2, img_size=32, patch_size=8, grids=(2, 3, 4)
        )
    return dict(embed_dim=32, ffn_dim=64, num_heads=2, img_size=32, patch_size=8)


def build_small(name: str, **extra) -> nn.Module:
    return create_model(name, num_classes=NUM_CLASSES, **{**small_kwargs(name), **extra})


def stacks_of(model: nn.Module) -> list:
    """The level loops of a model: its RecurrentStacks."""
    if isinstance(model, SReT):
        return list(model.stages)
    if isinstance(model, DVTCascade):
        return [stage.stack for stage in model.stages]
    if isinstance(model, MRLAResNet):  # convolutional blocks, none shared
        return []
    return [model.stack]  # ViT family, Mixer


def perturb_zero_parameters(model: nn.Module) -> None:
    """Zero-initialised factors (RingFormer's up-projections, the last norm weight of timm's
    ResNet blocks) pass no gradient to their partner; give them values, as training would, so
    every parameter's gradient shows."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if (p.dim() > 1 or name.endswith("weight")) and not p.any():
                p.normal_(std=0.02)


def test_registry_lists_every_family():
    names = list_models()
    for expected in (
        "deit_tiny_patch16_224",
        "deit_tiny_recursive_patch16_224",
        "ringformer_vit_base_patch16_224",
        "uit_base_patch16_224",
        "owf_vit_base_patch16_224",
        "sret_t",
        "sret_tl",
        "sret_s",
        "sret_b",
        "sret_b_printed",
        "sret_ext",
        "recursive_mixer_b16_224",
    ):
        assert expected in names
    assert list_models("sret_*") == sorted(n for n in names if n.startswith("sret_"))
    with pytest.raises(KeyError, match="unknown vision model 'sret_xl'"):
        create_model("sret_xl")


@pytest.mark.parametrize("name", list_models())
def test_forward_shape_finite_and_every_parameter_gets_a_gradient(name):
    model = build_small(name).train()
    perturb_zero_parameters(model)
    # 4 images: with the paper models' stochastic depth (up to 0.2) a residual branch is
    # dropped for the whole batch, leaving its block without a gradient, with odds <= 0.2^4
    x = torch.randn(4, 3, 32, 32)
    out = model(x)
    assert out.shape == (4, NUM_CLASSES)
    assert torch.isfinite(out).all()
    if isinstance(model, DVTCascade):  # the earlier exits' heads feed only their own logits
        out = torch.cat(model.forward_exits(x))
    (out * torch.randn_like(out)).sum().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.any()]
    assert not missing, f"no gradient for {missing}"
    feats = model.forward_features(x)
    assert model.forward_head(feats, pre_logits=True).shape == (4, model.num_features)


@pytest.mark.parametrize("name", list_models())
def test_shared_blocks_are_one_object_per_unique_block(name):
    model = build_small(name)
    for stack in stacks_of(model):
        plan = stack.plan
        for level, block in enumerate(plan.block_of_level):
            first = plan.levels_of_block(block)[0]
            a, b = stack.block_of_level(level), stack.block_of_level(first)
            assert a is b
            for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
                assert pa is pb
        distinct = {id(stack.block_of_level(i)) for i in range(plan.num_levels)}
        assert len(distinct) == plan.num_unique
    # no parameter is registered twice under different names
    assert len(list(model.parameters())) == len(dict(model.named_parameters()))


@pytest.mark.parametrize(
    "name",
    [
        "recursive_vit_mini_patch4",
        "ringformer_vit_mini_patch4",
        "uit_mini_patch4",
        "owf_vit_mini_patch4",
        "sret_mini",
        "recursive_mixer_mini",
    ],
)
def test_weight_sharing_equals_the_untied_model(name):
    """A shared model computes what a model with separate copies of the weights computes."""
    model = build_small(name).eval()
    perturb_zero_parameters(model)
    untied = copy.deepcopy(model)
    if hasattr(model, "stack"):
        untied.stack = model.stack.untied()
    else:
        for i, stage in enumerate(model.stages):
            untied.stages[i] = stage.untied()
    untied.eval()
    tied_params = sum(p.numel() for p in model.parameters())
    assert sum(p.numel() for p in untied.parameters()) > tied_params
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(model(x), untied(x))


def test_naive_recursion_loops_each_block_in_a_row():
    model = create_model("deit_tiny_recursive_patch16_224", loops=3)
    assert model.stack.plan.block_of_level[:6] == (0, 0, 0, 1, 1, 1)
    assert model.stack.num_levels == 36  # SReT Table 1, "+2 naive recursion"


def test_signal_rank_shortcut():
    model = create_model("ringformer_vit_mini_patch4", signal_rank=4)
    assert model.stack.levels[0].attn_signal.rank == 4


def test_owf_shares_one_ffn_and_keeps_attention_apart():
    stack = build_small("owf_vit_mini_patch4").stack
    assert all(b.ffn is stack.blocks[0].ffn for b in stack.blocks)
    assert stack.blocks[0].self_attn is not stack.blocks[1].self_attn


def test_sret_groups_follow_the_loops():
    model = create_model("sret_t", img_size=64)
    groups = [tuple(p.slicing.groups if p.slicing else 1 for p in s.levels) for s in model.stages]
    assert groups == [(8, 2, 8, 2), (4, 1) * 5, (1, 1) * 3]
    assert all(s.levels[i].nll is not None for s in model.stages for i in range(len(s.levels)))


def test_uit_adds_positions_at_every_level(monkeypatch):
    model = build_small("uit_mini_patch4")
    seen = {}
    original = RecurrentStack.forward

    def spy(self, x, **kwargs):
        seen.update(kwargs)
        return original(self, x, **kwargs)

    monkeypatch.setattr(RecurrentStack, "forward", spy)
    model(torch.randn(1, 3, 32, 32))
    (positions,) = [h for h in seen["hooks"] if isinstance(h, AddAtEveryLevel)]
    assert positions.term.shape == (1, 17, 32)  # class token + 4 x 4 patches
    assert all(parts.level_embedding is not None for parts in model.stack.levels)


@pytest.mark.parametrize("name", ["vit_mini_patch4", "ringformer_vit_mini_patch4", "sret_mini"])
def test_other_resolutions_and_non_square_images(name):
    model = build_small(name).eval()
    out = model(torch.randn(1, 3, 64, 48))
    assert out.shape == (1, NUM_CLASSES) and torch.isfinite(out).all()


def test_set_img_size_interpolates_the_learned_position_table():
    model = build_small("vit_mini_patch4").eval()
    x = torch.randn(1, 3, 64, 64)
    on_the_fly = model(x)
    model.set_img_size(64)
    assert model.pos_embed.weight.shape == (1, 1 + 8 * 8, 32)
    torch.testing.assert_close(model(x), on_the_fly)
    sret = build_small("sret_mini")
    sret.set_img_size(64)
    assert sret.pos_embed.weight.shape == (1, 8 * 8, 16)


def test_shallow_branch_runs_each_block_once():
    model = build_small("sret_mini").eval()
    x = torch.randn(2, 3, 32, 32)
    assert model(x, shallow=True).shape == (2, NUM_CLASSES)
    assert not torch.allclose(model(x, shallow=True), model(x))
    vit = build_small("recursive_vit_mini_patch4").eval()
    assert vit.stack.plan.first_loop_levels() == [0, 2, 4]
    mixer = build_small("recursive_mixer_mini").eval()
    assert mixer(x, shallow=True).shape == (2, NUM_CLASSES)


def test_sliced_attention_evaluation_is_deterministic():
    model = build_small("sret_mini").eval()
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(model(x), model(x))


def test_mixer_refuses_a_different_token_count():
    mixer = build_small("recursive_mixer_mini")
    assert isinstance(mixer, RecursiveMixer)
    with pytest.raises(ValueError, match="built for 16"):
        mixer(torch.randn(1, 3, 64, 64))


def test_timm_registration_uses_prefixed_and_free_names(monkeypatch):
    """With a timm that imports, every model is registered; timm's own names are not taken."""
    entries: dict = {"deit_tiny_patch16_224": object()}
    timm = types.ModuleType("timm")
    models = types.ModuleType("timm.models")
    models.is_model = lambda name: name in entries
    models.register_model = lambda fn: entries.setdefault(fn.__name__, fn)
    timm.models = models
    monkeypatch.setitem(sys.modules, "timm", timm)
    monkeypatch.setitem(sys.modules, "timm.models", models)
    names = registry.register_with_timm()
    assert "recurnmt_deit_tiny_patch16_224" in names and "deit_tiny_patch16_224" not in names
    assert "sret_t" in names and "recurnmt_sret_t" in names
    model = entries["recurnmt_vit_mini_patch4"](pretrained=False, num_classes=3)
    assert model.num_classes == 3
    with pytest.raises(ValueError, match="no pretrained weights"):
        entries["sret_mini"](pretrained=True)


def test_vision_does_not_import_fairseq():
    import subprocess

    code = "import sys, recurnmt.vision.train; assert 'fairseq' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
