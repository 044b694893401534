"""Mixed precision in vision training (``--amp``): autocast and loss scaling; channels-last.

``--amp fp16`` on CUDA runs the engine's loss-scaled path (``torch.amp.GradScaler``). autocast
and GradScaler take the device type, so the same engine code runs here on CPU with a CPU scaler;
the tests that take ``device`` run once more on CUDA where there is one.
"""

from __future__ import annotations

import contextlib
import copy
import math

import pytest
import torch

from recurnmt.vision import create_model, list_models
from recurnmt.vision.training import train as train_cli
from recurnmt.vision.training.distributed import DistInfo
from recurnmt.vision.training.engine import Precision, train_one_epoch
from recurnmt.vision.training.losses import ClassificationLoss
from tests.vision_fixtures import small_kwargs

CPU = torch.device("cpu")


def run(precision: Precision, steps: int = 3, device: torch.device = CPU, name="vit_mini_patch4"):
    """A small model trained for ``steps`` updates on fixed random images (made on the CPU, so
    every device sees the same batches)."""
    torch.manual_seed(0)
    # 16 px, except the convolutional models (the ResNets, SReT's stem and pooling): at 16 px
    # their last stages convolve 1 x 1 (and SReT's pooling 2 x 2) maps with stride 2, where
    # torch 2.14's bf16 CPU convolution backward (oneDNN 3.12) reads uninitialised memory and
    # returns NaN weight gradients now and then; at 32 px none did in repeated trials
    size = 32 if "resnet" in name or name.startswith("sret") else 16
    model = create_model(name, num_classes=5, **{**small_kwargs(name), "img_size": size})
    model.to(device)
    if precision.channels_last:
        model.to(memory_format=torch.channels_last)
    images, labels = torch.randn(steps * 4, 3, size, size), torch.randint(0, 5, (steps * 4,))
    loader = list(zip(images.split(4), labels.split(4), strict=True))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    before = [p.detach().clone() for p in model.parameters()]
    result = train_one_epoch(
        model,
        loader,
        optimizer,
        None,  # a constant learning rate
        ClassificationLoss(),  # a DVT cascade's exits summed (a tuple in training)
        DistInfo(device=device),
        precision,
        progress=False,
    )
    return model, before, result


def test_precision_modes():
    assert Precision.build("auto", CPU) == Precision()  # full precision on CPU
    assert Precision.build("off", CPU) == Precision()
    assert Precision.build("bf16", CPU) == Precision(torch.bfloat16)
    with pytest.raises(ValueError, match="--amp fp16 needs CUDA"):
        Precision.build("fp16", CPU)


def test_bf16_autocast_keeps_fp32_weights_and_tracks_full_precision(device):
    model, before, result = run(Precision(torch.bfloat16), device=device)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    _, _, full = run(Precision(), device=device)
    assert result.losses == pytest.approx(full.losses, rel=0.05)
    assert result.losses != full.losses  # autocast really computed in bf16


def test_loss_scaling_skips_overflowing_updates_then_trains(device):
    # a scale of 2^60 overflows fp16 gradients: the scaler must skip those updates (weights
    # unchanged) and halve the scale until the gradients are finite again
    scaler = torch.amp.GradScaler(device.type, init_scale=2.0**60, growth_interval=1000)
    model, before, _ = run(Precision(torch.float16, scaler), steps=1, device=device)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert scaler.get_scale() == 2.0**59
    scaler = torch.amp.GradScaler(device.type, init_scale=2.0**8)
    model, before, result = run(Precision(torch.float16, scaler), steps=3, device=device)
    assert scaler.get_scale() == 2.0**8
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    _, _, full = run(Precision(), device=device)
    assert result.losses == pytest.approx(full.losses, rel=0.05)


def test_fp16_on_cpu_is_refused_naming_the_flag(tmp_path):
    with pytest.raises(ValueError, match="--amp fp16"):
        train_cli.main(
            ["--output", str(tmp_path), "--device", "cpu", "--amp", "fp16", "--no-progress"]
        )
    assert not (tmp_path / "checkpoint_last.pt").exists()


@pytest.mark.parametrize("name", list_models())
def test_every_model_trains_under_bf16_autocast(name):
    """Forward and backward of every vision model in bf16 on the CPU: finite, and the weights
    (fp32 under autocast) move."""
    model, before, result = run(Precision(torch.bfloat16), steps=1, name=name)
    assert all(math.isfinite(x) for x in result.losses), result.losses
    broken = [n for n, p in model.named_parameters() if not torch.isfinite(p).all()]
    assert not broken, broken
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


@pytest.mark.cuda
@pytest.mark.parametrize("name", list_models())
def test_every_model_trains_in_fp16_with_loss_scaling_on_cuda(name):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device on this machine (fp16 autocast is CUDA's)")
    scaler = torch.amp.GradScaler("cuda")
    model, before, result = run(
        Precision(torch.float16, scaler), steps=2, device=torch.device("cuda"), name=name
    )
    assert all(math.isfinite(x) for x in result.losses)
    assert all(torch.isfinite(p).all() for p in model.parameters())


@contextlib.contextmanager
def ieee_fp32_convolutions():
    """cuDNN convolves fp32 in TF32 by default (10-bit mantissas, Ampere and newer), and the
    two layouts pick different algorithms, so their TF32 roundings differ by about 1e-3 of
    the values; the layouts are compared in full fp32, where only the summation order
    differs. (No effect on the CPU.)"""
    conv = getattr(torch.backends.cudnn, "conv", None)
    if conv is not None and hasattr(conv, "fp32_precision"):  # torch 2.9 and newer
        saved, conv.fp32_precision = conv.fp32_precision, "ieee"
        try:
            yield
        finally:
            conv.fp32_precision = saved
    else:
        saved, torch.backends.cudnn.allow_tf32 = torch.backends.cudnn.allow_tf32, False
        try:
            yield
        finally:
            torch.backends.cudnn.allow_tf32 = saved


@pytest.mark.parametrize("name", ["mrla_light_resnet50", "sret_mini", "vit_mini_patch4"])
def test_channels_last_computes_what_the_default_layout_does(name, device):
    """NHWC images and convolution weights: the same outputs and gradients as NCHW (up to
    summation order), and training keeps the layout."""
    torch.manual_seed(0)
    kwargs = {**small_kwargs(name), "img_size": 16}
    model = create_model(name, num_classes=5, **kwargs).to(device).train()
    twin = copy.deepcopy(model).to(memory_format=torch.channels_last)
    images = torch.randn(4, 3, 16, 16)
    outputs = []
    for net, precision in ((model, Precision()), (twin, Precision(channels_last=True))):
        torch.manual_seed(1)  # the same stochastic depth draws
        with ieee_fp32_convolutions():
            out = net(precision.images(images, device))
            (out * torch.arange(5.0, device=device)).sum().backward()
        outputs.append(out)
    torch.testing.assert_close(outputs[1], outputs[0], atol=1e-4, rtol=1e-4)
    # another summation order: equal up to rounding at the scale of the model's gradients
    # (some gradients are exactly zero in theory and rounding noise in practice)
    scale = max(p.grad.abs().max() for p in model.parameters())
    for (n, a), b in zip(model.named_parameters(), twin.parameters(), strict=True):
        assert (b.grad - a.grad).abs().max() <= 1e-4 * scale, n
    trained, _, result = run(Precision(channels_last=True), steps=2, device=device, name=name)
    assert all(math.isfinite(x) for x in result.losses)
    convs = [m.weight for m in trained.modules() if isinstance(m, torch.nn.Conv2d)]
    assert convs and all(w.is_contiguous(memory_format=torch.channels_last) for w in convs)


def test_channels_last_images_reach_the_model_in_nhwc():
    images = torch.randn(2, 3, 8, 8)
    placed = Precision(channels_last=True).images(images, CPU)
    assert placed.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(placed, images)
    assert Precision().images(images, CPU).is_contiguous()
