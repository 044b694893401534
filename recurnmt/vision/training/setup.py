"""Everything a training run builds before its first epoch: :func:`setup`.

In this order, since each may draw random numbers: threads and seeds, the model (or a
``--finetune`` checkpoint's) with its data configuration, activation checkpointing, device and
memory layout, this rank's data loaders, timm's optimizer and schedule
(:func:`build_optimization`), precision, the loss with its distillation teacher, mixup and the
EMA, held by one :class:`~recurnmt.vision.training.state.RunState`. Impossible settings are
refused first, naming the flags.
"""

from __future__ import annotations

import inspect
from argparse import Namespace
from collections.abc import Callable
from dataclasses import replace

import timm
import torch
from timm.data import Mixup
from timm.optim import create_optimizer_v2
from timm.scheduler import create_scheduler_v2
from timm.utils import ModelEmaV3
from torch import nn
from torch.utils.data import DataLoader, Subset

from recurnmt.checkpoint_files import read_checkpoint_file
from recurnmt.flags import checkpoint_segment, compile_settings
from recurnmt.modules import ConfigError
from recurnmt.vision.checkpoint import load_checkpoint, model_from_checkpoint
from recurnmt.vision.data import DataSpec, build_dataset, data_spec
from recurnmt.vision.data.loader import eval_loader, train_loader
from recurnmt.vision.registry import create_model
from recurnmt.vision.training.distributed import DistInfo, check_batch_size
from recurnmt.vision.training.engine import Precision
from recurnmt.vision.training.losses import ClassificationLoss
from recurnmt.vision.training.state import RunState, seed_everything
from recurnmt.vision.training.zero import ZeroRedundancyOptimizer, shard_optimizer, shard_sizes


def _spec_with_overrides(args: Namespace) -> DataSpec:
    """The data set's spec with the augmentation options given on the command line."""
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
    read_checkpoint_file(args.teacher, mmap=True)  # one line on a missing or foreign file
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
    processes (:func:`recurnmt.vision.training.zero.shard_optimizer`); the schedule sets its rate.
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
    compile_settings(args.compile, args.compile_mode)


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
