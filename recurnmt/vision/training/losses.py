"""Training objectives: (smoothed) cross-entropy, soft targets and soft-label distillation.

* Cross-entropy with label smoothing (Szegedy et al. 2016), eps = 0.1 in DeiT and SReT
  (SReT Table 10).
* Soft-target cross-entropy ``-sum_k y_k log p_k`` for mixup/cutmix targets (timm's
  ``SoftTargetCrossEntropy``; timm's ``Mixup`` makes the targets, label smoothing included).
* Soft distillation (SReT eq. 17): L = -1/N sum_i P_T(z_i) . log P_S(z_i), the cross-entropy
  from the teacher's softmax to the student's, with no one-hot term (SReT appendix E,
  "Distillation Strategy"; following MEAL V2). The teacher's probabilities are a plain softmax
  of its logits; taking their logarithm as well, as DeiT's code does, is the mistake SReT's
  footnote points out. An optional temperature tau divides both logits.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from timm.loss import SoftTargetCrossEntropy
from torch import Tensor, nn

_soft_target_cross_entropy = SoftTargetCrossEntropy()


def soft_target_cross_entropy(logits: Tensor, target: Tensor) -> Tensor:
    """Mean over the batch of ``-sum_k target_k log softmax(logits)_k``; both B x K, in fp32."""
    return _soft_target_cross_entropy(logits.float(), target.float())


def distillation_loss(student: Tensor, teacher: Tensor, temperature: float = 1.0) -> Tensor:
    """SReT eq. 17: cross-entropy from softmax(teacher / tau) to softmax(student / tau)."""
    target = F.softmax(teacher.float() / temperature, dim=-1)
    return soft_target_cross_entropy(student / temperature, target)


class ClassificationLoss(nn.Module):
    """The training loss for one batch.

    With a teacher, the loss is distillation only (SReT eq. 17). Otherwise hard labels use
    label-smoothed cross-entropy and soft (mixed) labels soft-target cross-entropy.

    Args:
        label_smoothing: eps for hard labels (mixed labels are smoothed by the mixer).
        teacher: a frozen model whose logits are the targets; ``None`` for plain training.
        temperature: distillation temperature tau.
    """

    def __init__(
        self,
        label_smoothing: float = 0.0,
        teacher: nn.Module | None = None,
        temperature: float = 1.0,
    ) -> None:
        super().__init__()
        self.label_smoothing = label_smoothing
        self.temperature = temperature
        self.teacher = teacher
        if teacher is not None:
            teacher.eval().requires_grad_(False)

    def forward(
        self,
        logits: Tensor | tuple[Tensor, ...],
        target: Tensor,
        images: Tensor | None = None,
    ) -> Tensor:
        """Loss of ``logits`` (B x K) against labels B or soft targets B x K.

        Args:
            logits: one B x K tensor, or a tuple of them (the deep and shallow branches of
                mixed-depth training, SReT appendix B), whose losses are summed.
            target: labels B or soft targets B x K.
            images: the (augmented, mixed) inputs, which the teacher labels afresh.
        """
        branches = logits if isinstance(logits, tuple) else (logits,)
        if self.teacher is not None:
            if images is None:
                raise ValueError("distillation needs the input images")
            with torch.no_grad():
                self.teacher.eval()
                teacher_logits = self.teacher(images)
            return sum(distillation_loss(z, teacher_logits, self.temperature) for z in branches)
        if target.dim() == 2:
            return sum(soft_target_cross_entropy(z, target) for z in branches)
        return sum(
            F.cross_entropy(z.float(), target, label_smoothing=self.label_smoothing)
            for z in branches
        )
