"""scikit-learn's bundled handwritten digits as a small image classification set.

``sklearn.datasets.load_digits`` ships 1,797 real 8 x 8 grey-scale digits (UCI "Optical
Recognition of Handwritten Digits", 16 grey levels) with the library, so no download is needed.
They are upsampled once (bilinear) to the requested size (16 x 16 by default), and split with a fixed
seed into 1,437 training and 360 test images, stratified by class. This is the embedded default
data set: a tiny ViT learns it on a CPU in minutes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from PIL import Image
from torch import Tensor
from torch.utils.data import Dataset

from recurnmt.vision.data.transforms import Transform, tensor_to_pil

NUM_CLASSES = 10
SPLIT_SEED = 0
TEST_FRACTION = 0.2
# mean and standard deviation of the training pixels in [0, 1] at 16 x 16 (fixed by the split)
MEAN = (0.3054,)
STD = (0.3190,)


def load_digits_tensors(split: str, img_size: tuple[int, int]) -> tuple[Tensor, Tensor]:
    """Images N x 1 x H x W in [0, 1] and labels N of the ``train`` or ``test`` split."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    if split not in ("train", "test"):
        raise ValueError(f"digits has splits train and test, not {split!r}")
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32) / 16.0  # N x 8 x 8
    labels = torch.tensor(digits.target, dtype=torch.long)
    idx_train, idx_test = train_test_split(
        list(range(len(labels))),
        test_size=TEST_FRACTION,
        random_state=SPLIT_SEED,
        stratify=digits.target,
    )
    idx = torch.tensor(idx_train if split == "train" else idx_test)
    x = images[idx][:, None]  # N x 1 x 8 x 8
    if tuple(img_size) != (8, 8):
        x = F.interpolate(x, size=tuple(img_size), mode="bilinear", align_corners=False)
    return x.clamp_(0, 1), labels[idx]


class DigitsDataset(Dataset):
    """The digits split as (image C x H x W, label) pairs.

    Args:
        split: ``train`` (1,437 images) or ``test`` (360 images).
        img_size: the size the 8 x 8 digits are upsampled to.
        transform: applied to each image (a grey PIL image); the image itself without one.
    """

    def __init__(
        self, split: str, img_size: tuple[int, int] = (16, 16), transform: Transform | None = None
    ) -> None:
        self.images, self.labels = load_digits_tensors(split, img_size)
        self.transform = transform
        self.classes = [str(i) for i in range(NUM_CLASSES)]
        # 8-bit grey PIL images, as timm's transforms take them; made once (about a quarter of
        # the per-image cost when made per call), the transforms return new images
        self._pil = [tensor_to_pil(x) for x in self.images]

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[Tensor | Image.Image, int]:
        img = self._pil[index]
        return (self.transform(img) if self.transform is not None else img), int(self.labels[index])
