"""Train an image classifier: ``python -m recurnmt.vision.training.train [options]``.

The default trains a small RingFormer-ViT on scikit-learn's bundled digits on a CPU::

    python -m recurnmt.vision.training.train --output runs/digits

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

    torchrun --nproc_per_node 2 -m recurnmt.vision.training.train --output runs/digits-ddp

``--zero`` shards the optimizer state over the processes (ZeRO stage 1, :mod:`.zero`).

Outputs in ``--output``: ``checkpoint.pt`` (latest, for resuming), ``best.pt`` (best top-1),
``metrics.jsonl`` (one line per epoch) and ``tb/`` (tensorboard).

A run is four phases over one :class:`~.state.RunState`: :func:`~.setup.setup` (model, data,
optimisation, loss; :mod:`.setup`), :func:`~.state.resume`, :func:`fit` (per epoch: train,
evaluate, :func:`~.state.save`; :mod:`.state`). What trains is the model's training view
(:func:`training_view`): a model class that trains on more than its logits says how with a
``training_wrapper(mixed_depth)`` method (a DVT cascade: every exit).
"""

from __future__ import annotations

import sys
import time
import warnings
from argparse import Namespace

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from recurnmt.cli import entry_point
from recurnmt.device import deterministic_algorithms
from recurnmt.flags import compile_settings, is_on
from recurnmt.parameters import count_parameters
from recurnmt.vision.training.arguments import parse_args
from recurnmt.vision.training.distributed import DistInfo, process_group
from recurnmt.vision.training.engine import evaluate, train_one_epoch
from recurnmt.vision.training.exits import evaluate_exits
from recurnmt.vision.training.mixed_depth import MixedDepth
from recurnmt.vision.training.setup import setup
from recurnmt.vision.training.state import RunState, resume, save, trim_metrics


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
    compiled = compile_settings(args.compile, args.compile_mode)
    if compiled is not None:
        # after DDP, as timm's train.py does: dynamo then splits the graph at DDP's gradient
        # buckets, so that their communication overlaps the backward pass; checkpoints store
        # the unwrapped model (distributed.unwrap), not the compiled wrapper
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
        trim_metrics(state.out / "metrics.jsonl", state.epoch)
    train_images, eval_images = state.images
    state.log(
        f"model {state.model_name}: {count_parameters(state.model) / 1e6:.3f}M parameters; "
        f"data {args.data}: {train_images} train / {eval_images} eval images; "
        f"{info.world_size} process(es) on {info.device.type}; {state.steps} steps/epoch"
    )
    state.net = training_net(state)
    return fit(state)


def main(argv: list[str] | None = None) -> None:
    """The training command: parses ``argv``, joins the process group and trains."""
    args = parse_args(argv)
    with process_group(args.device) as info, deterministic_algorithms(args.deterministic):
        run(args, info)


cli = entry_point(main, "python -m recurnmt.vision.training.train")

if __name__ == "__main__":
    sys.exit(cli())
