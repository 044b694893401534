"""What a training run holds from one phase to the next, and how it is saved and restored.

:func:`recurnmt.vision.training.setup.setup` builds a :class:`RunState`; :func:`resume` restores a
checkpoint into it (``--resume``) and :func:`save` writes one after every epoch
(``checkpoint.pt``, ``best.pt`` and the epoch's ``metrics.jsonl`` line) with every rank's random
streams (:mod:`recurnmt.vision.checkpoint` reads and writes the files).

Restoring the random streams (torch, CUDA, Python, numpy: :func:`rng_state`) at an epoch
boundary continues the run with the same data order (the sampler reshuffles from seed + epoch),
the same augmentations and dropout masks, hence the same losses as a run that never stopped.
"""

from __future__ import annotations

import json
import random
from argparse import Namespace
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from timm.data import Mixup
from timm.scheduler.scheduler import Scheduler
from timm.utils import ModelEmaV3
from torch import nn
from torch.utils.data import DataLoader

from recurnmt.vision.checkpoint import load_checkpoint, save_checkpoint
from recurnmt.vision.data import DataSpec
from recurnmt.vision.training.distributed import DistInfo, unwrap
from recurnmt.vision.training.engine import Precision
from recurnmt.vision.training.losses import ClassificationLoss
from recurnmt.vision.training.zero import full_optimizer_state, load_optimizer_state


def rng_state() -> dict[str, Any]:
    """This process's generator states, as tensors and plain values."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restores the states saved by :func:`rng_state`."""
    torch.set_rng_state(state["torch"])
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def seed_everything(seed: int) -> None:
    """Seeds torch, Python and numpy."""
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)


def _gather_rng(info: DistInfo) -> list:
    """Every rank's random generator states, in rank order (every rank takes part)."""
    states = [None] * info.world_size
    if info.distributed:
        dist.all_gather_object(states, rng_state())
    else:
        states[0] = rng_state()
    return states


def trim_metrics(path: Path, epochs: int) -> None:
    """Keeps the metrics lines of the first ``epochs`` epochs (none for a fresh run)."""
    if not path.exists():
        return
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    kept = [line for line in lines if json.loads(line)["epoch"] <= epochs]
    path.write_text("".join(line + "\n" for line in kept))


@dataclass
class RunState:
    """What a training run holds from one phase to the next:
    :func:`~recurnmt.vision.training.setup.setup` builds it, :func:`resume` restores a checkpoint
    into it, :func:`~recurnmt.vision.training.train.fit` trains it epoch by epoch and :func:`save`
    writes it after each epoch.

    Attributes:
        args: the parsed options.
        info: this process's rank, world size and device.
        log: prints a line on the main process.
        spec: the data set's normalisation, crop and augmentation.
        model: the bare model (what checkpoints store).
        model_name: its registered name; ``model_kwargs`` rebuild it.
        loader: this rank's training batches; ``evaluation``: its evaluation shard.
        images: training and evaluation images (before sharding).
        steps: optimiser updates per epoch.
        optimizer, scheduler: timm's (the optimizer sharded under ``--zero``).
        precision: autocast, loss scaling and memory layout.
        loss_fn: label smoothing, and the teacher when distilling.
        mixup: timm's batch mixer (``None``: off).
        ema: the weights' moving average (``None``: off).
        net: what trains: the model's training view, under DDP and ``torch.compile``
            (:func:`~recurnmt.vision.training.train.training_net`).
        epoch: epochs done; ``best``: the best top-1 so far.
        writer: the tensorboard writer of the main process (``None``: off).
    """

    args: Namespace
    info: DistInfo
    log: Callable[[str], None]
    spec: DataSpec
    model: nn.Module
    model_name: str
    model_kwargs: dict
    loader: DataLoader
    evaluation: DataLoader
    images: tuple[int, int]
    steps: int
    optimizer: torch.optim.Optimizer
    scheduler: Scheduler
    precision: Precision
    loss_fn: ClassificationLoss
    mixup: Mixup | None = None
    ema: ModelEmaV3 | None = None
    net: nn.Module | None = None
    epoch: int = 0
    best: float = 0.0
    writer: Any = None

    @property
    def out(self) -> Path:
        """The run's folder (``--output``)."""
        return Path(self.args.output)


def resume(state: RunState) -> None:
    """Continues ``--resume`` (``auto``: OUTPUT/checkpoint.pt when present): weights,
    optimizer, schedule, EMA, loss scale, epochs done, best top-1 and this rank's random
    streams (fresh ones, logged, when the process count changed)."""
    args, info = state.args, state.info
    path = args.resume
    if path == "auto":
        path = str(state.out / "checkpoint.pt") if (state.out / "checkpoint.pt").exists() else None
    if not path:
        return
    ckpt = load_checkpoint(path)
    state.model.load_state_dict(ckpt["model"])
    load_optimizer_state(state.optimizer, ckpt["optimizer"], path)
    state.scheduler.load_state_dict(ckpt["scheduler"])
    if state.ema is not None and "model_ema" in ckpt:
        state.ema.module.load_state_dict(ckpt["model_ema"])
    elif state.ema is not None:  # EMA switched on at this resume: it starts from the weights
        state.ema = ModelEmaV3(state.model, decay=args.model_ema_decay)
    scaler = state.precision.scaler
    if scaler is not None and ckpt.get("scaler"):
        scaler.load_state_dict(ckpt["scaler"])
    state.epoch, state.best = ckpt["epoch"], ckpt.get("best_top1", 0.0)
    if len(ckpt["rng"]) == info.world_size:
        set_rng_state(ckpt["rng"][info.rank])
    else:
        state.log(
            f"warning: checkpoint has {len(ckpt['rng'])} ranks, this run {info.world_size}; "
            "continuing with fresh random streams (not bit-identical)"
        )
        seed_everything(args.seed + 1000 * state.epoch + info.rank)
    state.log(f"resumed {path} at epoch {state.epoch}")


def save(state: RunState, record: dict) -> None:
    """After an epoch: ``checkpoint.pt`` (everything :func:`resume` needs, every rank's random
    streams and the full optimizer state gathered from all ranks), ``best.pt`` when top-1
    improved, the ``metrics.jsonl`` line and the epoch's log line (files on the main
    process; every rank takes part in the gathering)."""
    args, info, out = state.args, state.info, state.out
    rng = _gather_rng(info)
    optimizer_state = full_optimizer_state(state.optimizer, info)  # every rank takes part
    state.epoch = record["epoch"]
    if not info.is_main:
        return
    scaler = state.precision.scaler
    payload = {
        "model_name": state.model_name,
        "model_kwargs": state.model_kwargs,
        "model": unwrap(state.net).state_dict(),
        "optimizer": optimizer_state,
        "scheduler": state.scheduler.state_dict(),
        "scaler": scaler.state_dict() if scaler else None,
        # timm's load_checkpoint prefers this key (use_ema=True), as timm's train.py
        **({"model_ema": state.ema.module.state_dict()} if state.ema is not None else {}),
        "epoch": state.epoch,
        "best_top1": max(state.best, record.get("top1", 0.0)),
        "args": {k: v for k, v in vars(args).items()},
        "rng": rng,
        "data": {"name": args.data, "mean": state.spec.mean, "std": state.spec.std},
    }
    save_checkpoint(out / "checkpoint.pt", payload)
    if record.get("top1", -1.0) > state.best:
        state.best = record["top1"]
        best_keys = ("model_name", "model_kwargs", "model", "epoch", "data")
        save_checkpoint(out / "best.pt", {k: payload[k] for k in best_keys})
    with open(out / "metrics.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")
    acc = f" top1 {record['top1']:.2f} top5 {record['top5']:.2f}" if "top1" in record else ""
    if "exit_top1" in record:
        acc += " exits " + "/".join(f"{a:.2f}" for a in record["exit_top1"])
    state.log(
        f"epoch {state.epoch}/{args.epochs} loss {record['train_loss']:.4f}{acc} "
        f"({record['seconds']:.1f}s)"
    )
