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
    return create_transform(
        **common,
        is_training=True,
        scale=spec.scale,
        hflip=spec.hflip,
        color_jitter=spec.color_jitter or None,
        auto_augment=spec.auto_augment or None,
        re_prob=spec.erase,
        re_mode=spec.erase_mode,
    )
