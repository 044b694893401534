"""Every exit's logits and top-1 of a DVT cascade (Wang et al. 2021, sec. 3.3).

The training command reports each exit's accuracy after an epoch (:func:`evaluate_exits`), and
the budget command (:mod:`recurnmt.vision.training.budget`) solves its exit thresholds on the logits of
:func:`collect_exit_logits`; both read them from here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import Tensor

from recurnmt.vision.models.dvt import DVTCascade
from recurnmt.vision.training.distributed import DistInfo, all_reduce_sum
from recurnmt.vision.training.engine import Precision


@dataclass
class ExitLogits:
    """Every exit's logits on a data set: ``logits`` K x N x C and ``targets`` N."""

    logits: Tensor
    targets: Tensor

    @property
    def confidence(self) -> Tensor:
        """K x N largest softmax probability (DVT sec. 3.3)."""
        return self.logits.float().softmax(-1).amax(-1)

    @property
    def correct(self) -> Tensor:
        """K x N: the exit's prediction is right."""
        return self.logits.argmax(-1).eq(self.targets)

    def accuracy(self) -> list[float]:
        """Top-1 (%) of each exit when every image runs the whole cascade."""
        return (100 * self.correct.float().mean(1)).tolist()

    def subset(self, index: Tensor) -> ExitLogits:
        return ExitLogits(self.logits[:, index], self.targets[index])


@torch.no_grad()
def collect_exit_logits(
    model: DVTCascade,
    loader: Iterable,
    device: torch.device,
    precision: Precision | None = None,
) -> ExitLogits:
    """Runs the full cascade on ``loader``; all exits' logits (float, on the CPU)."""
    model.eval()
    precision = precision or Precision()
    logits, targets = [], []
    for images, target in loader:
        with precision.autocast(device):
            outs = model.forward_exits(images.to(device))
        logits.append(torch.stack(outs).float().cpu())  # K x B x C
        targets.append(target)
    return ExitLogits(torch.cat(logits, dim=1), torch.cat(targets))


def evaluate_exits(
    model: DVTCascade,
    loader: Iterable,
    info: DistInfo,
    precision: Precision | None = None,
) -> list[float]:
    """Top-1 (%) of every exit over all ranks' shards (the training command's per-exit line)."""
    exits = collect_exit_logits(model, loader, info.device, precision)
    counts = exits.correct.sum(1).double().tolist() + [float(exits.targets.numel())]
    counts = all_reduce_sum(counts, info)
    return [100 * c / max(counts[-1], 1.0) for c in counts[:-1]]
