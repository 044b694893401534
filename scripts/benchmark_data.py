"""Throughput of the vision data pipeline alone: images per second per data-loading worker.

What one training process's loader does for every ImageNet image (``recurnmt.vision.training.train``
with DeiT's recipe): read the JPEG, decode it with torchvision (``decode_image``), then timm's
training transform (bicubic random resized crop to 224, flip, RandAugment
``rand-m9-mstd0.5-inc1``, normalisation, pixel-mode random erasing), batch and collate. No
model runs. Divide the images per second a run needs by the per-worker figure to size
``--workers``.

The images are real JPEGs: a folder of ``--data-root`` (``train/<class>/*``, e.g. ImageNet's),
or, by default, one made from the two photographs scikit-learn ships (``china.jpg``,
``flower.jpg``, 640 x 427): ``--count`` crops of 500 x 375 (ImageNet's most common size) at
different places, re-encoded at JPEG quality 90. The table also gives the decoders alone
(torchvision's and PIL's) and the evaluation transform (resize 256, centre crop 224).

    python scripts/benchmark_data.py                      # default folder, workers 0 1 2
    python scripts/benchmark_data.py --data-root data/imagenet --workers 4 8
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from recurnmt.cli import entry_point

PROG = "python scripts/benchmark_data.py"
CROP = (375, 500)  # rows, cols: ImageNet's most common image size


def make_jpeg_folder(out: Path, count: int) -> Path:
    """``count`` JPEG crops of scikit-learn's two photographs as ``out/train/<photo>/*.jpg``."""
    from PIL import Image
    from sklearn.datasets import load_sample_images

    photos = load_sample_images()
    for k in range(count):
        index = k % len(photos.images)
        name = Path(photos.filenames[index]).stem
        image = photos.images[index]  # H x W x 3 uint8
        step = k // len(photos.images)
        rows, cols = image.shape[0] - CROP[0], image.shape[1] - CROP[1]
        top, left = (step * 17) % (rows + 1), (step * 29) % (cols + 1)
        crop = image[top : top + CROP[0], left : left + CROP[1]]
        folder = out / "train" / name
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(crop).save(folder / f"{k:05d}.jpg", quality=90)
    return out


def images_per_second(loader, batches: int) -> float:
    """Images per second over ``batches`` batches, after one untimed batch (worker start-up)."""
    it = iter(loader)
    next(it)
    start = time.perf_counter()
    seen = 0
    for _ in range(batches):
        seen += len(next(it)[1])
    return seen / (time.perf_counter() - start)


def decode_rates(paths: list[Path], repeats: int) -> dict[str, float]:
    """Images per second of torchvision's and PIL's JPEG decoders to RGB, in this process."""
    from PIL import Image
    from torchvision.io import ImageReadMode, decode_image, read_file

    import recurnmt.vision.data.image_folder  # noqa: F401  (silences the codec notice)

    rates = {}
    for label, decode in (
        ("torchvision decode_image", lambda p: decode_image(read_file(str(p)), ImageReadMode.RGB)),
        ("PIL open + convert", lambda p: Image.open(p).convert("RGB")),
    ):
        start = time.perf_counter()
        for _ in range(repeats):
            for path in paths:
                decode(path)
        rates[label] = repeats * len(paths) / (time.perf_counter() - start)
    return rates


def run(opts: argparse.Namespace, root: Path) -> list[tuple[str, int, float]]:
    """(pipeline, workers, images/s) rows."""
    import torch

    from recurnmt.vision.data import SPECS, ImageFolderDataset
    from recurnmt.vision.data.loader import eval_loader, train_loader
    from recurnmt.vision.data.transforms import build_transform

    torch.set_num_threads(1)
    spec = SPECS["imagenet"]
    size = (opts.img_size, opts.img_size)
    train_set = ImageFolderDataset(root, "train", build_transform(spec, size, train=True))
    eval_set = ImageFolderDataset(root, "train", build_transform(spec, size, train=False))
    needed = (opts.batches + 1) * opts.batch_size
    if len(train_set) < needed:
        raise ValueError(
            f"--batches {opts.batches} x --batch-size {opts.batch_size} needs {needed} images; "
            f"{root} has {len(train_set)}"
        )
    cpu = torch.device("cpu")
    rows = []
    for workers in opts.workers:
        loader = train_loader(
            train_set, opts.batch_size, rank=0, world_size=1, seed=0, workers=workers, device=cpu
        )
        rows.append(
            ("train: decode + DeiT augmentation", workers, images_per_second(loader, opts.batches))
        )
        loader = eval_loader(eval_set, opts.batch_size, workers=workers)
        rows.append(
            (
                "eval: decode + resize + centre crop",
                workers,
                images_per_second(loader, opts.batches),
            )
        )
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-root", type=Path, help="folder with train/<class>/ images")
    parser.add_argument("--count", type=int, default=320, help="JPEGs to make (default folder)")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--img-size", type=int, default=224)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--batches", type=int, default=8, help="timed batches per setting")
    opts = parser.parse_args(argv)
    if any(w < 0 for w in opts.workers):
        raise ValueError(f"--workers {opts.workers}: worker counts must be 0 or more")
    with tempfile.TemporaryDirectory() as tmp:
        root = opts.data_root or make_jpeg_folder(Path(tmp), opts.count)
        paths = sorted((root / "train").rglob("*"))[:64] if (root / "train").is_dir() else []
        rows = run(opts, root)
        decoders = decode_rates([p for p in paths if p.is_file()], repeats=2)
    source = opts.data_root or f"{opts.count} JPEG crops of scikit-learn's photographs"
    print(
        f"\ndata pipeline alone, {opts.img_size}px, batch {opts.batch_size}, one torch thread "
        f"per process; images: {source}\n"
    )
    print("| pipeline | workers | images/s | images/s per worker |")
    print("| --- | ---: | ---: | ---: |")
    for name, workers, rate in rows:
        print(f"| {name} | {workers} | {rate:.0f} | {rate / max(workers, 1):.0f} |")
    for name, rate in decoders.items():
        print(f"| decode only: {name} | 0 | {rate:.0f} | {rate:.0f} |")


if __name__ == "__main__":
    sys.exit(entry_point(main, PROG)())
