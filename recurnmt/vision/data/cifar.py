"""CIFAR-10 and CIFAR-100 from the official "python version" archives (Krizhevsky 2009).

Layout after extracting ``cifar-10-python.tar.gz`` / ``cifar-100-python.tar.gz``::

    cifar-10-batches-py/  data_batch_1 ... data_batch_5, test_batch, batches.meta
    cifar-100-python/     train, test, meta

Every batch file is a pickled dict with ``b"data"`` (N x 3072 uint8, the red, green and blue
32 x 32 planes of each image in turn) and ``b"labels"`` (CIFAR-10) or ``b"fine_labels"``
(CIFAR-100). Pickles can run code when loaded; these are read with an unpickler that only
rebuilds numpy arrays and plain Python containers.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import Tensor
from torch.utils.data import Dataset

from recurnmt.vision.data.transforms import Transform, tensor_to_pil

CIFAR10_MEAN, CIFAR10_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
CIFAR100_MEAN, CIFAR100_STD = (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)

_LAYOUT = {
    10: (
        "cifar-10-batches-py",
        [f"data_batch_{i}" for i in range(1, 6)],
        ["test_batch"],
        "batches.meta",
        b"labels",
        b"label_names",
    ),
    100: ("cifar-100-python", ["train"], ["test"], "meta", b"fine_labels", b"fine_label_names"),
}

_ALLOWED = {
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("_codecs", "encode"),
}


class _ArrayUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) not in _ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a CIFAR file")
        return super().find_class(module, name)


def read_batch(path: Path) -> dict:
    """One CIFAR batch file as a dict with bytes keys."""
    with open(path, "rb") as f:
        return _ArrayUnpickler(f, encoding="bytes").load()


def _find_dir(root: Path, name: str) -> Path:
    for candidate in (root / name, root):
        if (candidate / _marker(name)).exists():
            return candidate
    raise FileNotFoundError(
        f"no {name}/ under {root}; extract the official python-version archive there"
    )


def _marker(name: str) -> str:
    return "batches.meta" if name.startswith("cifar-10-") else "meta"


def load_cifar(root: str | Path, num_classes: int, split: str) -> tuple[Tensor, Tensor, list[str]]:
    """Images N x 3 x 32 x 32 (uint8), labels N and class names of a CIFAR split.

    Raises:
        FileNotFoundError: the extracted archive is not at ``root``.
        ValueError: unknown ``num_classes`` or ``split``.
    """
    if num_classes not in _LAYOUT:
        raise ValueError(f"CIFAR has 10 or 100 classes, not {num_classes}")
    if split not in ("train", "test"):
        raise ValueError(f"CIFAR has splits train and test, not {split!r}")
    dirname, train_files, test_files, meta_file, label_key, names_key = _LAYOUT[num_classes]
    directory = _find_dir(Path(root), dirname)
    datas, labels = [], []
    for name in train_files if split == "train" else test_files:
        batch = read_batch(directory / name)
        datas.append(np.asarray(batch[b"data"], dtype=np.uint8))
        labels.extend(int(v) for v in batch[label_key])
    data = np.concatenate(datas).reshape(-1, 3, 32, 32)  # planes R, G, B of 32 x 32
    names = [n.decode() for n in read_batch(directory / meta_file)[names_key]]
    return torch.from_numpy(data.copy()), torch.tensor(labels, dtype=torch.long), names


class CifarDataset(Dataset):
    """A CIFAR split as (``transform`` of the 32 x 32 RGB PIL image, label) pairs."""

    def __init__(
        self,
        root: str | Path,
        num_classes: int = 10,
        split: str = "train",
        transform: Transform | None = None,
    ) -> None:
        self.images, self.labels, self.classes = load_cifar(root, num_classes, split)
        self.transform = transform

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[Tensor | Image.Image, int]:
        img = tensor_to_pil(self.images[index])
        return (self.transform(img) if self.transform is not None else img), int(self.labels[index])
