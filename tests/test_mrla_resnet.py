"""MRLA on ResNets (MRLA sec. 4 "CNNs", Algorithms 1 and 3; Table 1 counts: test_vision_params)."""

from __future__ import annotations

import math

import pytest
import timm
import torch
import torch.nn.functional as F
from timm.models.resnet import BasicBlock
from torch import nn

from recurnmt.vision import create_model
from recurnmt.vision.models import MRLAResNet

# ResNet-50's structure (3-4-6-3 bottlenecks) at 1/8 of its widths: stage outputs 32 ... 256
SMALL = dict(channels=(8, 16, 32, 64), stem_width=8, num_classes=5)


def small(name: str, **kwargs) -> MRLAResNet:
    return create_model(name, **{**SMALL, **kwargs})


def stages(model: MRLAResNet) -> list:
    return [model.layer1, model.layer2, model.layer3, model.layer4]


def randomise(model: nn.Module) -> None:
    """Non-trivial lambdas and branch norms (running statistics included)."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".mrla." in name and p.dim() == 1:
                p.copy_(torch.rand(p.shape, generator=g) + 0.5)
        for stage in stages(model):
            for bn in stage.mrla.branch_norms:
                bn.running_mean.copy_(torch.randn(bn.num_features, generator=g))
                bn.running_var.copy_(torch.rand(bn.num_features, generator=g) + 0.5)


@pytest.mark.parametrize("variant", ["light", "base"])
def test_one_mrla_level_per_bottleneck_restarting_at_every_stage(variant):
    model = small(f"mrla_{variant}_resnet50")
    assert [s.num_blocks for s in stages(model)] == [3, 4, 6, 3]
    assert [len(s.mrla.levels) for s in stages(model)] == [3, 4, 6, 3]
    for stage in stages(model):
        # a stage's first level has nothing to retrieve: no lambda_o (light), no query (base)
        assert stage.mrla.starts_stage(0) and not any(map(stage.mrla.starts_stage, range(1, 3)))
        first, later = stage.mrla.levels[0], stage.mrla.levels[1]
        if variant == "light":
            assert first.lambda_o is None and later.lambda_o is not None
        else:
            assert first.proj.query is None and later.proj.query is not None
        # Algorithms 1 and 3: the block output itself, and a value without activation
        assert isinstance(first.proj.norm, nn.Identity)
        assert isinstance(first.proj.value_act, nn.Identity)
    # d_k as the released code: 32 channels per head for light (sec. 5.1's value; widths 32,
    # 64, 128, 256 give 1, 2, 4, 8 heads), 16 for base (resnet_mrla_base.py: 2, 4, 8, 16)
    heads = [1, 2, 4, 8] if variant == "light" else [2, 4, 8, 16]
    assert [s.mrla.levels[0].proj.num_heads for s in stages(model)] == heads
    assert all(s.mrla.drop_path == (0.2,) * s.num_blocks for s in stages(model))  # App. B.1.1
    relu = variant == "base"  # the released base code: ReLU(BN(O^t)); light: BN(O^t)
    assert all(isinstance(s.mrla.branch_act, nn.ReLU) == relu for s in stages(model))


def test_stage_runs_eq_8_after_every_block_with_a_normalised_branch():
    """X^t <- X^t + BN(O^t), O^t = lambda^t * O^{t-1} + sigmoid(Q_h . K_h / sqrt(d_k)) V_h of
    X^t (eq. 8, Algorithm 3): the state is the previous MRLA output, before the norm."""
    model = small("mrla_light_resnet50").eval()
    randomise(model)
    stage = model.layer2  # four blocks, 64 channels in 2 heads, 4 x 4 maps here
    x = torch.randn(2, 32, 8, 8)
    y, state = x, None
    for t in range(stage.num_blocks):
        y = getattr(stage, str(t))(y)  # X^t: B x C x h x w
        b, c, h, w = y.shape
        level = stage.mrla.levels[t]
        v = level.proj.value(y)  # 3 x 3 depth-wise, no activation
        pooled = y.mean(dim=(2, 3))[:, None, :]  # B x 1 x C
        q, k = level.proj.query(pooled).view(b, c), level.proj.key(pooled).view(b, c)
        heads = (q * k).view(b, -1, 32).sum(-1) / math.sqrt(32)  # B x H
        term = v * torch.sigmoid(heads).repeat_interleave(32, dim=1)[:, :, None, None]
        state = term if t == 0 else level.lambda_o[:, None, None] * state + term
        bn = stage.mrla.branch_norms[t]
        y = y + F.batch_norm(state, bn.running_mean, bn.running_var, bn.weight, bn.bias)
    with torch.no_grad():
        torch.testing.assert_close(stage(x), y)


def test_base_runs_eq_6_after_every_block_as_the_released_code():
    """X^t <- X^t + ReLU(BN(O^t)), O^t_h = softmax_s(Q^t_h . K^s_h / sqrt(d_k)) V^s_h over the
    stage's blocks s <= t (eq. 6, Algorithm 1), d_k = 16: resnet_mrla_base.py."""
    model = small("mrla_base_resnet50").eval()
    randomise(model)
    stage, d = model.layer2, 16  # four blocks, 64 channels in 4 heads
    x = torch.randn(2, 32, 8, 8)
    y, keys, values = x, [], []
    for t in range(stage.num_blocks):
        y = getattr(stage, str(t))(y)  # X^t: B x C x h x w
        b, c, h, w = y.shape
        level = stage.mrla.levels[t]
        pooled = y.mean(dim=(2, 3))[:, None, :]  # B x 1 x C
        keys.append(level.proj.key(pooled).view(b, c // d, d))
        values.append(level.proj.value(y))  # 3 x 3 depth-wise, no activation
        if t == 0:  # a stage's first block attends to itself alone
            out = values[0]
        else:
            q = level.proj.query(pooled).view(b, c // d, d)
            scores = torch.stack([(q * k).sum(-1) / math.sqrt(d) for k in keys])  # L x B x H
            weights = scores.softmax(dim=0).repeat_interleave(d, dim=2)  # L x B x C
            out = sum(wt[:, :, None, None] * v for wt, v in zip(weights, values, strict=True))
        bn = stage.mrla.branch_norms[t]
        y = y + F.relu(F.batch_norm(out, bn.running_mean, bn.running_var, bn.weight, bn.bias))
    with torch.no_grad():
        torch.testing.assert_close(stage(x), y)


def test_base_as_sec_5_1_is_an_option_of_the_same_size():
    """d_k = 32 (sec. 5.1) and no branch ReLU, recurnmt's MRLA-base before it followed the
    released code: the same parameters, other heads and branch."""
    released = small("mrla_base_resnet50")
    paper = small("mrla_base_resnet50", mrla_head_dim=32, mrla_branch_relu=False)
    assert [s.mrla.levels[0].proj.num_heads for s in stages(paper)] == [1, 2, 4, 8]
    assert all(isinstance(s.mrla.branch_act, nn.Identity) for s in stages(paper))
    shapes = [(n, p.shape) for n, p in released.named_parameters()]
    assert shapes == [(n, p.shape) for n, p in paper.named_parameters()]
    paper.load_state_dict(released.state_dict())
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert not torch.allclose(released.eval()(x), paper.eval()(x))
    relu_light = small("mrla_light_resnet50", mrla_branch_relu=True)
    assert all(isinstance(s.mrla.branch_act, nn.ReLU) for s in stages(relu_light))


def test_the_released_base_stem_is_timms_deep_stem():
    """resnet_mrla_base.py's stem: 3 x 3 convolutions of 32, 32 and 64 channels (timm's deep
    stem at width 32), 19,232 parameters more than the 7 x 7 one; not in Table 1."""
    with torch.device("meta"):
        plain, deep = (
            sum(p.numel() for p in create_model("mrla_base_resnet50", **kw).parameters())
            for kw in ({}, dict(stem_type="deep", stem_width=32))
        )
    assert deep - plain == 19_232


def test_the_backbone_is_timms_resnet():
    """With the MRLA branches silenced the model is timm's ResNet-50, whose state dict loads
    into it unchanged (block names as in timm)."""
    model = small("mrla_light_resnet50").eval()
    plain = timm.create_model("resnet50", **SMALL).eval()
    missing, unexpected = model.load_state_dict(plain.state_dict(), strict=False)
    assert not unexpected and missing and all(".mrla." in k for k in missing)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert not torch.allclose(model(x), plain(x))
        for stage in stages(model):
            for bn in stage.mrla.branch_norms:
                bn.weight.zero_()
                bn.bias.zero_()
        torch.testing.assert_close(model(x), plain(x))


def test_timm_model_interface():
    model = small("mrla_base_resnet50").eval()
    assert isinstance(model, timm.models.resnet.ResNet)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        final, inter = model.forward_intermediates(x)
        assert [f.shape[1] for f in inter[1:]] == [32, 64, 128, 256]  # after the stem
        model.reset_classifier(3)
        torch.testing.assert_close(model.forward_head(final), model(x))
        assert model(x).shape == (2, 3)


def test_builds_as_the_training_command_asks():
    """recurnmt.vision.training.train passes the image size, classes and channels of its data."""
    model = small("mrla_light_resnet50", img_size=16, in_chans=1, num_classes=10)
    assert model.img_size == (16, 16)
    assert model(torch.randn(2, 1, 16, 16)).shape == (2, 10)
    model.set_img_size(24)
    assert model.img_size == (24, 24)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(mrla="heavy"), "MRLA variant"),
        (dict(mrla_head_dim=24), "head_dim"),  # does not divide 32
        (dict(block=BasicBlock), "bottleneck"),
    ],
)
def test_impossible_settings_name_the_setting(kwargs, message):
    with pytest.raises(ValueError, match=message):
        small("mrla_light_resnet50", **kwargs)
