"""Training the ``classifier`` exit test's units after the fact, on a frozen translation model.

The units are :class:`~recurnmt.modules.decoding.exits.ExitClassifier`'s: one linear unit per
decoder level, sigmoid(w_r . s + b_r) on the level's final-normed state s (what the decoding
exits feed it: ``stack.final_norm(state)``). Unit r is trained to say whether level r's argmax
already is the full depth's: CALM's oracle labels (Schuster et al. 2022, "Confident Adaptive
Language Modeling": the early-exit classifier learns whether an intermediate layer's
prediction is consistent with the full model's, on the frozen model, with a binary
cross-entropy). Teacher-forced over a subset (:mod:`recurnmt.analysis.level_states`, the depth
map's pass), the label of target token t at level r is ``a_r(t) == a_N(t)``; each unit is a
logistic regression (BCE, Adam), levels 1 .. N - 1 independent of each other.

Level N's unit is never asked (a row that reaches level N leaves it in any case); it is saved as
"always exit" (weight 0, bias :data:`ALWAYS`).

The model is frozen and each epoch runs its teacher-forced pass again (no features kept in
memory, whatever the subset's size): an epoch costs one validation pass of the model, the units'
steps next to nothing. Deterministic for a seed: the units start at zero and the batches come in
an order drawn from the seed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from recurnmt.analysis.level_states import level_states
from recurnmt.modules.decoding.exits import ExitClassifier

ALWAYS = 20.0  # level N's bias: sigmoid(20) = 1 - 2e-9, "always exit"
WHAT = "the exit units"  # check_decoder's message


def oracle_labels(model: nn.Module, features: Sequence[Tensor]) -> list[Tensor]:
    """Per level r = 1 .. N - 1, whether level r's argmax equals the full depth's (n bools);
    ``features``: every level's final-normed states (n x C), the last the full depth's."""
    out = model.decoder.output_layer
    full = out(features[-1]).argmax(-1)
    return [out(f).argmax(-1).eq(full) for f in features[:-1]]


def auc(scores: Tensor, labels: Tensor) -> float:
    """The area under the ROC curve of ``scores`` for ``labels`` (Mann-Whitney U, ties half);
    NaN where the labels are all one class."""
    positive, negative = int(labels.sum()), int((~labels).sum())
    if positive == 0 or negative == 0:
        return math.nan
    order = scores.double().argsort()
    s = scores.double()[order]
    ranks = torch.empty_like(s)
    ranks[order] = torch.arange(1, len(s) + 1, dtype=torch.double)
    # ties: the mean rank of each group of equal scores
    _, inverse, counts = torch.unique_consecutive(s, return_inverse=True, return_counts=True)
    ends = counts.cumsum(0).double()
    mean_rank = ends - (counts.double() - 1) / 2
    ranks[order] = mean_rank[inverse]
    u = float(ranks[labels].sum()) - positive * (positive + 1) / 2
    return u / (positive * negative)


@dataclass
class LevelScores:
    """Per level r = 1 .. N - 1, what the trained units say on the subset (entry r - 1).

    Attributes:
        tokens: the target tokens.
        agree: the tokens whose level-r argmax is the full depth's (the positive labels).
        correct: the tokens the unit classifies right at probability 0.5.
        auc: the area under the ROC curve (0.5: chance; NaN: one class only).
    """

    tokens: int
    agree: list[int]
    correct: list[int]
    auc: list[float] = field(default_factory=list)

    @property
    def accuracy(self) -> list[float]:
        return [c / max(self.tokens, 1) for c in self.correct]

    @property
    def agreement(self) -> list[float]:
        """The share of positive labels per level: the accuracy of always saying "exit"."""
        return [a / max(self.tokens, 1) for a in self.agree]

    def as_rows(self) -> list[dict[str, Any]]:
        return [
            {
                "level": r + 1,
                "accuracy": self.accuracy[r],
                "agreement": self.agreement[r],
                "auc": None if math.isnan(self.auc[r]) else self.auc[r],
            }
            for r in range(len(self.agree))
        ]


Batches = Sequence[dict[str, Any]]
Move = Callable[[dict[str, Any]], dict[str, Any]]


def _unit_logits(units: ExitClassifier, features: Sequence[Tensor]) -> list[Tensor]:
    """Level r's logits (n) of its states, r = 1 .. N - 1."""
    return [f.float() @ units.weight[r] + units.bias[r] for r, f in enumerate(features[:-1])]


def train_units(
    model: nn.Module,
    batches: Batches,
    pad: int,
    move: Move = lambda sample: sample,
    epochs: int = 3,
    lr: float = 0.01,
    seed: int = 1,
    log: Callable[[str], None] | None = None,
) -> ExitClassifier:
    """Trains a unit per level of ``model``'s decoder on ``batches`` (teacher-forced).

    Args:
        model: a frozen recurnmt translation model in evaluation mode.
        batches: fairseq translation batches.
        pad: the padding index.
        move: puts a batch on the model's device.
        epochs: passes over ``batches``.
        lr: Adam's learning rate.
        seed: the batches' order.
        log: receives a line per epoch (the loss, the accuracy per level).

    Returns:
        The units (on the CPU), level N's set to always exit.
    """
    stack = model.decoder.stack
    levels = len(stack.active_levels)
    probe = level_states(model, move(batches[0]), pad)
    units = ExitClassifier(levels, probe.features[0].size(-1)).to(probe.features[0].device)
    optimizer = torch.optim.Adam(units.parameters(), lr=lr)
    bce = nn.BCEWithLogitsLoss()
    g = torch.Generator().manual_seed(seed)
    for epoch in range(1, epochs + 1):
        total, count = 0.0, 0
        right = torch.zeros(levels - 1, dtype=torch.long)
        for index in torch.randperm(len(batches), generator=g).tolist():
            features = level_states(model, move(batches[index]), pad).features
            with torch.no_grad():
                labels = oracle_labels(model, features)
            logits = _unit_logits(units, features)
            loss = sum(bce(z, y.float()) for z, y in zip(logits, labels, strict=True))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            n = labels[0].numel()
            total, count = total + float(loss.detach()) * n, count + n
            for r, (z, y) in enumerate(zip(logits, labels, strict=True)):
                right[r] += int((z.detach() >= 0).eq(y).sum())
        if log is not None:
            shares = ", ".join(f"{r + 1}: {int(c) / max(count, 1):.1%}" for r, c in
                               enumerate(right))  # fmt: skip
            log(f"epoch {epoch}/{epochs}: BCE {total / max(count, 1) / (levels - 1):.4f} a "
                f"level, accuracy while training by level {shares}")  # fmt: skip
    with torch.no_grad():
        units.weight[-1].zero_()
        units.bias[-1] = ALWAYS
    return units.cpu()


@torch.no_grad()
def score_units(
    model: nn.Module,
    units: ExitClassifier,
    batches: Batches,
    pad: int,
    move: Move = lambda sample: sample,
) -> LevelScores:
    """What ``units`` say of ``batches``: accuracy, the positive share and AUC per level."""
    scores: list[list[Tensor]] = []
    labels: list[list[Tensor]] = []
    units = units.to(next(model.parameters()).device)
    for sample in batches:
        features = level_states(model, move(sample), pad).features
        ys = oracle_labels(model, features)
        zs = _unit_logits(units, features)
        for store, values in ((scores, zs), (labels, ys)):
            if not store:
                store.extend([] for _ in values)
            for r, v in enumerate(values):
                store[r].append(v.cpu())
    z = [torch.cat(s) for s in scores]
    y = [torch.cat(s) for s in labels]
    return LevelScores(
        tokens=y[0].numel(),
        agree=[int(v.sum()) for v in y],
        correct=[int((a >= 0).eq(b).sum()) for a, b in zip(z, y, strict=True)],
        auc=[auc(a, b) for a, b in zip(z, y, strict=True)],
    )


__all__ = ["ALWAYS", "LevelScores", "auc", "oracle_labels", "score_units", "train_units"]
