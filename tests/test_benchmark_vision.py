"""scripts/benchmark_vision.py compares like with like (no timings are asserted here)."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "benchmark_vision.py"
spec = importlib.util.spec_from_file_location("benchmark_vision", SCRIPT)
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)

OPTS = argparse.Namespace(
    embed_dim=32, ffn_dim=64, heads=2, levels=6, img_size=16, patch_size=4, device="cpu"
)


def count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("reference", bench.REFERENCES)
def test_references_have_exactly_our_deit_parameters(reference):
    """timm's ViT and DeiT rebuilt at the benchmark's sizes, and the torch encoder ViT, are
    our DeiT's architecture: the same parameter count, the same number of blocks."""
    model = bench.build(reference, OPTS, num_classes=10)
    ours = bench.build("deit (ours)", OPTS, num_classes=10)
    assert count(model) == count(ours)
    if reference in bench.TIMM_MODELS:
        assert len(model.blocks) == OPTS.levels and model.embed_dim == OPTS.embed_dim
        assert type(model).__module__ == "timm.models.vision_transformer"


@pytest.mark.parametrize("name", list(bench.MODELS))
def test_every_model_runs_the_same_number_of_levels(name):
    model = bench.build(name, OPTS, num_classes=10)
    assert model.stack.num_levels == OPTS.levels
    assert model.embed_dim == OPTS.embed_dim
    x, y = bench.real_images(3, OPTS.img_size)
    assert x.shape == (3, 3, 16, 16) and y.tolist() == [0, 1, 2]
    assert model(x).shape == (3, 10)


def test_saved_activation_memory_is_deterministic_and_grows_with_batch():
    model = bench.build("deit (ours)", OPTS, num_classes=10)
    x, y = bench.real_images(8, OPTS.img_size)
    small = bench.training_memory_mb(model, x[:4], y[:4])
    assert small == bench.training_memory_mb(model, x[:4], y[:4])
    assert bench.training_memory_mb(model, x, y) > 1.5 * small


def test_the_worker_measures_on_the_device_in_mixed_precision(device):
    """One tiny worker run: bf16 on the CPU, fp16 (autocast + loss scaler) on CUDA, where the
    memory is the allocator's peak."""
    dtype = "fp16" if device.type == "cuda" else "bf16"
    opts = argparse.Namespace(
        **{**vars(OPTS), "levels": 2, "device": str(device)},
        dtype=dtype,
        model="ringformer_vit",
        batch_size=4,
        warmup=1,
        steps=1,
        rounds=1,
        threads=0,
        seed=1,
    )
    result = bench.worker(opts)
    assert result["model"] == "ringformer_vit"
    assert result["train_images_per_s"] > 0 and result["infer_images_per_s"] > 0
    assert result["peak_mem_mb"] > 0 and result["ckpt_mem_mb"] > 0
