"""Data sets (digits, CIFAR pickles, image folders), timm's transforms as configured, seeded
augmentation and the loaders."""

from __future__ import annotations

import pickle
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from timm.data.auto_augment import RandAugment
from timm.data.random_erasing import RandomErasing
from timm.data.transforms import RandomResizedCropAndInterpolation
from torch.utils.data import DataLoader, Dataset

from recurnmt.vision.data import SPECS, build_dataset, data_spec
from recurnmt.vision.data.cifar import read_batch
from recurnmt.vision.data.loader import train_loader
from recurnmt.vision.data.seeded import EpochPositions, SeededSamples
from recurnmt.vision.data.transforms import build_transform, tensor_to_pil

FIXTURES = Path(__file__).parent / "fixtures" / "vision"


def test_digits_split_is_fixed_and_stratified():
    train, spec = build_dataset("digits", "train")
    test, _ = build_dataset("digits", "eval")
    assert (len(train), len(test)) == (1437, 360)
    assert spec.num_classes == 10 and spec.in_chans == 1 and spec.img_size == (16, 16)
    again, _ = build_dataset("digits", "test")
    torch.testing.assert_close(test.images, again.images)
    assert torch.bincount(test.labels).min() >= 35  # every class in the test split
    x, y = test[0]
    assert x.shape == (1, 16, 16) and isinstance(y, int)


def test_digits_upsampled_size_and_normalisation():
    train, spec = build_dataset("digits", "train", img_size=(32, 24))
    assert train.images.shape[1:] == (1, 32, 24)
    x = torch.stack([train[i][0] for i in range(200)])
    assert abs(x.mean().item()) < 0.2 and 0.7 < x.std().item() < 1.3


@pytest.mark.parametrize(
    ("name", "root", "n_train", "n_test"),
    [
        ("cifar10", FIXTURES, 20, 4),  # the parent of cifar-10-batches-py/
        ("cifar100", FIXTURES / "cifar-100-python", 5, 5),  # the folder itself
    ],
)
def test_cifar_pickles(name, root, n_train, n_test):
    train, spec = build_dataset(name, "train", root=str(root), augment=True)
    test, _ = build_dataset(name, "eval", root=str(root))
    assert (len(train), len(test)) == (n_train, n_test)
    assert train.images.dtype == torch.uint8 and train.images.shape[1:] == (3, 32, 32)
    assert len(train.classes) == spec.num_classes
    x, y = train[1]
    assert x.shape == (3, 32, 32) and 0 <= y < spec.num_classes
    # the fixture's pixels are digits tinted per channel: planes differ
    img = train.images[0].float()
    assert not torch.equal(img[0], img[1])


def test_cifar_loader_refuses_code_in_pickles(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("owned",))

    (tmp_path / "batch").write_bytes(pickle.dumps({b"data": Evil()}, protocol=2))
    with pytest.raises(pickle.UnpicklingError, match="refusing to load .*print"):
        read_batch(tmp_path / "batch")


def test_cifar_missing_folder_says_what_to_do(tmp_path):
    with pytest.raises(FileNotFoundError, match="extract the official python-version archive"):
        build_dataset("cifar10", "train", root=str(tmp_path))


def test_image_folder_layout():
    root = str(FIXTURES / "imagefolder")
    assert data_spec("imagenet", root).num_classes == 3
    train, spec = build_dataset("imagenet", "train", root=root, img_size=(24, 24), augment=True)
    val, _ = build_dataset("imagenet", "eval", root=root, img_size=(24, 24))
    assert len(train) == len(val) == 6
    assert val.classes == train.classes == ["n00000000", "n00000001", "n00000002"]
    x, y = val[5]
    assert x.shape == (3, 24, 24) and y == 2


def test_tensor_to_pil_keeps_channels_and_range():
    rgb = tensor_to_pil(
        torch.tensor([255, 0, 128], dtype=torch.uint8).view(3, 1, 1).expand(3, 3, 5)
    )
    assert rgb.mode == "RGB" and rgb.size == (5, 3) and rgb.getpixel((0, 0)) == (255, 0, 128)
    grey = tensor_to_pil(torch.full((1, 2, 2), 0.5))
    assert grey.mode == "L" and grey.getpixel((1, 1)) == 128


def test_imagenet_training_transform_is_deits():
    """timm's pipeline with DeiT's settings: bicubic random resized crop, RandAugment
    rand-m9-mstd0.5-inc1 (colour jitter off beside it, as in DeiT), pixel-mode erasing."""
    steps = build_transform(SPECS["imagenet"], (32, 32), train=True).transforms
    crop = next(t for t in steps if isinstance(t, RandomResizedCropAndInterpolation))
    assert crop.scale == (0.08, 1.0) and "bicubic" in str(crop)
    (augment,) = [t for t in steps if isinstance(t, RandAugment)]
    assert augment.num_layers == 2 and len(augment.ops) == 15
    assert all(op.magnitude == 9 and op.magnitude_std == 0.5 for op in augment.ops)
    assert "Increasing" in " ".join(op.name for op in augment.ops)  # the inc1 operation set
    assert not any("ColorJitter" in type(t).__name__ for t in steps)
    (erase,) = [t for t in steps if isinstance(t, RandomErasing)]
    assert erase.probability == 0.25 and erase.mode == "pixel"
    x = build_transform(SPECS["imagenet"], (32, 32), train=True)(
        tensor_to_pil(torch.rand(3, 40, 50))
    )
    assert x.shape == (3, 32, 32)


def test_randaugment_posterize_at_the_top_magnitude_survives_pillow_13():
    """timm's increasing posterize keeps 0 bits at magnitude 10, which Pillow 13 refuses; ours
    gives the all-zero image that keeping no bits means."""
    steps = build_transform(SPECS["imagenet"], (32, 32), train=True).transforms
    (augment,) = [t for t in steps if isinstance(t, RandAugment)]
    (op,) = [op for op in augment.ops if op.name == "PosterizeIncreasing"]
    op.prob, op.magnitude, op.magnitude_std = 1.0, 10, 0.0
    out = op(tensor_to_pil(torch.rand(3, 8, 8)))
    assert out.mode == "RGB" and max(out.getextrema()[0]) == 0


class _Draws(Dataset):
    """Returns what the global generators give, as an augmentation would draw them."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor([random.random(), np.random.rand(), torch.rand(()).item(), index])


def test_seeded_augmentation_is_the_same_with_any_number_of_workers():
    """A sample's draws depend on (seed, rank, epoch, position) only: two workers give what the
    main process gives, a new epoch or a repeated image gives new draws, and the main
    process's own streams are left where they were."""
    from torch.utils.data import SequentialSampler

    def batches(workers: int, epoch: int) -> torch.Tensor:
        sampler = EpochPositions(SequentialSampler(range(16)))
        sampler.set_epoch(epoch)
        loader = DataLoader(
            SeededSamples(_Draws(), seed=5), batch_size=4, sampler=sampler, num_workers=workers
        )
        return torch.cat(list(loader))

    torch.manual_seed(0)
    before = (torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate())
    SeededSamples(_Draws(), seed=5)[(0, 0, 3)]
    assert torch.equal(torch.get_rng_state(), before[0])
    assert (np.random.get_state()[1] == before[1]).all() and random.getstate() == before[2]
    main = batches(0, epoch=0)
    torch.testing.assert_close(batches(2, epoch=0), main)
    assert not torch.equal(batches(0, epoch=1)[:, :3], main[:, :3])
    assert len({tuple(row[:3].tolist()) for row in main}) == 16


def test_repeated_augmentation_spreads_the_copies_over_the_processes():
    """DeiT's sampler with 2 processes and 3 repeats: every image 3 times per epoch (the
    copies on both processes), augmented differently on each."""
    data = list(range(12))
    seen = []
    for rank in (0, 1):
        loader = train_loader(
            data,
            2,
            rank=rank,
            world_size=2,
            seed=0,
            workers=0,
            device=torch.device("cpu"),
            aug_repeats=3,
        )
        keys = list(loader.sampler)
        assert len(keys) == 6  # DeiT keeps an epoch at the data set's size (split by ranks)
        seen += [index for _, _, index in keys]
    counts = torch.bincount(torch.tensor(seen))
    assert counts.max() <= 3 and counts.sum() == 12
    plain = train_loader(
        data, 2, rank=0, world_size=1, seed=0, workers=0, device=torch.device("cpu")
    )
    assert sorted(i for _, _, i in plain.sampler) == data


def test_specs_do_not_flip_digits():
    assert SPECS["digits"].hflip == 0.0 and SPECS["cifar10"].hflip == 0.5
