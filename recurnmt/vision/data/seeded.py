"""Augmentation drawn from a seed per sample: the same run with any number of data workers.

timm's transforms draw from Python's, numpy's and torch's global generators. In data-loader
workers those generators are seeded once when a worker starts, so the augmentations a run sees
would depend on how many workers it has, and persistent workers (which live across epochs)
would make a resumed run differ from one that never stopped. Instead, every sample's
augmentation here is drawn after seeding the three generators from (run seed, rank, epoch,
position in the epoch): one number per sample, whatever process draws it.

:class:`EpochPositions` wraps the training sampler and yields ``(epoch, position, index)``
keys; :class:`SeededSamples` wraps the data set and seeds before each ``dataset[index]``. In the
main process (``--workers 0``) the generators' states are restored afterwards, so that dropout
and mixup there keep their own stream. The position (not the index) is in the seed, so the
repeats of one image under repeated augmentation are augmented differently.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler, get_worker_info

Key = tuple[int, int, int]  # (epoch, position, index)


class EpochPositions(Sampler[Key]):
    """Yields ``(epoch, position, index)`` for every index of ``sampler`` in this epoch."""

    def __init__(self, sampler: Sampler[int]) -> None:
        self.sampler = sampler
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[Key]:
        for position, index in enumerate(self.sampler):
            yield self.epoch, position, int(index)

    def __len__(self) -> int:
        return len(self.sampler)


def sample_seed(seed: int, rank: int, epoch: int, position: int) -> int:
    """A 32-bit seed for one sample.

    Python's hash of a tuple of ints is fixed (no per-process salt, unlike strings'), and the
    generators' own seeding scrambles it further.
    """
    return hash((seed, rank, epoch, position)) & 0xFFFFFFFF


class SeededSamples(Dataset):
    """``dataset[index]`` with the global generators seeded by :func:`sample_seed`.

    The data loader fetches a batch at once (``__getitems__``), so the main process saves and
    restores its generators once per batch, not once per image.

    Args:
        dataset: the (augmenting) data set.
        seed: the run's seed.
        rank: this process's rank (ranks augment the same image differently).
    """

    def __init__(self, dataset: Dataset, seed: int, rank: int = 0) -> None:
        self.dataset, self.seed, self.rank = dataset, seed, rank

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: Key):
        return self.__getitems__([key])[0]

    def __getitems__(self, keys: list[Key]) -> list:
        saved = None
        if get_worker_info() is None:  # the main process: keep its own streams
            saved = (random.getstate(), np.random.get_state(), torch.get_rng_state())
        try:
            samples = []
            for epoch, position, index in keys:
                value = sample_seed(self.seed, self.rank, epoch, position)
                random.seed(value)
                np.random.seed(value)
                torch.default_generator.manual_seed(value)  # CPU only: CUDA keeps its stream
                samples.append(self.dataset[index])
            return samples
        finally:
            if saved is not None:
                random.setstate(saved[0])
                np.random.set_state(saved[1])
                torch.set_rng_state(saved[2])
