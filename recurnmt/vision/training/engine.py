"""One training epoch and one evaluation pass, on any device, in one or many processes.

The pieces around the loop are timm's: the batch mixer (``timm.data.Mixup``), the learning-rate
schedule (a ``timm.scheduler`` scheduler, set for every optimiser update from the update's
number) and the model EMA (``timm.utils.ModelEmaV3``, updated after every update).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
from timm.data import Mixup
from timm.scheduler.scheduler import Scheduler
from timm.utils import ModelEmaV3
from torch import Tensor, nn
from tqdm import tqdm

from recurnmt.vision.training.distributed import DistInfo, all_reduce_sum, unwrap


@dataclass
class Precision:
    """How a batch is computed: autocast dtype (``None`` = full precision), loss scaling, and
    the images' memory layout (``channels_last``: NHWC, which the convolutions of the ResNets,
    SReT's stem and the patch embeddings run faster in on CUDA tensor cores)."""

    dtype: torch.dtype | None = None
    scaler: torch.amp.GradScaler | None = None
    channels_last: bool = False

    @classmethod
    def build(cls, mode: str, device: torch.device, channels_last: bool = False) -> Precision:
        """``auto``: bf16 (or fp16 with loss scaling) on CUDA, full precision on CPU."""
        if mode == "off" or (mode == "auto" and device.type != "cuda"):
            return cls(channels_last=channels_last)
        if mode == "auto":
            mode = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
        if mode == "fp16":
            if device.type != "cuda":
                raise ValueError("--amp fp16 needs CUDA (use bf16 on CPU)")
            return cls(torch.float16, torch.amp.GradScaler("cuda"), channels_last)
        return cls(torch.bfloat16, channels_last=channels_last)

    def autocast(self, device: torch.device) -> contextlib.AbstractContextManager:
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device.type, dtype=self.dtype)

    def images(self, images: Tensor, device: torch.device) -> Tensor:
        """A batch of images (B x 3 x H x W) on ``device``, in this setting's layout."""
        if self.channels_last:
            return images.to(device, non_blocking=True, memory_format=torch.channels_last)
        return images.to(device, non_blocking=True)


@dataclass
class EpochResult:
    """Mean training loss of the epoch (over all ranks) and this rank's per-step losses."""

    loss: float
    losses: list[float] = field(default_factory=list)


def train_one_epoch(
    model: nn.Module,
    loader: Iterable,
    optimizer: torch.optim.Optimizer,
    scheduler: Scheduler | None,
    loss_fn: Callable[[Tensor, Tensor, Tensor], Tensor],
    info: DistInfo,
    precision: Precision,
    *,
    mixup: Mixup | None = None,
    ema: ModelEmaV3 | None = None,
    clip_grad: float | None = None,
    accum_steps: int = 1,
    progress: bool = True,
    on_step: Callable[[int, float, float], None] | None = None,
    epoch: int = 0,
    first_update: int = 0,
) -> EpochResult:
    """Trains ``model`` for one pass over ``loader``.

    Args:
        scheduler: sets the learning rate of update ``n`` (``step_update(n)``) before it;
            ``None`` keeps the optimiser's.
        loss_fn: ``loss_fn(logits, target, images)``; ``logits`` is a tuple when the model
            returns several branches (mixed-depth training, :mod:`.mixed_depth`).
        mixup: timm's batch mixer (mixup / cutmix with label smoothing): soft targets.
        ema: the model EMA, updated after every update with the update's number.
        accum_steps: micro-batches per optimiser update (gradient accumulation; RingFormer
            A.1 trains its 4096-image batches in 16 steps). A trailing partial group is
            dropped so that every update sees the same number of images.
        on_step: called with (update count, loss, learning rate) after every update.
        first_update: the run's count of updates before this epoch.

    Returns:
        The mean loss and the per-update losses (each the mean over its micro-batches).

    Raises:
        FloatingPointError: the loss became NaN or infinite.
    """
    model.train()
    device = info.device
    losses: list[float] = []
    updates = len(loader) // accum_steps
    bar = tqdm(
        total=updates,
        desc=f"epoch {epoch}",
        disable=not (progress and info.is_main),
        leave=False,
        dynamic_ncols=True,
    )
    running = 0.0
    if scheduler is not None:
        scheduler.step_update(first_update)
    for micro, (images, target) in enumerate(loader):
        if micro >= updates * accum_steps:
            break
        images = precision.images(images, device)
        target = target.to(device, non_blocking=True)
        if mixup is not None:
            images, target = mixup(images, target)
        last_micro = (micro + 1) % accum_steps == 0
        # DDP: synchronise gradients only on the micro-batch that completes an update
        sync = (
            model.no_sync()
            if hasattr(model, "no_sync") and not last_micro
            else contextlib.nullcontext()
        )
        with sync:
            with precision.autocast(device):
                loss = loss_fn(model(images), target, images) / accum_steps
            value = loss.item()
            if not math.isfinite(value):
                raise FloatingPointError(f"loss is {value} at epoch {epoch}, step {len(losses)}")
            if precision.scaler is not None:
                precision.scaler.scale(loss).backward()
            else:
                loss.backward()
        running += value
        if not last_micro:
            continue
        if precision.scaler is not None:
            precision.scaler.unscale_(optimizer)
        if clip_grad:
            nn.utils.clip_grad_norm_(model.parameters(), clip_grad)
        if precision.scaler is not None:
            precision.scaler.step(optimizer)
            precision.scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(running)
        done = first_update + len(losses)  # updates so far in the run
        lr = optimizer.param_groups[0]["lr"]  # the rate this update used
        if ema is not None:
            ema.update(unwrap(model), step=done)
        if scheduler is not None:
            scheduler.step_update(done)
        bar.update()
        bar.set_postfix(loss=f"{running:.4f}", lr=f"{lr:.2e}")
        if on_step is not None:
            on_step(done, running, lr)
        running = 0.0
    bar.close()
    total, count = all_reduce_sum([sum(losses), float(len(losses))], info)
    return EpochResult(total / max(count, 1.0), losses)


@dataclass
class EvalResult:
    """Accuracy and loss over the whole evaluation set (all ranks)."""

    top1: float
    top5: float
    loss: float
    images: int


@torch.no_grad()
def evaluate(
    model: nn.Module,
    loader: Iterable,
    info: DistInfo,
    precision: Precision | None = None,
    progress: bool = False,
) -> EvalResult:
    """Top-1 / top-5 accuracy (%) and cross-entropy of ``model`` on ``loader``.

    Each rank evaluates its own shard (no padding), the counts are summed over ranks.
    """
    model.eval()
    precision = precision or Precision()
    correct1 = correct5 = loss_sum = seen = 0.0
    for images, target in tqdm(
        loader, desc="eval", leave=False, disable=not (progress and info.is_main)
    ):
        images, target = precision.images(images, info.device), target.to(info.device)
        with precision.autocast(info.device):
            logits = model(images)
        logits = logits.float()
        loss_sum += nn.functional.cross_entropy(logits, target, reduction="sum").item()
        k = min(5, logits.size(1))
        top = logits.topk(k, dim=1).indices  # B x k
        hits = top.eq(target[:, None])
        correct1 += hits[:, :1].sum().item()
        correct5 += hits.any(dim=1).sum().item()
        seen += target.numel()
    correct1, correct5, loss_sum, seen = all_reduce_sum([correct1, correct5, loss_sum, seen], info)
    n = max(seen, 1.0)
    return EvalResult(100 * correct1 / n, 100 * correct5 / n, loss_sum / n, int(seen))
