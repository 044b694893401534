"""Train an image classifier: ``python -m recurnmt.vision.train [options]``.

The default trains a small RingFormer-ViT on scikit-learn's bundled digits on a CPU::

    python -m recurnmt.vision.train --output runs/digits

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

    torchrun --nproc_per_node 2 -m recurnmt.vision.train --output runs/digits-ddp

``--zero`` shards the optimizer state over the processes (ZeRO stage 1, :mod:`.zero`).

Outputs in ``--output``: ``checkpoint.pt`` (latest, for resuming), ``best.pt`` (best top-1),
``metrics.jsonl`` (one line per epoch) and ``tb/`` (tensorboard).
"""

from __future__ import annotations

import json
import random
import sys
import time
import warnings
from argparse import Namespace
from dataclasses import replace
from pathlib import Path

import numpy as np
import timm
import torch
import torch.distributed as dist
from timm.data import Mixup
from timm.optim import create_optimizer_v2
from timm.scheduler import create_scheduler_v2
from timm.utils import ModelEmaV3
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import Subset

from recurnmt.cli import entry_point
from recurnmt.device import deterministic_algorithms
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
from recurnmt.vision.distributed import DistInfo, check_batch_size, process_group
from recurnmt.vision.engine import Precision, evaluate, train_one_epoch
from recurnmt.vision.exits import evaluate_exits
from recurnmt.vision.losses import ClassificationLoss
from recurnmt.vision.mixed_depth import MixedDepth
from recurnmt.vision.models.dvt import AllExits, DVTCascade
from recurnmt.vision.options import parse_args
from recurnmt.vision.registry import create_model
from recurnmt.vision.zero import (
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
    processes (:func:`recurnmt.vision.zero.shard_optimizer`); the schedule sets its rate.
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


def run(args: Namespace, info: DistInfo) -> dict:
    """Trains as ``args`` says; returns the last metrics line."""

    def log(msg: str) -> None:
        if info.is_main:
            print(msg, flush=True)

    if args.threads or info.device.type == "cpu":
        torch.set_num_threads(args.threads or 1)
    seed_everything(args.seed + info.rank)
    out = Path(args.output)
    spec = _spec_with_overrides(args)
    img_size = tuple(args.img_size or spec.img_size)
    model, model_name, model_kwargs = _build_model(args, spec, img_size, log)
    _data_cfg(model, spec, img_size)
    if args.grad_checkpointing:
        model.set_grad_checkpointing(True)
    model.to(info.device)
    if args.channels_last:  # NHWC weights for the convolutions, to match the images
        model.to(memory_format=torch.channels_last)

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
    mixup = None
    if args.mixup > 0 or args.cutmix > 0:
        mixup = Mixup(
            mixup_alpha=args.mixup,
            cutmix_alpha=args.cutmix,
            prob=args.mixup_prob,
            switch_prob=args.mixup_switch_prob,
            label_smoothing=args.smoothing,
            num_classes=spec.num_classes,
        )
    # the average lives beside the model, on its device, in fp32 (weights stay fp32 under AMP)
    ema = ModelEmaV3(model, decay=args.model_ema_decay) if args.model_ema_decay else None

    start_epoch, best = 0, 0.0
    resume = args.resume
    if resume == "auto":
        resume = str(out / "checkpoint.pt") if (out / "checkpoint.pt").exists() else None
    if resume:
        ckpt = load_checkpoint(resume)
        model.load_state_dict(ckpt["model"])
        load_optimizer_state(optimizer, ckpt["optimizer"], resume)
        scheduler.load_state_dict(ckpt["scheduler"])
        if ema is not None and "model_ema" in ckpt:
            ema.module.load_state_dict(ckpt["model_ema"])
        elif ema is not None:  # EMA switched on at this resume: it starts from the weights
            ema = ModelEmaV3(model, decay=args.model_ema_decay)
        if precision.scaler is not None and ckpt.get("scaler"):
            precision.scaler.load_state_dict(ckpt["scaler"])
        start_epoch, best = ckpt["epoch"], ckpt.get("best_top1", 0.0)
        if len(ckpt["rng"]) == info.world_size:
            set_rng_state(ckpt["rng"][info.rank])
        else:
            log(
                f"warning: checkpoint has {len(ckpt['rng'])} ranks, this run {info.world_size}; "
                "continuing with fresh random streams (not bit-identical)"
            )
            seed_everything(args.seed + 1000 * start_epoch + info.rank)
        log(f"resumed {resume} at epoch {start_epoch}")

    if info.is_main:
        _trim_metrics(out / "metrics.jsonl", start_epoch)
    log(
        f"model {model_name}: {count_parameters(model) / 1e6:.3f}M parameters; "
        f"data {args.data}: {len(train_set)} train / {len(eval_set)} eval images; "
        f"{info.world_size} process(es) on {info.device.type}; {steps} steps/epoch"
    )
    net = MixedDepth(model) if args.mixed_depth else model
    if isinstance(model, DVTCascade):  # DVT eq. 1: the loss is summed over every exit
        if args.mixed_depth:
            raise ValueError(
                "--mixed-depth (SReT's shallow branch) does not apply to DVT cascades, "
                "which train every exit instead"
            )
        net = AllExits(model)
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

    writer = None
    if info.is_main and not args.no_tensorboard:
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(str(out / "tb"), purge_step=start_epoch * steps or None)

    def on_step(step: int, loss: float, lr: float) -> None:
        if writer is not None:
            writer.add_scalar("train/loss", loss, step)
            writer.add_scalar("train/lr", lr, step)

    record: dict = {}
    for epoch in range(start_epoch, args.epochs):
        loader.sampler.set_epoch(epoch)
        started = time.perf_counter()
        result = train_one_epoch(
            net,
            loader,
            optimizer,
            scheduler,
            loss_fn,
            info,
            precision,
            mixup=mixup,
            ema=ema,
            first_update=epoch * steps,
            clip_grad=args.clip_grad,
            accum_steps=args.accum_steps,
            progress=not args.no_progress,
            on_step=on_step,
            epoch=epoch,
        )
        record = {
            "epoch": epoch + 1,
            "train_loss": result.loss,
            "losses": result.losses,
            "lr": optimizer.param_groups[0]["lr"],
            "seconds": time.perf_counter() - started,
        }
        last = epoch + 1 == args.epochs or epoch + 1 == args.stop_after_epoch
        if (epoch + 1) % args.eval_every == 0 or last:
            ev = evaluate(net, evaluation, info, precision)
            record.update(top1=ev.top1, top5=ev.top5, eval_loss=ev.loss)
            if ema is not None:
                record["ema_top1"] = evaluate(ema.module, evaluation, info, precision).top1
            if isinstance(model, DVTCascade):
                record["exit_top1"] = evaluate_exits(model, evaluation, info, precision)
            if writer is not None:
                writer.add_scalar("eval/top1", ev.top1, epoch + 1)
                writer.add_scalar("eval/top5", ev.top5, epoch + 1)
                writer.add_scalar("eval/loss", ev.loss, epoch + 1)
        rng = _gather_rng(info)
        optimizer_state = full_optimizer_state(optimizer, info)  # every rank takes part
        if info.is_main:
            payload = {
                "model_name": model_name,
                "model_kwargs": model_kwargs,
                "model": unwrap(net).state_dict(),
                "optimizer": optimizer_state,
                "scheduler": scheduler.state_dict(),
                "scaler": precision.scaler.state_dict() if precision.scaler else None,
                # timm's load_checkpoint prefers this key (use_ema=True), as timm's train.py
                **({"model_ema": ema.module.state_dict()} if ema is not None else {}),
                "epoch": epoch + 1,
                "best_top1": max(best, record.get("top1", 0.0)),
                "args": {k: v for k, v in vars(args).items()},
                "rng": rng,
                "data": {"name": args.data, "mean": spec.mean, "std": spec.std},
            }
            save_checkpoint(out / "checkpoint.pt", payload)
            if record.get("top1", -1.0) > best:
                best = record["top1"]
                save_checkpoint(
                    out / "best.pt",
                    {
                        k: payload[k]
                        for k in ("model_name", "model_kwargs", "model", "epoch", "data")
                    },
                )
            with open(out / "metrics.jsonl", "a") as f:
                f.write(json.dumps(record) + "\n")
            acc = (
                f" top1 {record['top1']:.2f} top5 {record['top5']:.2f}" if "top1" in record else ""
            )
            if "exit_top1" in record:
                acc += " exits " + "/".join(f"{a:.2f}" for a in record["exit_top1"])
            log(
                f"epoch {epoch + 1}/{args.epochs} loss {result.loss:.4f}{acc} "
                f"({record['seconds']:.1f}s)"
            )
        if args.stop_after_epoch is not None and epoch + 1 >= args.stop_after_epoch:
            break
    if writer is not None:
        writer.close()
    return record


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    with process_group(args.device) as info, deterministic_algorithms(args.deterministic):
        run(args, info)


cli = entry_point(main, "python -m recurnmt.vision.train")

if __name__ == "__main__":
    sys.exit(cli())
