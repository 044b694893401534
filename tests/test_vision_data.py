"""Data sets (digits, CIFAR pickles, image folders), tensor transforms and mixup/cutmix."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch

from recurnmt.vision.data import SPECS, Mixup, build_dataset, data_spec, smooth_one_hot
from recurnmt.vision.data.cifar import read_batch
from recurnmt.vision.data.transforms import (
    RandomErasing,
    RandomResizedCrop,
    ResizeCenterCrop,
    pil_to_tensor,
    train_transform,
)

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


def test_pil_to_tensor_keeps_channels_and_range():
    from PIL import Image

    img = Image.new("RGB", (5, 3), (255, 0, 128))
    x = pil_to_tensor(img)
    assert x.shape == (3, 3, 5)
    torch.testing.assert_close(x[:, 0, 0], torch.tensor([1.0, 0.0, 128 / 255]))


def test_random_resized_crop_and_centre_crop_shapes():
    torch.manual_seed(0)
    x = torch.rand(3, 40, 60)
    assert RandomResizedCrop((16, 12))(x).shape == (3, 16, 12)
    top, left, h, w = RandomResizedCrop((8, 8), scale=(0.5, 0.5)).box(40, 60)
    assert 0 <= top <= 40 - h and 0 <= left <= 60 - w
    assert abs(h * w / 2400 - 0.5) < 0.1
    assert ResizeCenterCrop((32, 32), 0.875)(x).shape == (3, 32, 32)


def test_augmentation_is_reproducible_from_the_generator_state():
    t = train_transform((16, 16), (0.5,), (0.5,), erase=1.0)
    x = torch.rand(1, 16, 16)
    torch.manual_seed(3)
    a = t(x)
    torch.manual_seed(3)
    torch.testing.assert_close(t(x), a)


def test_random_erasing_changes_a_rectangle_only():
    torch.manual_seed(1)
    x = torch.zeros(3, 20, 20)
    y = RandomErasing(p=1.0)(x)
    changed = (y != 0).any(dim=0)
    rows, cols = changed.any(dim=1).nonzero(), changed.any(dim=0).nonzero()
    assert changed.sum() == (rows.max() - rows.min() + 1) * (cols.max() - cols.min() + 1)


def test_smooth_one_hot():
    t = smooth_one_hot(torch.tensor([2, 0]), 4, 0.1)
    torch.testing.assert_close(t.sum(1), torch.ones(2))
    assert t[0, 2] == pytest.approx(0.925) and t[0, 0] == pytest.approx(0.025)


@pytest.mark.parametrize(("mix", "cut"), [(0.8, 0.0), (0.0, 1.0), (0.8, 1.0)])
def test_mixup_and_cutmix_mix_images_and_labels_alike(mix, cut):
    torch.manual_seed(0)
    x = torch.stack([torch.zeros(1, 8, 8), torch.ones(1, 8, 8)])  # B = 2, partner = flip
    y = torch.tensor([0, 1])
    mixed, soft = Mixup(2, mix, cut, label_smoothing=0.0)(x, y)
    torch.testing.assert_close(soft.sum(1), torch.ones(2))
    # the share of image 1's pixels in sample 0 is the weight of label 1 in its target
    torch.testing.assert_close(mixed[0].mean(), soft[0, 1])


def test_specs_do_not_flip_digits():
    assert SPECS["digits"].hflip == 0.0 and SPECS["cifar10"].hflip == 0.5
