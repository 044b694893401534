"""Speed and memory of recurnmt's image models against timm's ViT / DeiT and PyTorch's encoder.

The reference rows are the models a user would otherwise pick: timm's own ViT and DeiT
(``timm.create_model("vit_small_patch16_224")`` and ``("deit_tiny_patch16_224")``, built at the
benchmark's width, depth, heads, FFN ratio, image and patch size, which makes them the same
architecture: pre-LN blocks with GELU, class token, learned positions), and ``torch_vit``, a
ViT assembled from ``torch.nn.TransformerEncoder`` (the same patch embedding, class token,
position table and head, PyTorch's attention and layer code). Every model has the same width,
FFN width, heads and number of levels (SReT-style naive recursion runs levels/2 blocks twice;
One Wide FFN shares one FFN), sees the same real images (scikit-learn's handwritten digits,
upsampled) and runs in a fresh process so that peak memory is its own; the processes take
turns on the machine, one timed round at a time (:class:`recurnmt.experiments.benchmark.Turns`;
``--sequential``: one model after another). The table reports absolute figures and ratios to
``--baseline`` (timm's ViT by default):

* training images per second (forward + backward + AdamW step), the fastest of ``--rounds``
  passes over the same ``--steps`` batches;
* inference images per second (``torch.no_grad``, eval mode), the fastest of ``--rounds``;
* memory: on CUDA the peak ``max_memory_allocated`` of training; on CPU, where no allocator
  keeps a peak, the activations one training forward saves for backward (unique storages,
  counted with ``torch.autograd.graph.saved_tensors_hooks``), which is deterministic and is
  what weight sharing and recursion change; ``ckpt mem`` is the same with activation
  checkpointing per level (``set_grad_checkpointing``, timm's API; ``torch_vit`` has none);
* parameters.

``--dtype bf16`` / ``fp16`` runs training and inference under ``torch.autocast`` (fp16 with a
loss scaler, CUDA only), as ``recurnmt.vision.training.train --amp`` does. ``--json OUT`` writes the
figures with the device, versions and settings.

    python scripts/benchmark_vision.py                     # CPU-sized default
    python scripts/benchmark_vision.py --device cuda --dtype bf16 --embed-dim 384 --heads 6 \\
        --levels 12 --img-size 224 --patch-size 16 --batch-size 128
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from recurnmt.cli import entry_point
from recurnmt.device import resolve_device
from recurnmt.experiments.benchmark import (
    Column,
    MixedPrecision,
    add_device_arguments,
    add_sequential_argument,
    emit,
    fastest_round,
    forward_flags,
    peak_memory_mb,
    ratio_table,
    run_workers,
    start_worker,
    training_step,
    write_json,
)
from recurnmt.experiments.experiment import add_size_arguments

ROOT = Path(__file__).resolve().parent.parent

TORCH_VIT = "torch_vit"
# name -> timm's registered model, rebuilt at the benchmark's sizes
TIMM_MODELS = {"timm vit": "vit_small_patch16_224", "timm deit": "deit_tiny_patch16_224"}
BASELINE = "timm vit"
REFERENCES = [*TIMM_MODELS, TORCH_VIT]
WORKER_OPTIONS = (
    "device",
    "dtype",
    "embed_dim",
    "ffn_dim",
    "heads",
    "levels",
    "img_size",
    "patch_size",
    "batch_size",
    "warmup",
    "steps",
    "rounds",
    "threads",
    "seed",
)
# name -> (registered model, overrides beyond the shared widths; "L" stands for --levels)
MODELS = {
    "deit (ours)": ("deit_tiny_patch16_224", {"depth": "L"}),
    "recursive deit": ("deit_tiny_recursive_patch16_224", {"depth": "L", "unique_layers": "L/2"}),
    "ringformer_vit": ("ringformer_vit_base_patch16_224", {"depth": "L"}),
    "uit": ("uit_base_patch16_224", {"depth": "L"}),
    "owf_vit": ("owf_vit_base_patch16_224", {"depth": "L"}),
    "deit + mrla": ("deit_tiny_mrla_patch16_224", {"depth": "L"}),
}


class TorchViT:
    """Builds the reference ViT from ``torch.nn.TransformerEncoder`` (imported lazily)."""

    @staticmethod
    def build(opts: argparse.Namespace, num_classes: int):
        import torch
        from torch import nn

        class Model(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                d, p = opts.embed_dim, opts.patch_size
                self.patch = nn.Conv2d(3, d, p, stride=p)
                tokens = (opts.img_size // p) ** 2 + 1
                self.cls = nn.Parameter(torch.zeros(1, 1, d))
                self.pos = nn.Parameter(torch.zeros(1, tokens, d))
                layer = nn.TransformerEncoderLayer(
                    d,
                    opts.heads,
                    opts.ffn_dim,
                    dropout=0.0,
                    activation="gelu",
                    batch_first=True,
                    norm_first=True,
                    layer_norm_eps=1e-6,
                )
                self.encoder = nn.TransformerEncoder(layer, opts.levels, enable_nested_tensor=False)
                self.norm = nn.LayerNorm(d, eps=1e-6)
                self.head = nn.Linear(d, num_classes)

            def forward(self, x):
                x = self.patch(x).flatten(2).transpose(1, 2)  # B x N x D
                x = torch.cat([self.cls.expand(x.size(0), -1, -1), x], dim=1) + self.pos
                return self.head(self.norm(self.encoder(x)[:, 0]))

        return Model()


def resolve(overrides: dict, levels: int) -> dict:
    values = {"L": levels, "L/2": max(1, levels // 2)}
    return {k: values.get(v, v) if isinstance(v, str) else v for k, v in overrides.items()}


def build(name: str, opts: argparse.Namespace, num_classes: int):
    if name == TORCH_VIT:
        return TorchViT.build(opts, num_classes)
    if name in TIMM_MODELS:
        import timm

        return timm.create_model(
            TIMM_MODELS[name],
            pretrained=False,
            embed_dim=opts.embed_dim,
            depth=opts.levels,
            num_heads=opts.heads,
            mlp_ratio=opts.ffn_dim / opts.embed_dim,
            img_size=opts.img_size,
            patch_size=opts.patch_size,
            num_classes=num_classes,
            drop_path_rate=0.0,
        )
    from recurnmt.vision import create_model

    registered, overrides = MODELS[name]
    return create_model(
        registered,
        embed_dim=opts.embed_dim,
        ffn_dim=opts.ffn_dim,
        num_heads=opts.heads,
        img_size=opts.img_size,
        patch_size=opts.patch_size,
        num_classes=num_classes,
        drop_path_rate=0.0,
        **resolve(overrides, opts.levels),
    )


def real_images(count: int, size: int):
    """``count`` digits as count x 3 x size x size (repeated when count > 1,797) and labels."""
    import torch
    import torch.nn.functional as F
    from sklearn.datasets import load_digits

    digits = load_digits()
    idx = torch.arange(count) % len(digits.target)
    x = torch.tensor(digits.images, dtype=torch.float32)[idx, None] / 16.0  # B x 1 x 8 x 8
    x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    return (x.expand(-1, 3, -1, -1) - 0.5) / 0.5, torch.tensor(digits.target)[idx]


def training_memory_mb(model, x, y, precision: MixedPrecision | None = None) -> float:
    """Memory of one training step: the CUDA peak, or on CPU the MB of the distinct tensor
    storages one training forward saves for backward (:func:`peak_memory_mb`)."""
    from recurnmt.vision.training.losses import ClassificationLoss

    precision = precision or MixedPrecision("fp32", x.device)
    criterion = ClassificationLoss()  # a DVT cascade's exits summed (a tuple in training)

    def loss():
        with precision.autocast():
            return criterion(model(x), y)

    mb = peak_memory_mb(loss, x.device)
    model.zero_grad(set_to_none=True)
    return mb


def worker(opts: argparse.Namespace) -> dict:
    """Benchmarks one model in this process; returns its figures."""
    turns, device, precision = start_worker(opts)
    from recurnmt.vision.training.losses import ClassificationLoss

    criterion = ClassificationLoss()  # a DVT cascade's exits summed (a tuple in training)

    scaler = precision.scaler()
    model = build(opts.model, opts, num_classes=10).to(device)
    params = sum(p.numel() for p in model.parameters())
    batches = opts.warmup + opts.steps
    images, labels = real_images(batches * opts.batch_size, opts.img_size)
    images, labels = images.split(opts.batch_size), labels.split(opts.batch_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(x, y) -> None:
        with precision.autocast():
            loss = criterion(model(x.to(device)), y.to(device))
        training_step(loss, optimizer, scaler)

    def train_round() -> None:
        for x, y in zip(images[opts.warmup :], labels[opts.warmup :], strict=True):
            step(x, y)

    model.train()
    for x, y in zip(images[: opts.warmup], labels[: opts.warmup], strict=True):
        step(x, y)
    train_time = fastest_round(turns, opts.rounds, train_round, device)
    x0, y0 = images[0].to(device), labels[0].to(device)
    peak_mb = training_memory_mb(model, x0, y0, precision)
    ckpt_mb = peak_mb  # the reference ViT has no checkpointing: its figure stays
    if hasattr(model, "set_grad_checkpointing"):
        model.set_grad_checkpointing(True)
        ckpt_mb = training_memory_mb(model, x0, y0, precision)
        model.set_grad_checkpointing(False)

    def infer_round() -> None:
        for x in images[opts.warmup :]:
            model(x.to(device))

    model.eval()
    with torch.no_grad(), precision.autocast():
        model(images[0].to(device))
        infer_time = fastest_round(turns, opts.rounds, infer_round, device)
    seen = opts.steps * opts.batch_size
    return {
        "model": opts.model,
        "train_images_per_s": seen / train_time,
        "infer_images_per_s": seen / infer_time,
        "peak_mem_mb": peak_mb,
        "ckpt_mem_mb": ckpt_mb,
        "params": params,
    }


PROG = "python scripts/benchmark_vision.py"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument(
        "--baseline", default=BASELINE, choices=REFERENCES, help="the row ratios refer to"
    )
    add_device_arguments(parser)
    add_size_arguments(parser, pre_ln=None, embed_dim=192, ffn_dim=768, heads=3)
    parser.add_argument("--img-size", type=int, default=64)
    parser.add_argument("--patch-size", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=2, help="untimed updates")
    parser.add_argument("--steps", type=int, default=10, help="timed updates (and batches)")
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="timed rounds of training and of inference (the fastest counts)",
    )
    add_sequential_argument(parser)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--json", "--json-out", dest="json", type=Path, help="also write the results as JSON"
    )
    parser.add_argument("--model", help=argparse.SUPPRESS)  # worker mode
    opts = parser.parse_args(argv)

    if opts.model:
        emit(worker(opts))
        return
    if opts.rounds < 1:
        parser.error(f"--rounds {opts.rounds}: at least one round")
    opts.device = str(resolve_device(opts.device))  # before any worker starts
    MixedPrecision.build(opts.dtype, torch.device(opts.device))
    shared = forward_flags(opts, WORKER_OPTIONS)
    names = [opts.baseline, *(r for r in REFERENCES if r != opts.baseline), *opts.models]
    results = run_workers(
        Path(__file__), "--model", names, shared, ROOT, sequential=opts.sequential
    )
    print_table(results, opts)
    if opts.json:
        write_json(opts.json, results, opts, WORKER_OPTIONS)


def print_table(results: list[dict], opts: argparse.Namespace) -> None:
    print(
        f"\nD={opts.embed_dim} FF={opts.ffn_dim} heads={opts.heads} levels={opts.levels} "
        f"{opts.img_size}px/{opts.patch_size} batch={opts.batch_size} device={opts.device} "
        f"dtype={opts.dtype}; "
        f"ratios are to `{opts.baseline}`\n"
    )
    columns = [
        Column("train img/s", "train_images_per_s", ".1f"),
        Column("infer img/s", "infer_images_per_s", ".1f"),
        Column("mem MB", "peak_mem_mb", ".0f"),
        Column("ckpt mem MB", "ckpt_mem_mb", ".0f"),
        Column("params", "params", ".2f", ratio=False, scale=1e6, suffix="M"),
    ]
    print(ratio_table(results, "model", columns))


if __name__ == "__main__":
    sys.exit(entry_point(main, PROG)())
