"""Every registered vision model: shapes, finiteness, gradients, weight sharing, resolution."""

from __future__ import annotations

import copy
import sys

import pytest
import timm
import torch
from timm.data import resolve_data_config
from timm.optim import create_optimizer_v2
from torch import nn

from recurnmt.modules import AddAtEveryLevel, RecurrentStack, shallow_branch
from recurnmt.vision import create_model, list_models, register_with_timm
from recurnmt.vision.models import DVTCascade, MRLAResNet, RecursiveMixer, SReT
from recurnmt.vision.models.vit import VisionTransformer
from recurnmt.vision.registry import default_cfg
from recurnmt.vision.timm_registry import TIMM_PREFIX
from tests.vision_fixtures import small_kwargs

NUM_CLASSES = 7


def build_small(name: str, **extra) -> nn.Module:
    return create_model(name, num_classes=NUM_CLASSES, **{**small_kwargs(name), **extra})


def build_small_with_timm(name: str, **extra) -> nn.Module:
    """The same small model, built by timm's factory from our prefixed name."""
    kwargs = {**small_kwargs(name), **extra}
    return timm.create_model(TIMM_PREFIX + name, num_classes=NUM_CLASSES, **kwargs)


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
@pytest.mark.smoke
def test_forward_shape_finite_and_every_parameter_gets_a_gradient(name, device):
    model = build_small_with_timm(name).train()
    perturb_zero_parameters(model)
    model.to(device)
    # 4 images: with the paper models' stochastic depth (up to 0.2) a residual branch is
    # dropped for the whole batch, leaving its block without a gradient, with odds <= 0.2^4
    x = torch.randn(4, 3, 32, 32, device=device)
    out = model(x)
    if isinstance(model, DVTCascade):  # in training every exit's logits (DVT eq. 1)
        assert isinstance(out, tuple) and len(out) == model.num_exits
        out = torch.cat(out)
    assert out.shape[1:] == (NUM_CLASSES,)
    assert torch.isfinite(out).all()
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
        "relaxed_vit_mini_patch4",
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


def test_sret_108_is_built_as_sret():
    """SReT-108: 18 DeiT-Ti blocks looped 6 times in a row, an NLL of its own after every loop
    (SReT eq. 5-6) and learnable residual coefficients everywhere, NLLs' included (eq. 9-10);
    the naive recursion of the same depth has neither."""
    with torch.device("meta"):
        sret = create_model("deit_tiny_sret_d108_patch16_224")
        naive = create_model("deit_tiny_recursive_d108_patch16_224")
    stack = sret.stack
    assert stack.num_levels == naive.stack.num_levels == 108 and stack.plan.num_unique == 18
    assert stack.plan.block_of_level[:7] == (0, 0, 0, 0, 0, 0, 1)
    nlls = [level.nll for level in stack.levels]
    assert all(n is not None for n in nlls) and len({id(n) for n in nlls}) == 108
    assert nlls[0].mlp.up.out_features == 192  # ratio 1.0, as SReT-T/TL
    coefficients = [m for m in sret.modules() if type(m).__name__ == "ResidualCoefficients"]
    assert len(coefficients) == 18 + 108 and all(c.mode == "both" for c in coefficients)
    assert all(level.nll is None for level in naive.stack.levels)
    assert all(b.lrc.mode == "none" for b in naive.stack.blocks)


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
    with shallow_branch(model):
        shallow = model(x)
    assert shallow.shape == (2, NUM_CLASSES)
    assert not torch.allclose(shallow, model(x))
    vit = build_small("recursive_vit_mini_patch4").eval()
    assert vit.stack.plan.first_loop_levels() == [0, 2, 4]
    mixer = build_small("recursive_mixer_mini").eval()
    with shallow_branch(mixer):
        assert mixer(x).shape == (2, NUM_CLASSES)


def test_sliced_attention_evaluation_is_deterministic():
    model = build_small("sret_mini").eval()
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(model(x), model(x))


def test_mixer_refuses_a_different_token_count():
    mixer = build_small("recursive_mixer_mini")
    assert isinstance(mixer, RecursiveMixer)
    with pytest.raises(ValueError, match="built for 16"):
        mixer(torch.randn(1, 3, 64, 64))


def test_timm_registration_keeps_timm_names_and_adds_ours():
    """Every model is timm's ``recurnmt_<name>``, and ``<name>`` where timm had no such model;
    timm's own DeiT, ViT and Mixer stay timm's."""
    for name in list_models():
        assert timm.is_model(TIMM_PREFIX + name)
    assert set(list_models("*ringformer*")) <= set(timm.list_models("*ringformer*"))
    assert timm.list_models(module="timm_registry")  # listed as a module of its own
    for owned, on_meta in (("deit_tiny_patch16_224", False), ("mixer_b16_224", True)):
        # which class is built is all that matters here, so the meta device, except for
        # timm's ViT, which older timm (1.0.20) cannot build there (one block on the CPU then)
        with torch.device("meta" if on_meta else "cpu"):
            theirs = timm.create_model(owned, **({} if on_meta else {"depth": 1}))
        with torch.device("meta"):
            ours = timm.create_model(TIMM_PREFIX + owned)
        assert type(theirs).__module__.startswith("timm.")
        assert type(ours).__module__.startswith("recurnmt.")
    assert isinstance(timm.create_model("sret_mini", num_classes=3), SReT)
    assert register_with_timm() == []  # a second registration changes nothing
    with pytest.raises(ValueError, match="no pretrained weights for sret_mini"):
        timm.create_model("sret_mini", pretrained=True)


@pytest.mark.parametrize(
    "name", sorted(set(list_models()) & set(timm.list_models(module="timm_registry")))
)
def test_both_timm_names_build_the_same_model(name):
    """``<name>`` and ``recurnmt_<name>`` are one model under two names: the same class, the
    same parameters and buffers, the same configuration but its ``architecture`` (timm's model
    tests run such an alias only where they read the name: tests/timm_peer/conftest.py)."""
    with torch.device("meta"):
        plain, alias = timm.create_model(name), timm.create_model(TIMM_PREFIX + name)
    assert type(plain) is type(alias)
    shapes = {k: (v.shape, v.dtype) for k, v in plain.state_dict().items()}
    assert shapes == {k: (v.shape, v.dtype) for k, v in alias.state_dict().items()}
    assert repr(plain) == repr(alias)
    cfg, alias_cfg = plain.pretrained_cfg, alias.pretrained_cfg
    assert cfg["architecture"] == name and alias_cfg["architecture"] == TIMM_PREFIX + name
    assert {**cfg, "architecture": None} == {**alias_cfg, "architecture": None}


@pytest.mark.parametrize("name", list_models())
def test_registered_input_size_is_the_built_one(name):
    """The data configuration timm keeps for a name describes what the name builds."""
    with torch.device("meta"):
        model = create_model(name)
    assert default_cfg(name)["input_size"] == (model.in_chans, *model.img_size)
    cfg = timm.models.get_pretrained_cfg(TIMM_PREFIX + name)
    assert cfg.input_size == default_cfg(name)["input_size"] and cfg.interpolation == "bicubic"


@pytest.mark.parametrize("name", ["vit_mini_patch4", "sret_mini", "dvt_vit_mini_patch2"])
def test_timm_model_api(name):
    """What timm's train.py calls on a model: data config, checkpointing, classifier reset,
    features / head, and weight-decay exemptions for its optimizer factory."""
    model = build_small_with_timm(name, img_size=48)
    assert model.default_cfg is model.pretrained_cfg
    config = resolve_data_config({}, model=model)
    assert config["input_size"] == (3, 48, 48) and config["crop_pct"] == 0.875
    assert config["interpolation"] == "bicubic"
    overlay = timm.create_model(
        TIMM_PREFIX + name, pretrained_cfg_overlay={"crop_pct": 1.0}, **small_kwargs(name)
    )
    assert resolve_data_config({}, model=overlay)["crop_pct"] == 1.0
    x = torch.randn(2, 3, 48, 48)
    model.set_grad_checkpointing(True)
    model.eval()
    features = model.forward_features(x)
    torch.testing.assert_close(model.forward_head(features), model(x))
    model.reset_classifier(3)
    assert model(x).shape == (2, 3)
    optimizer = create_optimizer_v2(model, opt="adamw", lr=1e-3, weight_decay=0.05)
    params = dict(model.named_parameters())
    exempt = {id(p) for g in optimizer.param_groups if g["weight_decay"] == 0 for p in g["params"]}
    for skipped in model.no_weight_decay():
        assert id(params[skipped]) in exempt
    assert any(g["weight_decay"] == 0.05 for g in optimizer.param_groups)


@pytest.mark.parametrize("name", ["vit_mini_patch4", "sret_mini", "dvt_vit_mini_patch2"])
def test_timm_factory_arguments_place_and_cast_the_model(name):
    """``timm.create_model(name, device=..., dtype=...)``, as timm's models take them (timm's
    own tests build every model so, on the meta device); an unknown keyword stays a
    TypeError, as timm's tests require of every model."""
    model = timm.create_model(TIMM_PREFIX + name, device="meta", dtype=torch.bfloat16)
    tensors = [*model.parameters(), *model.buffers()]
    assert {t.device.type for t in tensors} == {"meta"}
    assert {t.dtype for t in tensors if t.is_floating_point()} == {torch.bfloat16}
    assert torch.get_default_device().type == "cpu"  # the device was the default only inside
    with pytest.raises(TypeError, match="not_a_model_arg"):
        timm.create_model(TIMM_PREFIX + name, device="meta", not_a_model_arg=1)


@pytest.mark.parametrize("name", list_models())
def test_output_fmt_is_the_layout_of_forward_features(name):
    """``output_fmt`` (timm's attribute; NCHW where a model has none) says what
    ``forward_features`` gives: NLC tokens B x T x D (the ViTs, DVT cascades, Mixers) or an
    NCHW map (SReT, the ResNets); timm's tests read it (tests/timm_peer/README.md)."""
    with torch.device("meta"):
        model = timm.create_model(TIMM_PREFIX + name)
        features = model.forward_features(torch.empty(1, *model.default_cfg["input_size"]))
    fmt = getattr(model, "output_fmt", "NCHW")
    assert fmt in ("NLC", "NCHW")
    assert features.ndim == len(fmt)
    assert features.shape[-1 if fmt == "NLC" else 1] == model.num_features


def test_timm_checkpoint_path_loads_our_weights(tmp_path):
    model = build_small("vit_mini_patch4")
    torch.save({"model": model.state_dict()}, tmp_path / "weights.pt")
    again = timm.create_model(
        TIMM_PREFIX + "vit_mini_patch4",
        num_classes=NUM_CLASSES,
        checkpoint_path=str(tmp_path / "weights.pt"),
        **small_kwargs("vit_mini_patch4"),
    )
    assert isinstance(again, VisionTransformer)
    x = torch.randn(1, 3, 32, 32)
    torch.testing.assert_close(again.eval()(x), model.eval()(x))


def test_vision_does_not_import_fairseq():
    import subprocess

    code = "import sys, recurnmt.vision.training.train; assert 'fairseq' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
