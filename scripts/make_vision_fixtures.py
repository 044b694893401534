"""Writes the tiny vision test fixtures under tests/fixtures/vision/ (run once, output committed).

* ``cifar-10-batches-py/`` and ``cifar-100-python/``: the official "python version" layout and
  pickle format (protocol 2, numpy ``uint8`` data of N x 3072, label lists, meta files), with 4
  images per file. The pixels are real handwritten digits (scikit-learn's bundled set),
  upsampled to 32 x 32 and tinted, so the loader is exercised on real image content.
* ``imagefolder/{train,val}/<class>/*.png``: an ImageNet-style folder of the same digits.

Usage: ``python scripts/make_vision_fixtures.py [--out DIR]``
"""

from __future__ import annotations

import argparse
import pickle
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from sklearn.datasets import load_digits

from recurnmt.cli import entry_point

ROOT = Path(__file__).resolve().parents[1]

PROG = "python scripts/make_vision_fixtures.py"
OUT = ROOT / "tests" / "fixtures" / "vision"


def rgb_digits(n: int, offset: int) -> tuple[np.ndarray, list[int]]:
    """``n`` digits as N x 3 x 32 x 32 uint8 and their labels."""
    d = load_digits()
    idx = list(range(offset, offset + n))
    x = torch.tensor(d.images[idx], dtype=torch.float32)[:, None] / 16.0  # N x 1 x 8 x 8
    x = F.interpolate(x, size=(32, 32), mode="bilinear", align_corners=False)
    tint = torch.tensor([[1.0, 0.6, 0.3], [0.3, 1.0, 0.6], [0.6, 0.3, 1.0]])
    rgb = x * tint[torch.arange(n) % 3][:, :, None, None]  # N x 3 x 32 x 32
    return (rgb.clamp(0, 1) * 255).round().to(torch.uint8).numpy(), [int(v) for v in d.target[idx]]


def dump(path: Path, obj: dict) -> None:
    # numpy 1.x wrote these files; its arrays reference numpy.core.multiarray
    raw = pickle.dumps(obj, protocol=2).replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
    path.write_bytes(raw)


def cifar10(out: Path) -> None:
    root = out / "cifar-10-batches-py"
    root.mkdir(parents=True, exist_ok=True)
    for i in range(1, 7):
        name = f"data_batch_{i}" if i < 6 else "test_batch"
        x, y = rgb_digits(4, 4 * i)
        dump(
            root / name,
            {
                b"batch_label": name.encode(),
                b"labels": y,
                b"data": x.reshape(4, 3072),
                b"filenames": [b"x.png"] * 4,
            },
        )
    names = [
        b"airplane",
        b"automobile",
        b"bird",
        b"cat",
        b"deer",
        b"dog",
        b"frog",
        b"horse",
        b"ship",
        b"truck",
    ]
    dump(
        root / "batches.meta", {b"num_cases_per_batch": 4, b"label_names": names, b"num_vis": 3072}
    )


def cifar100(out: Path) -> None:
    root = out / "cifar-100-python"
    root.mkdir(parents=True, exist_ok=True)
    for name, offset in (("train", 40), ("test", 50)):
        x, y = rgb_digits(5, offset)
        fine = [v * 10 + 3 for v in y]  # spread over the 100 classes
        dump(
            root / name,
            {
                b"filenames": [b"x.png"] * 5,
                b"batch_label": name.encode(),
                b"fine_labels": fine,
                b"coarse_labels": [v // 5 for v in fine],
                b"data": x.reshape(5, 3072),
            },
        )
    dump(
        root / "meta",
        {
            b"fine_label_names": [f"class{i}".encode() for i in range(100)],
            b"coarse_label_names": [f"super{i}".encode() for i in range(20)],
        },
    )


def image_folder(out: Path) -> None:
    d = load_digits()
    for split, skip in (("train", 0), ("val", 2)):
        for label in (0, 1, 2):
            picks = [i for i, t in enumerate(d.target) if t == label][skip : skip + 2]
            folder = out / "imagefolder" / split / f"n0000000{label}"
            folder.mkdir(parents=True, exist_ok=True)
            for k, i in enumerate(picks):
                img, _ = rgb_digits(1, i)
                Image.fromarray(img[0].transpose(1, 2, 0)).save(folder / f"img{k}.png")


def main(argv: list[str] | None = None) -> None:
    """Writes the fixtures.

    Raises:
        NotADirectoryError: ``--out`` is a file.
    """
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT, help="default: tests/fixtures/vision")
    out = parser.parse_args(argv).out
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"--out {out} is a file, not a directory")
    cifar10(out)
    cifar100(out)
    image_folder(out)
    print(f"wrote fixtures to {out}")


if __name__ == "__main__":
    sys.exit(entry_point(main, PROG)())
