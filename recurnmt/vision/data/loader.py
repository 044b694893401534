"""Data loaders for training and evaluation, in one process or many.

Training samples come from DeiT's repeated-augmentation sampler when several processes train
with ``aug_repeats`` > 0 (Hoffer et al. 2020; DeiT sec. 6 and Table 9: each image three times
per epoch, the copies on different processes; timm's ``RepeatAugSampler``, which also keeps
DeiT's epoch length of the data set's size rounded down to a multiple of 256), otherwise from
torch's ``DistributedSampler`` (one shuffled shard per process; a single process is a world of
one). Either is wrapped by :class:`~.seeded.EpochPositions` so that every sample's
augmentation is seeded (:mod:`.seeded`).

Workers decode and augment in parallel, stay alive across epochs (``persistent_workers``) and,
when an accelerator exists, hand over pinned memory for asynchronous copies. Evaluation shards
the set by rank without padding, so every image counts once.
"""

from __future__ import annotations

import torch
from timm.data.distributed_sampler import RepeatAugSampler
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset

from recurnmt.vision.data.seeded import EpochPositions, SeededSamples


def _loader_options(workers: int, device: torch.device) -> dict:
    return dict(
        num_workers=workers,
        persistent_workers=workers > 0,
        pin_memory=device.type != "cpu",  # pinned pages only help copies to an accelerator
    )


def train_loader(
    dataset: Dataset,
    batch_size: int,
    *,
    rank: int,
    world_size: int,
    seed: int,
    workers: int,
    device: torch.device,
    aug_repeats: int = 0,
) -> DataLoader:
    """The training loader of one process; call ``loader.sampler.set_epoch(e)`` every epoch.

    Args:
        dataset: the augmenting training set.
        batch_size: this process's micro-batch.
        rank: this process's rank; world_size: the number of processes.
        seed: the run's seed (shuffling and every sample's augmentation).
        workers: data-loading processes.
        device: where the batches go (pinned memory for accelerators).
        aug_repeats: copies of each image per epoch across processes (DeiT: 3); only used
            when several processes train.
    """
    if aug_repeats > 0 and world_size > 1:
        sampler = RepeatAugSampler(
            dataset,
            num_replicas=world_size,
            rank=rank,
            shuffle=True,
            num_repeats=aug_repeats,
            # DeiT rounds an epoch down to a multiple of 256 images; a smaller set keeps its
            # size (timm 1.0.31's rule, stated here for older timm, whose epoch would be empty)
            selected_round=256 if len(dataset) >= 256 else 0,
        )
    else:
        sampler = DistributedSampler(
            dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed, drop_last=True
        )
    return DataLoader(
        SeededSamples(dataset, seed, rank),
        batch_size=batch_size,
        sampler=EpochPositions(sampler),
        drop_last=True,
        **_loader_options(workers, device),
    )


def eval_loader(
    dataset: Dataset,
    batch_size: int,
    *,
    rank: int = 0,
    world_size: int = 1,
    workers: int = 0,
    device: torch.device | None = None,
) -> DataLoader:
    """This process's shard of the evaluation set, in order (``device``: CPU when omitted)."""
    shard = Subset(dataset, range(rank, len(dataset), world_size))
    options = _loader_options(workers, device or torch.device("cpu"))
    return DataLoader(shard, batch_size=batch_size, **options)
