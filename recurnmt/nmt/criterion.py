"""Label-smoothed cross-entropy with the extra terms of recurrent models.

``--criterion recurrent_label_smoothed_cross_entropy`` is fairseq's label-smoothed
cross-entropy plus, when the model has them:

* the ACT ponder cost (Graves 2016 eq. 11; Universal Transformer sec. 2.2):
  ``act_loss_weight * sum of (N + R)`` over real source and target positions;
* SReT mixed-depth training (SReT appendix B): the shallow branch (every block once,
  sharing the deep branch's weights) is trained under the same loss, ``L_deep + L_shallow``;
* word-level knowledge distillation from a trained teacher (Kim & Rush 2016, sec. 3.1:
  ``(1 - W) x`` the label loss ``+ W x KL(p_teacher || p_student)`` over the target's tokens;
  ``--teacher-checkpoint`` and ``--teacher-distill W``), in training only, so that
  validation losses stay comparable with other runs' (the KL is logged as ``teacher_kl``,
  nats per token);
* SReT's learnable residual coefficients (eq. 9-10) of the first block of each side
  (or all of them with ``--log-lrc all``), logged as ``lrc_...`` scalars, so that fairseq's
  progress output and ``--tensorboard-logdir`` record their evolution (SReT Fig. 7 / 16;
  ``recurnmt-plot-lrc`` draws it).
"""

# no ``from __future__ import annotations``: fairseq reads the dataclass field types

import os
from dataclasses import dataclass, field

import torch
from fairseq import metrics
from fairseq.criterions.label_smoothed_cross_entropy import (
    LabelSmoothedCrossEntropyCriterion,
    LabelSmoothedCrossEntropyCriterionConfig,
)
from fairseq.dataclass import ChoiceEnum
from torch import Tensor

from recurnmt.checkpoint_files import FAIRSEQ, CheckpointError, read_checkpoint_file
from recurnmt.nmt.model import RECURRENT_CRITERION
from recurnmt.nmt.registry import register_criterion_once

LRC_PREFIX = "lrc_"
LRC_COUNT = "lrc_n"  # number of logging outputs that carry LRC values


@dataclass
class RecurrentCriterionConfig(LabelSmoothedCrossEntropyCriterionConfig):
    act_loss_weight: float = field(
        default=0.01, metadata={"help": "weight of the ACT ponder cost (UT: 0.01)"}
    )
    log_lrc: ChoiceEnum(["none", "first-block", "all"]) = field(  # type: ignore[valid-type]
        default="first-block",
        metadata={"help": "log SReT LRC coefficients: none, first-block or all"},
    )
    shallow_distill: float = field(
        default=0.0,
        metadata={
            "help": "with --mixed-depth on: the weight (0..1) of self-distillation in the "
            "shallow pass's loss, the KL divergence from the full depth's distribution "
            "(detached) to the shallow pass's, beside the labels' (1 - weight): what a draft "
            "must match to be accepted (docs/speculative.md)"
        },
    )
    teacher_checkpoint: str = field(
        default="",
        metadata={
            "help": "a trained translation model (a fairseq checkpoint with the task's "
            "dictionaries) whose distribution the model learns beside the labels, with "
            "--teacher-distill (word-level knowledge distillation, Kim & Rush 2016)"
        },
    )
    teacher_distill: float = field(
        default=0.0,
        metadata={
            "help": "with --teacher-checkpoint: the weight (0..1) of KL(teacher || model) "
            "in the training loss, beside the labels' (1 - weight); validation is unchanged"
        },
    )


def lrc_coefficients(model, which: str = "first-block") -> "dict[str, float]":
    """Current LRC scalars, keyed ``lrc_{side}_b{block}_{sublayer}_{branch}``.

    NLLs are keyed ``lrc_{side}_l{level}_nll_{branch}``. ``which`` is ``first-block`` (block 0
    and the NLL of level 0 of each side, as SReT Fig. 7 plots) or ``all``.
    """
    out: dict[str, float] = {}
    if which == "none":
        return out
    for side in ("encoder", "decoder"):
        stack = getattr(getattr(model, side, None), "stack", None)
        if stack is None:
            continue
        blocks = stack.blocks if which == "all" else stack.blocks[:1]
        for b, block in enumerate(blocks):
            names = ["self_attn"] + (["cross_attn"] if block.cross_attn is not None else [])
            names += ["ffn"] if block.ffn is not None else []
            for branch in ("main", "skip"):
                coef = getattr(block.lrc, branch)
                if coef is not None:
                    for name, value in zip(names, coef.tolist(), strict=True):
                        out[f"{LRC_PREFIX}{side[:3]}_b{b}_{name}_{branch}"] = value
        levels = stack.levels if which == "all" else stack.levels[:1]
        for i, parts in enumerate(levels):
            if parts.nll is None:
                continue
            for branch in ("main", "skip"):
                coef = getattr(parts.nll.lrc, branch)
                if coef is not None:
                    out[f"{LRC_PREFIX}{side[:3]}_l{i}_nll_{branch}"] = coef.item()
    return out


def check_settings(
    log_lrc: str, shallow_distill: float, teacher_checkpoint: str, teacher_distill: float
) -> None:
    """Refuses, naming the flag, the criterion's settings that cannot work (fairseq-train
    checks them before it reads data, :mod:`recurnmt.nmt.fairseq_commands`, and again as it
    builds the criterion); a ``--teacher-checkpoint`` must be a fairseq checkpoint.

    Raises:
        ValueError: naming the flag.
    """
    if log_lrc not in ("none", "first-block", "all"):
        raise ValueError(f"--log-lrc={log_lrc!r}: choose none, first-block or all")
    for flag, weight in (("shallow", shallow_distill), ("teacher", teacher_distill)):
        if not 0.0 <= weight <= 1.0:
            raise ValueError(f"--{flag}-distill={weight}: a weight in 0 .. 1")
    if bool(teacher_checkpoint) != bool(teacher_distill):
        raise ValueError(
            "--teacher-checkpoint and --teacher-distill go together: the teacher and the "
            "weight of its distribution in the loss"
        )
    if teacher_checkpoint:
        if not os.path.isfile(teacher_checkpoint):
            raise ValueError(f"--teacher-checkpoint {teacher_checkpoint}: no such file")
        try:
            read_checkpoint_file(teacher_checkpoint, FAIRSEQ, mmap=True)
        except CheckpointError as err:
            raise CheckpointError(f"--teacher-checkpoint: {err}") from None


def load_teacher(path: str, task) -> torch.nn.Module:
    """The teacher of ``--teacher-checkpoint``, loaded by fairseq's own loader (the state
    upgraded as fairseq upgrades it) on the task's dictionaries, in evaluation mode, frozen.

    Raises:
        ValueError: no such file, or weights that do not fit the task's dictionaries.
    """
    from fairseq import checkpoint_utils

    if not os.path.isfile(path):
        raise ValueError(f"--teacher-checkpoint {path}: no such file")
    try:
        (teacher,), _ = checkpoint_utils.load_model_ensemble([path], task=task)
    except RuntimeError as err:  # load_state_dict: sizes that do not match
        first = str(err).strip().splitlines()[-1].strip()
        raise ValueError(
            f"--teacher-checkpoint {path}: its weights do not fit this task's dictionaries "
            f"({first})"
        ) from err
    teacher.eval()
    teacher.requires_grad_(False)
    return teacher


@register_criterion_once(RECURRENT_CRITERION, dataclass=RecurrentCriterionConfig)
class RecurrentLabelSmoothedCrossEntropy(LabelSmoothedCrossEntropyCriterion):
    """Label-smoothed cross-entropy + ACT ponder cost + SReT mixed depth + LRC logging."""

    def __init__(
        self,
        task,
        sentence_avg,
        label_smoothing,
        ignore_prefix_size=0,
        report_accuracy=False,
        act_loss_weight=0.01,
        log_lrc="first-block",
        shallow_distill=0.0,
        teacher_checkpoint="",
        teacher_distill=0.0,
    ):
        super().__init__(task, sentence_avg, label_smoothing, ignore_prefix_size, report_accuracy)
        check_settings(log_lrc, shallow_distill, teacher_checkpoint, teacher_distill)
        self.shallow_distill = shallow_distill
        self.teacher_distill = teacher_distill
        # not a submodule: its parameters stay out of the optimizer, the checkpoints and the
        # criterion's dtype and device moves (it follows the model's at its first batch)
        self._teacher = [load_teacher(teacher_checkpoint, task)] if teacher_checkpoint else []
        self.act_loss_weight = act_loss_weight
        self.log_lrc = log_lrc

    def _kl(self, target_lprobs: Tensor, lprobs: Tensor, sample, reduce: bool) -> Tensor:
        """KL(target || model) summed over the target's tokens (the NLL's reduction)."""
        kl = (target_lprobs.exp() * (target_lprobs - lprobs)).sum(-1)  # B x T
        kl = kl * sample["target"].ne(self.padding_idx)
        return kl.sum() if reduce else kl.flatten()

    def _distillation(self, model, deep_output, shallow_output, sample, reduce: bool) -> Tensor:
        """KL(p_deep || p_shallow), p_deep detached: the shallow pass learns the full depth's
        predictions, which a speculative draft is accepted by, not only the labels'."""
        deep = model.get_normalized_probs(deep_output, log_probs=True).detach()
        shallow = model.get_normalized_probs(shallow_output, log_probs=True)
        return self._kl(deep, shallow, sample, reduce)

    def _teacher_kl(self, model, net_output, sample, reduce: bool) -> Tensor:
        """KL(p_teacher || p_model) on the batch, the teacher in evaluation mode without
        gradients, in the model's dtype and on its device."""
        (teacher,) = self._teacher
        weight = next(model.parameters())
        teacher.to(device=weight.device, dtype=weight.dtype)
        with torch.no_grad():
            teacher_output = teacher(**sample["net_input"])
            target = teacher.get_normalized_probs(teacher_output, log_probs=True).float()
        lprobs = model.get_normalized_probs(net_output, log_probs=True)
        return self._kl(target, lprobs, sample, reduce)

    def _ponder(self, sample, net_output) -> "Tensor | None":
        """Sum of N + R over real source and target positions, or None without ACT."""
        extra = net_output[1]
        terms = []
        if extra.get("encoder_ponder"):
            src = sample["net_input"]["src_tokens"]
            terms.append((extra["encoder_ponder"][0] * src.ne(self.padding_idx)).sum())
        if "ponder" in extra:
            terms.append((extra["ponder"] * sample["target"].ne(self.padding_idx)).sum())
        return torch.stack(terms).sum() if terms else None

    def forward(self, model, sample, reduce=True):
        net_output = model(**sample["net_input"])
        loss, nll_loss = self.compute_loss(model, net_output, sample, reduce=reduce)
        teacher_kl = None
        if self._teacher and model.training:
            teacher_kl = self._teacher_kl(model, net_output, sample, reduce)
            loss = (1 - self.teacher_distill) * loss + self.teacher_distill * teacher_kl
        sample_size = sample["target"].size(0) if self.sentence_avg else sample["ntokens"]
        logging_output = {
            "loss": loss.data,
            "nll_loss": nll_loss.data,
            "ntokens": sample["ntokens"],
            "nsentences": sample["target"].size(0),
            "sample_size": sample_size,
        }
        if teacher_kl is not None:
            logging_output["teacher_kl"] = teacher_kl.data
        ponder = self._ponder(sample, net_output)
        if ponder is not None:
            loss = loss + self.act_loss_weight * ponder
            logging_output["ponder"] = ponder.data
            logging_output["ponder_positions"] = sample["ntokens"] + int(
                sample["net_input"]["src_tokens"].ne(self.padding_idx).sum()
            )
        if model.training and getattr(model, "mixed_depth", False):
            with model.shallow_pass():  # the same weights, fewer levels (--mixed-depth-levels)
                shallow_output = model(**sample["net_input"])
            shallow_loss, _ = self.compute_loss(model, shallow_output, sample, reduce=reduce)
            if self.shallow_distill:
                distill = self._distillation(model, net_output, shallow_output, sample, reduce)
                w = self.shallow_distill
                shallow_loss = (1 - w) * shallow_loss + w * distill
                logging_output["shallow_kl"] = distill.data
            loss = loss + shallow_loss
            logging_output["shallow_loss"] = shallow_loss.data
        if self.report_accuracy:
            n_correct, total = self.compute_accuracy(model, net_output, sample)
            logging_output["n_correct"] = n_correct.item()
            logging_output["total"] = total.item()
        if model.training:
            coefficients = lrc_coefficients(model, self.log_lrc)
            if coefficients:
                logging_output.update(coefficients)
                logging_output[LRC_COUNT] = 1  # summed over workers, then divides the sums
        return loss, sample_size, logging_output

    @classmethod
    def reduce_metrics(cls, logging_outputs) -> None:
        super().reduce_metrics(logging_outputs)
        sample_size = sum(log.get("sample_size", 0) for log in logging_outputs)
        for key in ("shallow_kl", "teacher_kl"):
            if any(key in log for log in logging_outputs):
                kl = sum(log.get(key, 0) for log in logging_outputs)
                metrics.log_scalar(key, kl / sample_size, sample_size, round=4)
        if any("shallow_loss" in log for log in logging_outputs):
            shallow = sum(log.get("shallow_loss", 0) for log in logging_outputs)
            metrics.log_scalar(
                "shallow_loss", shallow / sample_size / 0.6931471805599453, sample_size, round=3
            )
        positions = sum(log.get("ponder_positions", 0) for log in logging_outputs)
        if positions:
            ponder = sum(log.get("ponder", 0) for log in logging_outputs)
            metrics.log_scalar("ponder", ponder / positions, positions, round=3)
        count = sum(log.get(LRC_COUNT, 0) for log in logging_outputs)
        keys = {k for log in logging_outputs for k in log if k.startswith(LRC_PREFIX)}
        for key in sorted(keys - {LRC_COUNT}):
            total = sum(log.get(key, 0) for log in logging_outputs)
            metrics.log_scalar(key, total / max(count, 1), 1, round=4, priority=10000)

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        # every entry is a sum or a count, so fairseq may add them up across workers
        # (non-summable outputs make fairseq gather them through CUDA, which fails on CPU)
        return True
