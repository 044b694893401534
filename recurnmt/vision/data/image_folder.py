"""ImageNet in the usual folder layout, one sub-folder per class::

    root/train/n01440764/n01440764_10026.JPEG
    root/val/n01440764/ILSVRC2012_val_00000293.JPEG

Class indices follow the sorted folder names, so train and val agree. Images are decoded by
torchvision (``torchvision.io.decode_image``: libjpeg-turbo for JPEG, grey and CMYK JPEGs
converted to RGB) and handed to timm's transforms of :mod:`.transforms` as PIL images.
``scripts/benchmark_data.py`` measures this pipeline in images per second per worker.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from PIL import Image
from torch import Tensor
from torch.utils.data import Dataset
from torchvision.io import ImageReadMode, decode_image, read_file

from recurnmt.vision.data.transforms import Transform, tensor_to_pil

# torchvision 0.29 announces that its image codecs will move to TorchCodec (not a dependency
# here); they work, and the pinned torchvision keeps them. Silenced by its exact message, once
# per call it would otherwise be printed for every image.
warnings.filterwarnings(
    "ignore",
    message="The image decoding and encoding capabilities of TorchVision are deprecated",
    category=DeprecationWarning,
)

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".ppm", ".webp", ".tif", ".tiff")


def scan_folder(
    root: Path, classes: list[str] | None = None
) -> tuple[list[tuple[Path, int]], list[str]]:
    """(file, class index) pairs under ``root``'s class folders, and the class names.

    Args:
        root: folder of class folders.
        classes: the class list to index by (the training split's, so that a validation
            split missing a class still uses the same indices); its own folders by default.

    Raises:
        FileNotFoundError: ``root`` is missing or holds no class folder with images.
        ValueError: ``root`` has a class folder that ``classes`` lacks.
    """
    if not root.is_dir():
        raise FileNotFoundError(f"image folder {root} does not exist")
    found = sorted(d.name for d in root.iterdir() if d.is_dir())
    if classes is None:
        classes = found
    unknown = sorted(set(found) - set(classes))
    if unknown:
        raise ValueError(f"{root} has classes missing from training: {', '.join(unknown[:5])}")
    samples = [
        (path, index)
        for index, name in enumerate(classes)
        if (root / name).is_dir()
        for path in sorted((root / name).rglob("*"))
        if path.suffix.lower() in IMAGE_SUFFIXES
    ]
    if not samples:
        raise FileNotFoundError(f"no images in class folders under {root}")
    return samples, classes


class ImageFolderDataset(Dataset):
    """Images of ``root/<split>/<class>/*`` as (tensor, class index) pairs.

    Args:
        root: the data set folder (holding ``train/`` and ``val/``).
        split: sub-folder to read.
        transform: applied to each RGB image (PIL); the image itself without one.

    Class indices follow the sorted class folders of ``root/train`` when it exists.
    """

    def __init__(
        self, root: str | Path, split: str = "train", transform: Transform | None = None
    ) -> None:
        root = Path(root)
        classes = None
        if split != "train" and (root / "train").is_dir():
            classes = sorted(d.name for d in (root / "train").iterdir() if d.is_dir())
        self.samples, self.classes = scan_folder(root / split, classes)
        self.transform = transform

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Tensor | Image.Image, int]:
        path, label = self.samples[index]
        img = tensor_to_pil(decode_image(read_file(str(path)), mode=ImageReadMode.RGB))
        return (self.transform(img) if self.transform is not None else img), label
