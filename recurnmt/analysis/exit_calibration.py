"""Calibrating an exit threshold on the validation set: the most levels saved at a stated
agreement with full-depth decoding.

fairseq's ``SequenceGenerator`` (beam search, or greedy at a beam of 1) decodes the subset at
the decoder's full depth, then once per candidate threshold with the decoder's exits on
(:mod:`recurnmt.modules.decoding.exits`, ``stack.set_exits``), from the most conservative
threshold to the least (a row exits where its confidence is at least the threshold, so a higher
threshold exits less). With f the full depth's best hypothesis of a sentence and h the one
with exits (tokens with their end of sentence), each point measures:

* **agreement**: the share of the full depth's target tokens that the exiting decoding
  reproduces position by position, sum over sentences of #{t < |f| : h_t = f_t} / sum |f|
  (a shorter h leaves the rest of f unmatched);
* **identical**: the share of sentences with h = f exactly;
* **mean levels**: the levels a row ran per decoding step (:attr:`Exits.mean_levels`, row-steps
  of every beam);
* **seconds**: the decoding's wall clock.

The chosen threshold is the one with the fewest mean levels among those whose agreement is at
least the stated one (CALM, Schuster et al. 2022, calibrates its thresholds for a stated
consistency with the full model in the same spirit, sec. 4, with a statistical guarantee this
plain search does not give). It is calibrated on the validation set, never on the test set.

The cost of the test itself (:func:`exit_test_cost`): the ``margin`` test runs the output layer at
every candidate level. Decoding with the test's confidence computed at every level but a
threshold of +inf (never exits) against exits off gives the test's overhead, and the time spent
inside the test is measured directly; the rest of the step is the levels and the search.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch import Tensor, nn

from recurnmt.modules.decoding.exits import ExitClassifier, Exits, exits_of
from recurnmt.nmt.speculative import flag_names

# from most to least conservative: a row exits where its confidence is at least the threshold
GRIDS = {
    "margin": (0.999, 0.995, 0.99, 0.98, 0.95, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1),
    "saturation": (0.99999, 0.9999, 0.9995, 0.999, 0.998, 0.995, 0.99, 0.98, 0.95, 0.9, 0.8),
    "classifier": (0.999, 0.995, 0.99, 0.98, 0.95, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3),
}
Batches = Sequence[dict[str, Any]]
Move = Callable[[dict[str, Any]], dict[str, Any]]
Hypotheses = dict[int, list[int]]  # sentence id -> the best hypothesis' tokens


@dataclass
class Point:
    """One threshold's decoding against the full depth's (module docstring)."""

    threshold: float
    agreement: float
    identical: float
    mean_levels: float
    seconds: float


def agreement(hypotheses: Hypotheses, full: Hypotheses) -> tuple[float, float]:
    """(token agreement, identical share) of ``hypotheses`` against the full depth's ``full``
    (module docstring)."""
    matched = total = same = 0
    for sid, f in full.items():
        h = hypotheses[sid]
        matched += sum(a == b for a, b in zip(h, f, strict=False))
        total += len(f)
        same += h == f
    return matched / max(total, 1), same / max(len(full), 1)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def decode(model: nn.Module, generator, batches: Batches, move: Move) -> tuple[Hypotheses, float]:
    """The best hypothesis of every sentence of ``batches``, and the seconds it took."""
    device = next(model.parameters()).device
    out: Hypotheses = {}
    _sync(device)
    start = time.perf_counter()
    with torch.no_grad():
        for sample in batches:
            sample = move(sample)
            hypos = generator.generate([model], sample)
            for sid, h in zip(sample["id"].tolist(), hypos, strict=True):
                out[sid] = h[0]["tokens"].tolist()
    _sync(device)
    return out, time.perf_counter() - start


def make_exits(
    model: nn.Module,
    test: str,
    threshold: float,
    min_level: int,
    classifier: ExitClassifier | None,
    classifier_path: str | None = None,
) -> Exits:
    """The exits of ``test`` at ``threshold`` for ``model``'s decoder, checked as
    ``fairseq-generate`` checks them (a ``ConfigError`` naming the flag)."""
    decoder = model.decoder
    levels = len(decoder.stack.active_levels)
    options = SimpleNamespace(exit_test=test, exit_threshold=threshold,
                              min_exit_level=min_level, exit_classifier=classifier_path)  # fmt: skip
    with flag_names():
        exits = exits_of(options, levels, decoder.output_layer, lambda path: classifier)
        decoder.stack.set_exits(exits)  # checks the level
        decoder.stack.set_exits(None)
    return exits


def calibrate(
    model: nn.Module,
    make_generator: Callable[[], Any],
    batches: Batches,
    exits_at: Callable[[float], Exits],
    thresholds: Sequence[float],
    move: Move = lambda sample: sample,
    log: Callable[[str], None] | None = None,
) -> tuple[Point, list[Point], Hypotheses]:
    """The full depth's decoding (a point at +inf: every level) and each threshold's.

    Returns:
        (the full depth's point, the thresholds' points in the order given, the full depth's
        hypotheses).
    """
    stack = model.decoder.stack
    stack.set_exits(None)
    full, seconds = decode(model, make_generator(), batches, move)
    levels = len(stack.active_levels)
    reference = Point(math.inf, 1.0, 1.0, float(levels), seconds)
    points = []
    try:
        for t in thresholds:
            exits = exits_at(t)
            stack.set_exits(exits)
            hypotheses, seconds = decode(model, make_generator(), batches, move)
            stack.set_exits(None)
            point = Point(t, *agreement(hypotheses, full), exits.mean_levels, seconds)
            points.append(point)
            if log is not None:
                log(f"threshold {t:g}: agreement {point.agreement:.2%}, identical "
                    f"{point.identical:.2%}, {point.mean_levels:.2f} of {levels} levels, "
                    f"{seconds:.2f} s")  # fmt: skip
    finally:
        stack.set_exits(None)
    return reference, points, full


def choose(points: Sequence[Point], target: float) -> Point | None:
    """The point of fewest mean levels whose agreement is at least ``target`` (ties: the
    more conservative threshold); None where none is."""
    meeting = [p for p in points if p.agreement >= target]
    if not meeting:
        return None
    return min(meeting, key=lambda p: (p.mean_levels, -p.threshold))


class _TimedConfidence:
    """An :class:`Exits`'s confidence whose calls are timed (seconds summed, calls counted)."""

    def __init__(self, exits: Exits, device: torch.device) -> None:
        self.inner, self.device = exits.confidence, device
        self.seconds, self.calls = 0.0, 0

    def __call__(self, level: int, state: Tensor, before: Tensor, normed: Tensor) -> Tensor:
        _sync(self.device)
        start = time.perf_counter()
        out = self.inner(level, state, before, normed)
        _sync(self.device)
        self.seconds += time.perf_counter() - start
        self.calls += 1
        return out


def exit_test_cost(
    model: nn.Module,
    make_generator: Callable[[], Any],
    batches: Batches,
    exits_never: dict[str, Exits],
    move: Move = lambda sample: sample,
) -> dict[str, Any]:
    """What each exit test costs when it never exits (threshold +inf) against exits off.

    Args:
        exits_never: ``{test: exits at threshold +inf}``.

    Returns:
        For exits off and each test: the decoding's seconds; for each test also the seconds
        inside the test (its confidence, the ``margin`` test's output layer included), its
        calls (one per decoding step and candidate level), microseconds a call, and the
        shares of the decoding's time: the test's, and the whole overhead against exits off
        (the test plus the exits' bookkeeping).
    """
    stack = model.decoder.stack
    device = next(model.parameters()).device
    stack.set_exits(None)
    decode(model, make_generator(), batches[:1], move)  # warm up (first-call allocations)
    _, off = decode(model, make_generator(), batches, move)
    out: dict[str, Any] = {"exits_off_seconds": off, "tests": {}}
    try:
        for test, exits in exits_never.items():
            timed = _TimedConfidence(exits, device)
            exits.confidence = timed  # the instance's attribute: run_levels calls it
            stack.set_exits(exits)
            _, seconds = decode(model, make_generator(), batches, move)
            stack.set_exits(None)
            out["tests"][test] = {
                "seconds": seconds,
                "test_seconds": timed.seconds,
                "test_calls": timed.calls,
                "test_us_per_call": 1e6 * timed.seconds / max(timed.calls, 1),
                "test_share": timed.seconds / seconds if seconds else 0.0,
                "overhead_vs_exits_off": seconds / off - 1 if off else 0.0,
                "mean_levels": exits.mean_levels,
            }
    finally:
        stack.set_exits(None)
    return out


def cost_table(cost: dict[str, Any]) -> str:
    """The cost of each test as a markdown table."""
    lines = [
        "| test (never exits) | seconds | in the test | share in the test | overhead vs exits off |",
        "| --- | ---: | ---: | ---: | ---: |",
        f"| exits off | {cost['exits_off_seconds']:.2f} | | | |",
    ]
    for test, c in cost["tests"].items():
        lines.append(
            f"| {test} | {c['seconds']:.2f} | {1e3 * c['test_seconds']:.1f} ms ({c['test_calls']} "
            f"calls, {c['test_us_per_call']:.0f} us each) | {c['test_share']:.1%} | "
            f"{c['overhead_vs_exits_off']:+.1%} |"
        )
    return "\n".join(lines)


def points_table(reference: Point, points: Sequence[Point], chosen: Point | None) -> str:
    """The points as a markdown table, the chosen one marked."""
    lines = [
        "| threshold | agreement | identical | mean levels | seconds |",
        "| ---: | ---: | ---: | ---: | ---: |",
        f"| full depth | {reference.agreement:.2%} | {reference.identical:.2%} | "
        f"{reference.mean_levels:.2f} | {reference.seconds:.2f} |",
    ]
    for p in points:
        mark = " **(chosen)**" if p is chosen else ""
        lines.append(
            f"| {p.threshold:g}{mark} | {p.agreement:.2%} | {p.identical:.2%} | "
            f"{p.mean_levels:.2f} | {p.seconds:.2f} |"
        )
    return "\n".join(lines)


def plot(
    points: Sequence[Point], levels: int, target: float, chosen: Point | None, out: Path, title: str
) -> Path:
    """Agreement, identical share and mean levels against the threshold's position on the grid."""
    import logging

    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # fairseq may log at DEBUG
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = list(range(len(points)))
    fig, left = plt.subplots(figsize=(7.0, 3.8), constrained_layout=True)
    left.plot(x, [p.agreement for p in points], "o-", label="token agreement")
    left.plot(x, [p.identical for p in points], "s--", ms=4, label="identical sentences")
    left.axhline(target, color="grey", lw=0.8, ls=":", label=f"stated agreement {target:g}")
    left.set_ylim(0, 1.02)
    left.set_ylabel("share (vs full depth)")
    left.set_xticks(x, [f"{p.threshold:g}" for p in points], rotation=45, fontsize=8)
    left.set_xlabel("threshold (most to least conservative)")
    right = left.twinx()
    right.plot(x, [p.mean_levels for p in points], "^-", color="C2", label="mean levels run")
    right.set_ylim(0, levels + 0.2)
    right.set_ylabel(f"mean levels run (of {levels})")
    if chosen is not None:
        left.axvline(points.index(chosen), color="C3", lw=0.8, label=f"chosen {chosen.threshold:g}")
    handles = left.get_legend_handles_labels()
    more = right.get_legend_handles_labels()
    left.legend(handles[0] + more[0], handles[1] + more[1], fontsize=8, loc="lower left")
    left.grid(alpha=0.3)
    fig.suptitle(title, fontsize=10)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def as_dict(point: Point) -> dict[str, Any]:
    d = asdict(point)
    d["threshold"] = None if math.isinf(point.threshold) else point.threshold
    return d


__all__ = [
    "GRIDS",
    "Point",
    "agreement",
    "calibrate",
    "choose",
    "cost_table",
    "decode",
    "make_exits",
    "plot",
    "points_table",
    "exit_test_cost",
]
