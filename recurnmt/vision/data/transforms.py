"""Image transforms on tensors, DeiT-style but small (no torchvision needed).

Every transform takes and returns a C x H x W float tensor with values in [0, 1] (before
:class:`Normalize`) and draws its randomness from torch's global generator, so a checkpoint
that saves the generator state resumes the exact same augmentation stream.

Training (DeiT sec. 6 / Table 9, Touvron et al. 2021): random resized crop, horizontal flip,
normalisation, random erasing; batch-level mixup/cutmix live in :mod:`.mixup`. Evaluation:
resize the shorter side to ``size / crop_pct`` and take the centre crop (DeiT: crop_pct 0.875).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from PIL import Image
from torch import Tensor

Transform = Callable[[Tensor], Tensor]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def pil_to_tensor(img: Image.Image) -> Tensor:
    """PIL image -> C x H x W float tensor in [0, 1] (RGB images give C = 3)."""
    if img.mode not in ("RGB", "L"):
        img = img.convert("RGB")
    x = torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8)
    channels = 3 if img.mode == "RGB" else 1
    x = x.view(img.size[1], img.size[0], channels).permute(2, 0, 1)  # C x H x W
    return x.float().div_(255)


def resize(x: Tensor, size: tuple[int, int]) -> Tensor:
    """Bilinear resize with anti-aliasing of a C x H x W tensor to ``size`` (rows, cols)."""
    if tuple(x.shape[-2:]) == tuple(size):
        return x
    return F.interpolate(x[None], size=size, mode="bilinear", align_corners=False, antialias=True)[
        0
    ]


class Compose:
    """Applies transforms in order."""

    def __init__(self, transforms: Sequence[Transform]) -> None:
        self.transforms = list(transforms)

    def __call__(self, x: Tensor) -> Tensor:
        for t in self.transforms:
            x = t(x)
        return x


class RandomResizedCrop:
    """Crop a random area fraction in ``scale`` with aspect ratio in ``ratio``, resize to ``size``.

    Inception-style cropping (Szegedy et al. 2015), DeiT's default scale (0.08, 1): ten tries
    at a crop that fits, then the whole image clipped to the allowed ratio.
    """

    def __init__(
        self,
        size: tuple[int, int],
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
    ) -> None:
        self.size, self.scale, self.ratio = tuple(size), scale, ratio

    def box(self, height: int, width: int) -> tuple[int, int, int, int]:
        """A crop (top, left, rows, cols) of a ``height`` x ``width`` image."""
        area = height * width
        log_ratio = (math.log(self.ratio[0]), math.log(self.ratio[1]))
        for _ in range(10):
            target = area * torch.empty(1).uniform_(*self.scale).item()
            aspect = math.exp(torch.empty(1).uniform_(*log_ratio).item())
            w = round(math.sqrt(target * aspect))
            h = round(math.sqrt(target / aspect))
            if 0 < w <= width and 0 < h <= height:
                top = int(torch.randint(0, height - h + 1, (1,)))
                left = int(torch.randint(0, width - w + 1, (1,)))
                return top, left, h, w
        aspect = width / height
        if aspect < self.ratio[0]:
            w, h = width, round(width / self.ratio[0])
        elif aspect > self.ratio[1]:
            h, w = height, round(height * self.ratio[1])
        else:
            h, w = height, width
        return (height - h) // 2, (width - w) // 2, h, w

    def __call__(self, x: Tensor) -> Tensor:
        top, left, h, w = self.box(x.size(-2), x.size(-1))
        return resize(x[..., top : top + h, left : left + w], self.size)


class RandomHorizontalFlip:
    """Mirror left-right with probability ``p``."""

    def __init__(self, p: float = 0.5) -> None:
        self.p = p

    def __call__(self, x: Tensor) -> Tensor:
        return x.flip(-1) if torch.rand(1).item() < self.p else x


class ResizeCenterCrop:
    """Resize the shorter side to ``size / crop_pct``, then take the central ``size`` crop."""

    def __init__(self, size: tuple[int, int], crop_pct: float = 0.875) -> None:
        self.size, self.crop_pct = tuple(size), crop_pct

    def __call__(self, x: Tensor) -> Tensor:
        h, w = x.shape[-2:]
        short = min(self.size) / self.crop_pct
        scale = short / min(h, w)
        rows = max(self.size[0], round(h * scale))
        cols = max(self.size[1], round(w * scale))
        x = resize(x, (rows, cols))
        top, left = (rows - self.size[0]) // 2, (cols - self.size[1]) // 2
        return x[..., top : top + self.size[0], left : left + self.size[1]]


class Normalize:
    """``(x - mean) / std`` per channel."""

    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        self.mean = torch.tensor(mean).view(-1, 1, 1)
        self.std = torch.tensor(std).view(-1, 1, 1)

    def __call__(self, x: Tensor) -> Tensor:
        return (x - self.mean) / self.std


class RandomErasing:
    """Replace a random rectangle by Gaussian noise with probability ``p`` (Zhong et al. 2020).

    Applied after normalisation, as in DeiT (p = 0.25, per-pixel noise).
    """

    def __init__(
        self,
        p: float = 0.25,
        scale: tuple[float, float] = (0.02, 1 / 3),
        ratio: tuple[float, float] = (0.3, 3.3),
    ) -> None:
        self.p, self.scale, self.ratio = p, scale, ratio

    def __call__(self, x: Tensor) -> Tensor:
        if self.p <= 0 or torch.rand(1).item() >= self.p:
            return x
        c, height, width = x.shape
        log_ratio = (math.log(self.ratio[0]), math.log(self.ratio[1]))
        for _ in range(10):
            target = height * width * torch.empty(1).uniform_(*self.scale).item()
            aspect = math.exp(torch.empty(1).uniform_(*log_ratio).item())
            h = round(math.sqrt(target * aspect))
            w = round(math.sqrt(target / aspect))
            if 0 < h < height and 0 < w < width:
                top = int(torch.randint(0, height - h + 1, (1,)))
                left = int(torch.randint(0, width - w + 1, (1,)))
                x = x.clone()
                x[:, top : top + h, left : left + w] = torch.randn(c, h, w)
                return x
        return x


def train_transform(
    size: tuple[int, int],
    mean: Sequence[float],
    std: Sequence[float],
    *,
    scale: tuple[float, float] = (0.08, 1.0),
    hflip: float = 0.5,
    erase: float = 0.25,
) -> Transform:
    """DeiT's per-image training augmentation (without RandAugment, kept modest)."""
    steps: list[Transform] = [RandomResizedCrop(size, scale)]
    if hflip > 0:
        steps.append(RandomHorizontalFlip(hflip))
    steps.append(Normalize(mean, std))
    if erase > 0:
        steps.append(RandomErasing(erase))
    return Compose(steps)


def eval_transform(
    size: tuple[int, int], mean: Sequence[float], std: Sequence[float], crop_pct: float = 0.875
) -> Transform:
    """Resize, centre crop and normalise."""
    return Compose([ResizeCenterCrop(size, crop_pct), Normalize(mean, std)])
