"""Batch-level mixup and cutmix with label smoothing, producing soft targets.

* Mixup (Zhang et al. 2018): x = lam x_i + (1 - lam) x_j, y = lam y_i + (1 - lam) y_j,
  lam ~ Beta(alpha, alpha).
* CutMix (Yun et al. 2019, eq. 1-2): a box of area fraction (1 - lam) of x_i is replaced by
  the same box of x_j, and lam is corrected to the true kept area.
* Label smoothing (Szegedy et al. 2016): the one-hot target becomes
  (1 - eps) one_hot + eps / K.

Partner j of sample i is the batch flipped (j = B - 1 - i), as in DeiT/timm. DeiT's recipe:
mixup alpha 0.8, cutmix alpha 1.0, one of them per batch with equal chance, eps = 0.1.
All randomness comes from torch's global generator.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor


def smooth_one_hot(target: Tensor, num_classes: int, smoothing: float = 0.0) -> Tensor:
    """B labels -> B x K smoothed one-hot targets ``(1 - eps) one_hot + eps / K``."""
    off = smoothing / num_classes
    return F.one_hot(target, num_classes).float() * (1.0 - smoothing) + off


class Mixup:
    """Mixes a batch and its labels (see the module docstring).

    Args:
        num_classes: K.
        mixup_alpha: Beta parameter of mixup; 0 disables mixup.
        cutmix_alpha: Beta parameter of cutmix; 0 disables cutmix.
        prob: probability of mixing a batch at all.
        switch_prob: with both enabled, probability of cutmix instead of mixup.
        label_smoothing: eps.
    """

    def __init__(
        self,
        num_classes: int,
        mixup_alpha: float = 0.8,
        cutmix_alpha: float = 1.0,
        prob: float = 1.0,
        switch_prob: float = 0.5,
        label_smoothing: float = 0.1,
    ) -> None:
        self.num_classes = num_classes
        self.mixup_alpha, self.cutmix_alpha = mixup_alpha, cutmix_alpha
        self.prob, self.switch_prob = prob, switch_prob
        self.label_smoothing = label_smoothing

    @property
    def active(self) -> bool:
        return self.prob > 0 and (self.mixup_alpha > 0 or self.cutmix_alpha > 0)

    def _beta(self, alpha: float) -> float:
        a = torch.tensor(float(alpha))
        return float(torch.distributions.Beta(a, a).sample())

    def __call__(self, x: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
        """Images B x C x H x W and labels B -> mixed images and soft targets B x K."""
        soft = smooth_one_hot(target, self.num_classes, self.label_smoothing).to(x.device)
        if not self.active or torch.rand(1).item() >= self.prob:
            return x, soft
        use_cutmix = self.cutmix_alpha > 0 and (
            self.mixup_alpha <= 0 or torch.rand(1).item() < self.switch_prob
        )
        partner = x.flip(0)
        if use_cutmix:
            lam = self._beta(self.cutmix_alpha)
            h, w = x.shape[-2:]
            cut_h, cut_w = int(h * math.sqrt(1 - lam)), int(w * math.sqrt(1 - lam))
            cy, cx = int(torch.randint(0, h, (1,))), int(torch.randint(0, w, (1,)))
            top, bottom = max(cy - cut_h // 2, 0), min(cy + cut_h // 2, h)
            left, right = max(cx - cut_w // 2, 0), min(cx + cut_w // 2, w)
            x = x.clone()
            x[..., top:bottom, left:right] = partner[..., top:bottom, left:right]
            lam = 1.0 - (bottom - top) * (right - left) / (h * w)  # the area really kept
        else:
            lam = self._beta(self.mixup_alpha)
            x = x * lam + partner * (1.0 - lam)
        return x, soft * lam + soft.flip(0) * (1.0 - lam)
