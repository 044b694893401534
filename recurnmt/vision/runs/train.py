"""Train an image classifier: ``python -m recurnmt.vision.runs.train [options]``.

The default trains a small RingFormer-ViT on scikit-learn's bundled digits on a CPU::

    python -m recurnmt.vision.runs.train --output runs/digits

Recipes (AdamW, cosine schedule with warmup, label smoothing, DeiT's augmentation) follow
DeiT (Touvron et al. 2021, Table 9) and SReT (appendix E, Table 10); ``configs/vision/`` has
them. The pieces are timm's and torchvision's: timm's transforms (RandAugment, colour jitter,
random resized crop, random erasing), ``Mixup``, repeated-augmentation sampler, optimizer
factory (weight decay off for biases, norms and the model's ``no_weight_decay()``), cosine
scheduler and model EMA; torchvision decodes image folders. Also supported: soft-label
distillation from a teacher (``--teacher``, SReT eq. 17; ``--teacher-model regnety_160`` for a
timm teacher), fine-tuning at a higher resolution (``--finetune CKPT --img-size 384``, DeiT
sec. 6; SReT uses weight decay 0 there), mixed precision (``--amp``), exact resume
(``--resume auto``, with any number of data workers), tensorboard logs and, under
``torchrun``, data-parallel training on many GPUs or nodes (gloo on CPUs)::

    torchrun --nproc_per_node 2 -m recurnmt.vision.runs.train --output runs/digits-ddp

``--zero`` shards the optimizer state over the processes (ZeRO stage 1, :mod:`.zero`).

Outputs in ``--output``: ``checkpoint.pt`` (latest, for resuming), ``best.pt`` (best top-1),
``metrics.jsonl`` (one line per epoch) and ``tb/`` (tensorboard).

A run is four phases over one :class:`RunState`: :func:`setup` (model, data, optimisation,
loss), :func:`resume`, :func:`fit` (per epoch: train, evaluate, :func:`save`). What trains is
the model's training view (:func:`training_view`): a model class that trains on more than its
logits says how with a ``training_wrapper(mixed_depth)`` method (a DVT cascade: every exit).
"""

from __future__ import annotations

import inspect
import json
import random
import sys
import time
import warnings
from argparse import Namespace
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import timm
import torch
import torch.distributed as dist
from timm.data import Mixup
from timm.optim import create_optimizer_v2
from timm.scheduler import create_scheduler_v2
from timm.scheduler.scheduler import Scheduler
from timm.utils import ModelEmaV3
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Subset

from recurnmt.cli import entry_point
from recurnmt.device import deterministic_algorithms
from recurnmt.flags import checkpoint_segment, is_on
from recurnmt.modules import ConfigError
from recurnmt.modules.compile import from_flags
from recurnmt.parameters import count_parameters
from recurnmt.vision.checkpoint import (
    load_checkpoint,
    model_from_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
    unwrap,
)
from recurnmt.vision.data import DataSpec, build_dataset, data_spec
from recurnmt.vision.data.loader import eval_loader, train_loader
from recurnmt.vision.registry import create_model
from recurnmt.vision.runs.arguments import parse_args
from recurnmt.vision.runs.distributed import DistInfo, check_batch_size, process_group
from recurnmt.vision.runs.engine import Precision, evaluate, train_one_epoch
from recurnmt.vision.runs.exits import evaluate_exits
from recurnmt.vision.runs.losses import ClassificationLoss
from recurnmt.vision.runs.mixed_depth import MixedDepth
from recurnmt.vision.runs.zero import (
    ZeroRedundancyOptimizer,
    full_optimizer_state,
    load_optimizer_state,
    shard_optimizer,
    shard_sizes,
)


def seed_everything(seed: int) -> None:
    """Seeds torch, Python and numpy."""
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)


def _spec_with_overrides(args: Namespace) -> DataSpec:
    spec = data_spec(args.data, args.data_root)
    changes = {}
    if args.hflip is not None:
        changes["hflip"] = args.hflip
    if args.scale_min is not None:
        changes["scale"] = (args.scale_min, 1.0)
    if args.reprob is not None:
        changes["erase"] = args.reprob
    if args.remode is not None:
        changes["erase_mode"] = args.remode
    if args.aa is not None:
        changes["auto_augment"] = args.aa
    if args.color_jitter is not None:
        changes["color_jitter"] = args.color_jitter
    if args.train_interpolation is not None:
        changes["interpolation"] = args.train_interpolation
    return replace(spec, **changes)


def _data_cfg(model: nn.Module, spec: DataSpec, img_size: tuple[int, int]) -> None:
    """Makes the model's timm data configuration say how it is fed (this data set's
    normalisation, crop and size), so a checkpoint's model carries its own data config."""
    cfg = dict(getattr(model, "pretrained_cfg", {}))
    cfg.update(
        input_size=(spec.in_chans, *img_size),
        mean=spec.mean,
        std=spec.std,
        crop_pct=spec.crop_pct,
        interpolation=spec.interpolation,
        num_classes=spec.num_classes,
    )
    model.pretrained_cfg = model.default_cfg = cfg


def _build_teacher(args: Namespace, spec: DataSpec, log) -> nn.Module:
    """The distillation teacher: a checkpoint of this command, or timm's ``--teacher-model``
    (DeiT's RegNetY-16GF is timm's ``regnety_160``) with the ``--teacher`` weights."""
    if not args.teacher_model:
        return model_from_checkpoint(load_checkpoint(args.teacher))
    if not timm.is_model(args.teacher_model):
        raise ConfigError("--teacher-model", args.teacher_model, "is not a timm model")
    log(f"teacher: timm {args.teacher_model} with the weights of {args.teacher}")
    return timm.create_model(
        args.teacher_model,
        num_classes=spec.num_classes,
        in_chans=spec.in_chans,
        checkpoint_path=args.teacher,
    )


def build_optimization(
    model: nn.Module, args: Namespace, steps: int, *, shard: bool = False
) -> tuple:
    """timm's optimizer and scheduler for ``args`` at ``steps`` updates per epoch.

    The optimizer (``timm.optim.create_optimizer_v2``; AdamW for DeiT and SReT) decays weight
    matrices only: biases, norm scales, 1-D parameters and ``model.no_weight_decay()`` (position
    tables, class tokens) are exempt, as in DeiT, unless ``--weight-decay-all`` (ResNet's SGD
    recipe decays everything). The schedule (``timm.scheduler``) warms up linearly from
    ``--warmup-lr`` over ``--warmup-epochs``, then follows a cosine to ``--min-lr`` at the last
    update (Loshchilov & Hutter 2017; ``--sched cosine``) or is multiplied by ``--decay-rate``
    every ``--decay-epochs`` (``--sched step``: ResNet's 0.1 every 30 epochs), set at every
    update.

    ``shard`` (``--zero``, in a process group): the optimizer's state is sharded over the
    processes (:func:`recurnmt.vision.runs.zero.shard_optimizer`); the schedule sets its rate.
    """
    optimizer = create_optimizer_v2(
        # the bare parameters: timm would still exempt model.no_weight_decay()
        model.parameters() if args.weight_decay_all else model,
        opt=args.opt,
        lr=args.lr,
        weight_decay=args.weight_decay,
        momentum=args.momentum,
        **({"eps": args.opt_eps} if args.opt_eps is not None else {}),
        **({"betas": tuple(args.opt_betas)} if args.opt_betas else {}),
    )
    if shard:
        optimizer = shard_optimizer(optimizer, args.opt)
    scheduler, _ = create_scheduler_v2(
        optimizer,
        sched=args.sched,
        num_epochs=args.epochs,
        decay_epochs=args.decay_epochs,
        decay_rate=args.decay_rate,
        warmup_epochs=args.warmup_epochs,
        warmup_lr=args.warmup_lr,
        min_lr=args.min_lr,
        step_on_epochs=False,
        updates_per_epoch=steps,
    )
    return optimizer, scheduler


def _check_settings(args: Namespace, per_rank: int) -> None:
    """Refuses impossible combinations before any work, naming the flags."""
    if args.teacher_model and not args.teacher:
        raise ConfigError("--teacher-model", args.teacher_model, "needs the --teacher weights")
    if (args.mixup > 0 or args.cutmix > 0) and per_rank % 2:
        raise ConfigError(
            "--batch-size",
            args.batch_size,
            "mixup/cutmix pair each image with another of its micro-batch, which must be "
            "even: {micro-batch}",
            related={"micro-batch": per_rank},
        )
    if args.aug_repeats < 0:
        raise ConfigError("--aug-repeats", args.aug_repeats, "must be 0 or more")
    if not 0.0 <= args.model_ema_decay < 1.0:
        raise ConfigError("--model-ema-decay", args.model_ema_decay, "must be in [0, 1)")
    from_flags(args.compile, args.compile_mode)


def _build_model(args: Namespace, spec: DataSpec, img_size: tuple[int, int], log) -> tuple:
    """The model, its registered name and the keyword arguments that rebuild it."""
    if not args.finetune:
        kwargs = {
            **args.model_args,
            "img_size": img_size,
            "num_classes": spec.num_classes,
            "in_chans": spec.in_chans,
        }
        return create_model(args.model, **kwargs), args.model, kwargs
    if args.model_args:
        raise ValueError("--model-arg cannot change the architecture of a --finetune checkpoint")
    ckpt = load_checkpoint(args.finetune)
    model = model_from_checkpoint(ckpt)
    kwargs = dict(ckpt["model_kwargs"])
    if tuple(kwargs.get("img_size", img_size)) != tuple(img_size):
        model.set_img_size(img_size)  # interpolates learned position tables
    if kwargs.get("num_classes") != spec.num_classes:
        model.reset_classifier(spec.num_classes)
    kwargs.update(img_size=img_size, num_classes=spec.num_classes)
    log(f"fine-tuning {ckpt['model_name']} from {args.finetune} at {img_size[0]}x{img_size[1]}")
    return model, ckpt["model_name"], kwargs


def _gather_rng(info: DistInfo) -> list:
    states = [None] * info.world_size
    if info.distributed:
        dist.all_gather_object(states, rng_state())
    else:
        states[0] = rng_state()
    return states


def _trim_metrics(path: Path, epochs: int) -> None:
    """Keeps the metrics lines of the first ``epochs`` epochs (none for a fresh run)."""
    if not path.exists():
        return
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    kept = [line for line in lines if json.loads(line)["epoch"] <= epochs]
    path.write_text("".join(line + "\n" for line in kept))


@dataclass
class RunState:
    """What a training run holds from one phase to the next: :func:`setup` builds it,
    :func:`resume` restores a checkpoint into it, :func:`fit` trains it epoch by epoch and
    :func:`save` writes it after each epoch.

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
            (:func:`training_net`).
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
        return Path(self.args.output)


def _printer(info: DistInfo) -> Callable[[str], None]:
    """A run's ``log``: prints on the main process."""

    def log(msg: str) -> None:
        if info.is_main:
            print(msg, flush=True)

    return log


def set_grad_checkpointing(model: nn.Module, segment: int | str) -> None:
    """timm's ``set_grad_checkpointing``, with segments of ``segment`` levels (0: per level)
    where the model's stacks take them (``--checkpoint-segment``).

    Raises:
        ConfigError: segments for a model that checkpoints per block only (MRLA's ResNets).
    """
    if not segment:
        model.set_grad_checkpointing(True)
        return
    if "segment" not in inspect.signature(model.set_grad_checkpointing).parameters:
        raise ConfigError(
            "--checkpoint-segment", segment,
            f"{type(model).__name__} checkpoints per block only (no stack of levels)",
        )  # fmt: skip
    model.set_grad_checkpointing(True, segment=segment)


def _place_model(
    model: nn.Module, args: Namespace, spec: DataSpec, img_size: tuple[int, int], info: DistInfo
) -> None:
    """The model's data configuration, checkpointing, device and memory layout."""
    _data_cfg(model, spec, img_size)
    segment = checkpoint_segment(args.checkpoint_segment)
    if segment and not args.grad_checkpointing:
        raise ConfigError(
            "--checkpoint-segment", segment, "needs --checkpoint-activations (--grad-checkpointing)"
        )
    if args.grad_checkpointing:
        set_grad_checkpointing(model, segment)
    model.to(info.device)
    if args.channels_last:  # NHWC weights for the convolutions, to match the images
        model.to(memory_format=torch.channels_last)


def _build_loaders(
    args: Namespace,
    info: DistInfo,
    spec: DataSpec,
    img_size: tuple[int, int],
    log: Callable[[str], None],
) -> tuple[DataLoader, DataLoader, tuple[int, int], int]:
    """This rank's training and evaluation loaders, the images of each and the updates per
    epoch; the settings are checked against this rank's micro-batch first."""
    train_set, _ = build_dataset(
        args.data, "train", root=args.data_root, img_size=img_size, augment=True, spec=spec
    )
    eval_set, _ = build_dataset(
        args.data, "eval", root=args.data_root, img_size=img_size, augment=False, spec=spec
    )
    if args.limit_train is not None:
        train_set = Subset(train_set, range(min(args.limit_train, len(train_set))))
    if args.limit_eval is not None:
        eval_set = Subset(eval_set, range(min(args.limit_eval, len(eval_set))))
    per_rank = check_batch_size(args.batch_size, info, args.accum_steps)
    _check_settings(args, per_rank)
    if args.aug_repeats and not info.distributed:
        log("--aug-repeats: repeated augmentation needs several processes; not used in one")
    if args.zero and not info.distributed:
        log("--zero: sharding the optimizer state needs several processes; not used in one")
    place = dict(
        rank=info.rank, world_size=info.world_size, workers=args.workers, device=info.device
    )
    loader = train_loader(
        train_set, per_rank, seed=args.seed, aug_repeats=args.aug_repeats, **place
    )
    evaluation = eval_loader(eval_set, per_rank, **place)
    steps = len(loader) // args.accum_steps  # optimiser updates per epoch
    if steps == 0:
        raise ValueError(f"--batch-size {args.batch_size} exceeds the {len(train_set)} images")
    return loader, evaluation, (len(train_set), len(eval_set)), steps


def _build_mixup(args: Namespace, spec: DataSpec) -> Mixup | None:
    """timm's mixup/cutmix (DeiT), or ``None`` when both are off."""
    if args.mixup <= 0 and args.cutmix <= 0:
        return None
    return Mixup(
        mixup_alpha=args.mixup,
        cutmix_alpha=args.cutmix,
        prob=args.mixup_prob,
        switch_prob=args.mixup_switch_prob,
        label_smoothing=args.smoothing,
        num_classes=spec.num_classes,
    )


def setup(args: Namespace, info: DistInfo) -> RunState:
    """Everything before the first epoch: threads and seeds, the model (or the fine-tuned
    checkpoint's), the data, timm's optimizer and schedule, precision, the loss (with its
    teacher), mixup and the EMA, in this order (each may draw random numbers)."""
    log = _printer(info)
    if args.threads or info.device.type == "cpu":
        torch.set_num_threads(args.threads or 1)
    seed_everything(args.seed + info.rank)
    spec = _spec_with_overrides(args)
    img_size = tuple(args.img_size or spec.img_size)
    model, model_name, model_kwargs = _build_model(args, spec, img_size, log)
    _place_model(model, args, spec, img_size, info)
    loader, evaluation, images, steps = _build_loaders(args, info, spec, img_size, log)
    optimizer, scheduler = build_optimization(
        model, args, steps, shard=args.zero and info.distributed
    )
    if isinstance(optimizer, ZeroRedundancyOptimizer):
        local, total = shard_sizes(optimizer)
        log(
            f"--zero: rank 0 keeps the optimizer state of {local / 1e6:.3f}M of the "
            f"{total / 1e6:.3f}M parameters ({info.world_size} shards)"
        )
    precision = Precision.build(args.amp, info.device, args.channels_last)
    teacher = None
    if args.teacher:
        teacher = _build_teacher(args, spec, log).to(info.device)
        log(f"distilling from {args.teacher} (soft labels only, SReT eq. 17)")
    loss_fn = ClassificationLoss(args.smoothing, teacher, args.distill_temperature)
    mixup = _build_mixup(args, spec)
    # the average lives beside the model, on its device, in fp32 (weights stay fp32 under AMP)
    ema = ModelEmaV3(model, decay=args.model_ema_decay) if args.model_ema_decay else None
    return RunState(
        args=args,
        info=info,
        log=log,
        spec=spec,
        model=model,
        model_name=model_name,
        model_kwargs=model_kwargs,
        loader=loader,
        evaluation=evaluation,
        images=images,
        steps=steps,
        optimizer=optimizer,
        scheduler=scheduler,
        precision=precision,
        loss_fn=loss_fn,
        mixup=mixup,
        ema=ema,
    )


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


def training_view(model: nn.Module, mixed_depth: bool) -> nn.Module:
    """What the loss sees: the model's own training wrapper when its class declares one
    (``training_wrapper(mixed_depth=...)``: a DVT cascade trains every exit, DVT eq. 1), else
    the model, or with ``--mixed-depth`` both of its branches (SReT appendix B)."""
    declared = getattr(model, "training_wrapper", None)
    if declared is not None:
        return declared(mixed_depth=mixed_depth)
    return MixedDepth(model) if mixed_depth else model


def training_net(state: RunState) -> nn.Module:
    """The model's :func:`training_view`, under DDP in a process group and then
    ``torch.compile`` with ``--compile``."""
    args, info = state.args, state.info
    net = training_view(state.model, is_on(args.mixed_depth))
    if info.distributed:
        # Grouped convolutions (SReT's conv pooling) have C x 1 x 3 x 3 kernels whose gradients
        # come with other, equivalent strides along the size-1 axis; DDP warns, harmlessly.
        warnings.filterwarnings("ignore", message="Grad strides do not match bucket view")
        ids = [info.device.index] if info.device.type == "cuda" else None
        net = DistributedDataParallel(net, device_ids=ids)
    compiled = from_flags(args.compile, args.compile_mode)
    if compiled is not None:
        # after DDP, as timm's train.py does: dynamo then splits the graph at DDP's gradient
        # buckets, so that their communication overlaps the backward pass; checkpoints store
        # the unwrapped model (checkpoint.unwrap), not the compiled wrapper
        net = torch.compile(net, backend=compiled.backend, mode=compiled.mode)
    return net


def _train_epoch(state: RunState, epoch: int) -> dict:
    """One epoch of updates; the first fields of its metrics line."""
    args, writer = state.args, state.writer

    def on_step(step: int, loss: float, lr: float) -> None:
        if writer is not None:
            writer.add_scalar("train/loss", loss, step)
            writer.add_scalar("train/lr", lr, step)

    state.loader.sampler.set_epoch(epoch)
    started = time.perf_counter()
    result = train_one_epoch(
        state.net,
        state.loader,
        state.optimizer,
        state.scheduler,
        state.loss_fn,
        state.info,
        state.precision,
        mixup=state.mixup,
        ema=state.ema,
        first_update=epoch * state.steps,
        clip_grad=args.clip_grad,
        accum_steps=args.accum_steps,
        progress=not args.no_progress,
        on_step=on_step,
        epoch=epoch,
    )
    return {
        "epoch": epoch + 1,
        "train_loss": result.loss,
        "losses": result.losses,
        "lr": state.optimizer.param_groups[0]["lr"],
        "seconds": time.perf_counter() - started,
    }


def _evaluate(state: RunState, epoch: int) -> dict:
    """Top-1, top-5 and loss on the evaluation set; the EMA's top-1 and, for a model with
    several exits (``forward_exits``: DVT), each exit's."""
    info, precision = state.info, state.precision
    ev = evaluate(state.net, state.evaluation, info, precision)
    found = {"top1": ev.top1, "top5": ev.top5, "eval_loss": ev.loss}
    if state.ema is not None:
        found["ema_top1"] = evaluate(state.ema.module, state.evaluation, info, precision).top1
    if callable(getattr(state.model, "forward_exits", None)):
        found["exit_top1"] = evaluate_exits(state.model, state.evaluation, info, precision)
    if state.writer is not None:
        state.writer.add_scalar("eval/top1", ev.top1, epoch + 1)
        state.writer.add_scalar("eval/top5", ev.top5, epoch + 1)
        state.writer.add_scalar("eval/loss", ev.loss, epoch + 1)
    return found


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


def fit(state: RunState) -> dict:
    """Trains from ``state.epoch`` to ``--epochs`` (or ``--stop-after-epoch``), evaluating
    every ``--eval-every`` epochs and after the last, saving after each; the last metrics."""
    args = state.args
    if state.info.is_main and not args.no_tensorboard:
        from torch.utils.tensorboard import SummaryWriter

        purge = state.epoch * state.steps or None
        state.writer = SummaryWriter(str(state.out / "tb"), purge_step=purge)
    record: dict = {}
    for epoch in range(state.epoch, args.epochs):
        record = _train_epoch(state, epoch)
        last = epoch + 1 == args.epochs or epoch + 1 == args.stop_after_epoch
        if (epoch + 1) % args.eval_every == 0 or last:
            record.update(_evaluate(state, epoch))
        save(state, record)
        if args.stop_after_epoch is not None and epoch + 1 >= args.stop_after_epoch:
            break
    if state.writer is not None:
        state.writer.close()
    return record


def run(args: Namespace, info: DistInfo) -> dict:
    """Trains as ``args`` says: :func:`setup`, :func:`resume`, :func:`fit`; returns the last
    metrics line."""
    state = setup(args, info)
    resume(state)
    if info.is_main:
        _trim_metrics(state.out / "metrics.jsonl", state.epoch)
    train_images, eval_images = state.images
    state.log(
        f"model {state.model_name}: {count_parameters(state.model) / 1e6:.3f}M parameters; "
        f"data {args.data}: {train_images} train / {eval_images} eval images; "
        f"{info.world_size} process(es) on {info.device.type}; {state.steps} steps/epoch"
    )
    state.net = training_net(state)
    return fit(state)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    with process_group(args.device) as info, deterministic_algorithms(args.deterministic):
        run(args, info)


cli = entry_point(main, "python -m recurnmt.vision.runs.train")

if __name__ == "__main__":
    sys.exit(cli())
