"""Per-image transforms: timm's, configured from a :class:`~recurnmt.vision.data.DataSpec`.

Training (DeiT sec. 6 and Table 9, Touvron et al. 2021; SReT appendix E trains with DeiT's
recipe): random resized crop with bicubic interpolation, horizontal flip, RandAugment
``rand-m9-mstd0.5-inc1`` (Cubuk et al. 2020, in timm's variant: magnitude 9 drawn with standard
deviation 0.5, increasing-severity operations), colour jitter 0.4, normalisation, random erasing
in pixel mode (Zhong et al. 2020, p = 0.25). timm turns colour jitter off when RandAugment is
on, as DeiT's code (which calls the same factory) does. Evaluation resizes the shorter side to
``size / crop_pct`` and takes the centre crop (DeiT: crop_pct 0.875).

The transforms take PIL images, which is what timm's RandAugment operates on; the data sets
hand them PIL images (decoded by torchvision for image folders, converted from tensors for
digits and CIFAR). Their randomness comes from Python's, numpy's and torch's global generators,
which :mod:`.seeded` sets per sample.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from PIL import Image
from timm.data import create_transform
from timm.data.auto_augment import RandAugment, posterize
from torch import Tensor
from torchvision.transforms.functional import to_pil_image

if TYPE_CHECKING:
    from recurnmt.vision.data import DataSpec

Transform = Callable[[Image.Image], Tensor]


def tensor_to_pil(x: Tensor) -> Image.Image:
    """A C x H x W image (uint8, or float in [0, 1]) -> a PIL image (grey ``L`` for C = 1)."""
    if x.is_floating_point():
        x = x.mul(255).round_().clamp_(0, 255).byte()
    return to_pil_image(x, mode="L" if x.size(0) == 1 else "RGB")


def posterize_keeping_no_bits(img: Image.Image, bits_to_keep: int, **kwargs) -> Image.Image:
    """timm's posterize, also for 0 bits: an all-zero image, what Pillow up to 12 returned.

    timm 1.0.31's ``rand-m9-mstd0.5-inc1`` asks for 0 bits whenever the drawn magnitude reaches
    10 (N(9, 0.5) clipped to [0, 10]: 2.3 % of its draws); Pillow 13 refuses that with
    "bits must be between or equal to 1 and 8", which would stop a training run.
    """
    if bits_to_keep <= 0:
        return Image.new(img.mode, img.size)
    return posterize(img, bits_to_keep, **kwargs)


def _posterize_safely(transform) -> None:
    for step in getattr(transform, "transforms", []):
        if isinstance(step, RandAugment):
            for op in step.ops:
                if op.aug_fn is posterize:
                    op.aug_fn = posterize_keeping_no_bits


def build_transform(spec: DataSpec, img_size: tuple[int, int], train: bool) -> Transform:
    """timm's training or evaluation transform for images of ``spec`` at ``img_size``."""
    common = dict(
        input_size=(spec.in_chans, *img_size),
        interpolation=spec.interpolation,
        mean=spec.mean,
        std=spec.std,
    )
    if not train:
        return create_transform(**common, is_training=False, crop_pct=spec.crop_pct)
    transform = create_transform(
        **common,
        is_training=True,
        scale=spec.scale,
        hflip=spec.hflip,
        color_jitter=spec.color_jitter or None,
        auto_augment=spec.auto_augment or None,
        re_prob=spec.erase,
        re_mode=spec.erase_mode,
    )
    _posterize_safely(transform)
    return transform
