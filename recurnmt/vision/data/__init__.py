"""Image data sets: the embedded digits default, CIFAR-10/100 and ImageNet-style folders.

:func:`build_dataset` returns a data set and its :class:`DataSpec` (classes, channels,
normalisation, sensible augmentation defaults), so the training command needs only a name.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from torch.utils.data import Dataset

from recurnmt.vision.data import cifar, digits
from recurnmt.vision.data.cifar import CifarDataset
from recurnmt.vision.data.digits import DigitsDataset
from recurnmt.vision.data.image_folder import ImageFolderDataset, scan_folder
from recurnmt.vision.data.transforms import build_transform
from recurnmt.vision.registry import IMAGENET_MEAN, IMAGENET_STD

# DeiT's augmentation (Touvron et al. 2021, Table 9), which SReT (appendix E) and
# RingFormer-ViT train with; timm's names for it
DEIT_AUTO_AUGMENT = "rand-m9-mstd0.5-inc1"
DEIT_COLOR_JITTER = 0.4
DEIT_ERASE = 0.25


@dataclass(frozen=True)
class DataSpec:
    """What a model and the augmentation need to know about a data set.

    Attributes:
        name: data set name.
        num_classes: number of classes.
        in_chans: image channels.
        mean: per-channel mean for normalisation.
        std: per-channel standard deviation.
        img_size: default training resolution (rows, cols).
        crop_pct: evaluation centre-crop fraction.
        hflip: horizontal flip probability (0 for digits: a mirrored 3 is no 3).
        scale: random-resized-crop area range.
        erase: random erasing probability.
        eval_split: name of the held-out split.
        interpolation: resizing filter of the crops (timm's name; DeiT: bicubic).
        auto_augment: timm's RandAugment / AutoAugment string; empty for none.
        color_jitter: brightness, contrast and saturation jitter (0: none; timm ignores it
            when ``auto_augment`` is set, as DeiT does).
        erase_mode: random erasing fill (``pixel``: per-pixel normal noise, DeiT's).
    """

    name: str
    num_classes: int
    in_chans: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    img_size: tuple[int, int]
    crop_pct: float = 0.875
    hflip: float = 0.5
    scale: tuple[float, float] = (0.08, 1.0)
    erase: float = 0.25
    eval_split: str = "val"
    interpolation: str = "bicubic"
    auto_augment: str = ""
    color_jitter: float = 0.0
    erase_mode: str = "pixel"


SPECS = {
    "digits": DataSpec(
        "digits",
        10,
        1,
        digits.MEAN,
        digits.STD,
        (16, 16),
        crop_pct=1.0,
        hflip=0.0,
        scale=(0.6, 1.0),
        erase=0.0,
        eval_split="test",
    ),
    "cifar10": DataSpec(
        "cifar10",
        10,
        3,
        cifar.CIFAR10_MEAN,
        cifar.CIFAR10_STD,
        (32, 32),
        crop_pct=1.0,
        scale=(0.35, 1.0),
        eval_split="test",
    ),
    "cifar100": DataSpec(
        "cifar100",
        100,
        3,
        cifar.CIFAR100_MEAN,
        cifar.CIFAR100_STD,
        (32, 32),
        crop_pct=1.0,
        scale=(0.35, 1.0),
        eval_split="test",
    ),
    "imagenet": DataSpec(
        "imagenet",
        1000,
        3,
        IMAGENET_MEAN,
        IMAGENET_STD,
        (224, 224),
        erase=DEIT_ERASE,
        auto_augment=DEIT_AUTO_AUGMENT,
        color_jitter=DEIT_COLOR_JITTER,
    ),
}


def data_spec(name: str, root: str | None = None) -> DataSpec:
    """The spec of data set ``name``; an image folder counts its classes under ``root/train``."""
    if name not in SPECS:
        raise ValueError(f"unknown data set {name!r}; choose one of {', '.join(SPECS)}")
    spec = SPECS[name]
    if name == "imagenet" and root is not None:
        from pathlib import Path

        _, classes = scan_folder(Path(root) / "train")
        spec = replace(spec, num_classes=len(classes))
    return spec


def build_dataset(
    name: str,
    split: str,
    *,
    root: str | None = None,
    img_size: tuple[int, int] | None = None,
    augment: bool = False,
    spec: DataSpec | None = None,
) -> tuple[Dataset, DataSpec]:
    """A data set split with its transform.

    Args:
        name: ``digits``, ``cifar10``, ``cifar100`` or ``imagenet`` (a folder layout).
        split: ``train`` or the evaluation split (``test`` / ``val``; ``eval`` picks it).
        root: data folder (not needed for digits).
        img_size: model resolution; the spec's default when omitted.
        augment: training augmentation (otherwise resize + centre crop).
        spec: overrides the default spec (e.g. other augmentation strengths).
    """
    spec = spec or data_spec(name, root if name == "imagenet" else None)
    size = tuple(img_size or spec.img_size)
    if split == "eval":
        split = spec.eval_split
    transform = build_transform(spec, size, train=augment)
    if name == "digits":
        return DigitsDataset(split, size, transform), spec
    if root is None:
        raise ValueError(f"data set {name} needs --data-root")
    if name in ("cifar10", "cifar100"):
        return CifarDataset(root, spec.num_classes, split, transform), spec
    return ImageFolderDataset(root, split, transform), spec


__all__ = [
    "SPECS",
    "CifarDataset",
    "DataSpec",
    "DigitsDataset",
    "ImageFolderDataset",
    "build_dataset",
    "data_spec",
]
