"""Mixed precision in vision training (``--amp``): autocast and loss scaling.

``--amp fp16`` on CUDA runs the engine's loss-scaled path (``torch.amp.GradScaler``). autocast
and GradScaler take the device type, so the same engine code runs here on CPU with a CPU scaler.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from recurnmt.vision import create_model
from recurnmt.vision import train as train_cli
from recurnmt.vision.distributed import DistInfo
from recurnmt.vision.engine import Precision, train_one_epoch

CPU = torch.device("cpu")


def run(precision: Precision, steps: int = 3):
    """A mini ViT trained for ``steps`` updates on fixed random images."""
    torch.manual_seed(0)
    model = create_model(
        "vit_mini_patch4", num_classes=5, img_size=16, embed_dim=32, ffn_dim=64, num_heads=2
    )
    images, labels = torch.randn(steps * 4, 3, 16, 16), torch.randint(0, 5, (steps * 4,))
    loader = list(zip(images.split(4), labels.split(4), strict=True))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    before = [p.detach().clone() for p in model.parameters()]
    result = train_one_epoch(
        model,
        loader,
        optimizer,
        None,  # a constant learning rate
        lambda logits, target, _: F.cross_entropy(logits, target),
        DistInfo(),
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


def test_bf16_autocast_keeps_fp32_weights_and_tracks_full_precision():
    model, before, result = run(Precision(torch.bfloat16))
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    _, _, full = run(Precision())
    assert result.losses == pytest.approx(full.losses, rel=0.05)
    assert result.losses != full.losses  # autocast really computed in bf16


def test_loss_scaling_skips_overflowing_updates_then_trains():
    # a scale of 2^60 overflows fp16 gradients: the scaler must skip those updates (weights
    # unchanged) and halve the scale until the gradients are finite again
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**60, growth_interval=1000)
    model, before, _ = run(Precision(torch.float16, scaler), steps=1)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert scaler.get_scale() == 2.0**59
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)
    model, before, result = run(Precision(torch.float16, scaler), steps=3)
    assert scaler.get_scale() == 2.0**8
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    _, _, full = run(Precision())
    assert result.losses == pytest.approx(full.losses, rel=0.05)


def test_fp16_on_cpu_is_refused_naming_the_flag(tmp_path):
    with pytest.raises(ValueError, match="--amp fp16"):
        train_cli.main(
            ["--output", str(tmp_path), "--device", "cpu", "--amp", "fp16", "--no-progress"]
        )
    assert not (tmp_path / "checkpoint_last.pt").exists()
