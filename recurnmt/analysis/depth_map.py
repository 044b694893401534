"""The depth map of a recurrent decoder: at which level each target token is already settled.

Teacher-forced over a subset (the reference prefix as the decoder's input, every position at
once), the decoder's state after each level r = 1..N goes through the final norm and the output
layer as the full depth's state does: a prediction of the model at depth r, the one a draft of
the first r levels makes (:mod:`recurnmt.modules.decoding.speculative`, ``StackOutput.hidden``)
and the one the decoding exits of issue 74 will emit. With a_r(t) the argmax at level r for
target position t (the raw argmax over the vocabulary) and f(t) = a_N(t) the full depth's:

* **agreement** at r: the share of (non-padding) target tokens with a_r = f; 1 at level N.
  This is the oracle label of CALM (Schuster et al. 2022, "Confident Adaptive Language
  Modeling", whose early-exit classifier learns whether an intermediate layer's prediction is
  consistent with the full model's): a token may exit at a level whose prediction equals the
  full depth's.
* **corrects** and **breaks** at r: the tokens wrong at r - 1 and agreeing at r, and the other
  way round (level 0 agrees nowhere, so level 1's corrects are its agreeing tokens). Their
  difference is the change of the agreeing count from r - 1 to r.
* **exit share** at r: the share of tokens whose oracle exit level e(t), the first level from
  which the argmax no longer changes up to N (a_s = f for every s >= e), is at most r:
  cumulative, non-decreasing, 1 at level N, never above the agreement. The **mean oracle exit
  level** is the mean of e(t); N minus it is the levels per token an oracle could skip.
* **accuracy** at r: the share of tokens with a_r equal to the reference token, the teacher-forced
  accuracy of the model at depth r. The Depth-Adaptive Transformer (Elbayad et al. 2020, ICLR)
  reads out every decoder block through the output layer in the same way and supervises its
  per-token exits with oracles computed against the reference (which block gets the token
  right, and how likely each block makes it).

What this map leaves out, as future work of the decoding exits: the BLEU of the oracle exit.
Under teacher forcing the oracle exit's token is the full depth's by definition (e is the first
level from which the prediction equals f), so its translation would be the full model's; it can
differ only in decoding, once an exited row's state stands in for the deeper levels' keys and
values that later positions attend to, and how that is done (state propagation, as CALM and
the Depth-Adaptive Transformer do, or another scheme) is what the exits during decoding will
define. The encoder runs at its full depth throughout.

Refused: a decoder that halts with ACT (the Universal Transformer's ``--act on``,
:mod:`recurnmt.modules.halting`): its output mixes every level's output, so the state after r
levels is no prediction of the model and no level is an exit (as speculation refuses it); and a
decoder that is no recurnmt stack (fairseq's own ``transformer``). Every other family runs its
levels in order from the first one: a shared block (RingFormer, Universal Transformer), SReT's
loops, relaxed recursion's cycle, a plain stack. For one shared block, the first r levels are
the model at elastic depth r (``--decoder-levels r``); SReT's elastic depths loop every block
fewer times instead, so there the map's levels are the first r of its order, not those depths.

Command line::

    recurnmt-depth-map CKPT --data DIR [--subset test] [--out DIR]
        [--max-sentences N] [--batch-size 64] [--device auto]

writes ``DIR/depth_map.json`` and ``DIR/depth_map.png`` and prints a table.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from recurnmt.analysis.level_states import check_decoder, level_predictions
from recurnmt.cli import entry_point

PROG = "recurnmt-depth-map"  # also python -m recurnmt.analysis.depth_map
JSON_NAME, PNG_NAME = "depth_map.json", "depth_map.png"


# ------------------------------------------------------------------------------- the counts


@dataclass
class DepthMap:
    """Token counts per decoder level, summed over batches (entry r - 1: level r).

    Attributes:
        levels: N, the decoder's levels.
        tokens: the (non-padding) target tokens counted.
        agree: tokens whose argmax at level r equals the full depth's.
        corrects: tokens disagreeing at r - 1 (none agree at level 0) and agreeing at r.
        breaks: tokens agreeing at r - 1 and disagreeing at r.
        exits: tokens whose oracle exit level is r exactly.
        correct: tokens whose argmax at level r is the reference token.
    """

    levels: int
    tokens: int
    agree: Tensor
    corrects: Tensor
    breaks: Tensor
    exits: Tensor
    correct: Tensor

    COUNTS: ClassVar[tuple[str, ...]] = ("agree", "corrects", "breaks", "exits", "correct")

    @classmethod
    def empty(cls, levels: int) -> DepthMap:
        """No tokens yet, for a decoder of ``levels`` levels."""
        zeros = [torch.zeros(levels, dtype=torch.long) for _ in cls.COUNTS]
        return cls(levels, 0, *zeros)

    @classmethod
    def of(cls, predictions: Tensor, target: Tensor) -> DepthMap:
        """The counts of one batch.

        Args:
            predictions: N x n, the argmax at every level of n target tokens (the last row:
                the full depth's).
            target: n, the reference tokens.
        """
        n_levels, n = predictions.shape
        agree = predictions.eq(predictions[-1])  # N x n
        before = torch.cat([agree.new_zeros(1, n), agree[:-1]])  # level 0 agrees nowhere
        # settled[r]: levels r..N all agree; the exit is the first level of that final run
        settled = agree.long().flip(0).cumprod(0).flip(0)  # N x n (0/1)
        exit_level = n_levels - settled.sum(0)  # n, 0-based
        return cls(
            levels=n_levels,
            tokens=n,
            agree=agree.sum(1).cpu(),
            corrects=(agree & ~before).sum(1).cpu(),
            breaks=(before & ~agree).sum(1).cpu(),
            exits=torch.bincount(exit_level, minlength=n_levels).cpu(),
            correct=predictions.eq(target).sum(1).cpu(),
        )

    def add(self, other: DepthMap) -> None:
        """Adds the counts of another batch of the same decoder."""
        if other.levels != self.levels:
            raise ValueError(f"{other.levels} levels added to a map of {self.levels}")
        self.tokens += other.tokens
        for name in self.COUNTS:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def share_of(self, counts: Tensor) -> list[float]:
        """Counts per level as shares of the tokens."""
        return [c / max(self.tokens, 1) for c in counts.tolist()]

    @property
    def agreement(self) -> list[float]:
        """Per level, the share of tokens whose argmax equals the full depth's."""
        return self.share_of(self.agree)

    @property
    def exit_share(self) -> list[float]:
        """Per level r, the share of tokens whose oracle exit level is r or lower."""
        return self.share_of(self.exits.cumsum(0))

    @property
    def accuracy(self) -> list[float]:
        """Per level, the teacher-forced accuracy against the reference."""
        return self.share_of(self.correct)

    @property
    def mean_exit_level(self) -> float:
        """The mean oracle exit level (1..N)."""
        levels = torch.arange(1, self.levels + 1)
        return float((self.exits * levels).sum()) / max(self.tokens, 1)

    def as_dict(self) -> dict[str, Any]:
        """Per-level rows and the summary, for JSON."""
        rows = [
            {
                "level": r + 1,
                "agreement": self.agreement[r],
                "agreeing_tokens": int(self.agree[r]),
                "corrects": int(self.corrects[r]),
                "breaks": int(self.breaks[r]),
                "exit_share": self.exit_share[r],
                "exit_tokens": int(self.exits[r]),
                "accuracy": self.accuracy[r],
            }
            for r in range(self.levels)
        ]
        return {
            "levels": self.levels,
            "tokens": self.tokens,
            "mean_exit_level": self.mean_exit_level,
            "per_level": rows,
        }


# --------------------------------------------------------------------------- the predictions


def depth_map(
    model: nn.Module,
    batches: Iterable[dict[str, Any]],
    pad: int,
    device: torch.device,
    progress: bool = False,
) -> DepthMap:
    """The depth map of ``model`` over ``batches`` (fairseq translation batches)."""
    from fairseq import utils
    from tqdm import tqdm

    check_decoder(model)
    result = DepthMap.empty(len(model.decoder.stack.active_levels))
    for sample in tqdm(batches, desc="depth map", unit="batch", disable=not progress):
        sample = utils.move_to_cuda(sample, device) if device.type == "cuda" else sample
        result.add(DepthMap.of(*level_predictions(model, sample, pad)))
    if result.tokens == 0:
        raise ValueError("no target tokens in the subset")
    return result


# -------------------------------------------------------------------------------- the outputs


def where_depth_pays(result: DepthMap) -> str:
    """One sentence: the tokens settled by level 1, the level after it that settles the most,
    the tokens that need every level and the mean oracle exit level."""
    n, shares = result.levels, result.share_of(result.exits)
    text = f"{shares[0]:.1%} of the tokens are settled at level 1"
    if n > 2:
        top = max(range(1, n - 1), key=lambda r: shares[r])
        text += f", {shares[top]:.1%} settle at level {top + 1} (the most of levels 2-{n - 1})"
    return (
        f"{text}; {shares[-1]:.1%} need all {n} levels; mean oracle exit level "
        f"{result.mean_exit_level:.2f} of {n}"
    )


def table(result: DepthMap) -> str:
    """The per-level numbers as a text table."""
    lines = [
        "level   agree  exit<=r  corrects  breaks  accuracy",
        *(
            f"{r + 1:>5}  {result.agreement[r]:6.1%}  {result.exit_share[r]:7.1%}  "
            f"{int(result.corrects[r]):>8}  {int(result.breaks[r]):>6}  {result.accuracy[r]:8.1%}"
            for r in range(result.levels)
        ),
    ]
    return "\n".join(lines)


def plot(result: DepthMap, out: Path, title: str = "") -> Path:
    """Per-level curves (agreement, exit share, accuracy) and the corrects and breaks."""
    import logging

    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # fairseq may log at DEBUG
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = list(range(1, result.levels + 1))
    fig, (left, right) = plt.subplots(1, 2, figsize=(9.0, 3.6), constrained_layout=True)
    left.plot(levels, result.agreement, "o-", ms=8, label="argmax = full depth's")
    left.plot(levels, result.exit_share, "s-", ms=4, label="oracle exit at level <= r")
    left.plot(levels, result.accuracy, "^--", label="accuracy (reference)")
    left.set_ylim(0, 1.02)
    left.set_xticks(levels)
    left.set_xlabel("decoder level r")
    left.set_ylabel("share of target tokens")
    left.legend(fontsize=8, loc="lower right")
    left.grid(alpha=0.3)
    share = 1.0 / max(result.tokens, 1)
    width = 0.38
    for offset, counts, label in (
        (-1, result.corrects, "corrects (level 1: its agreeing tokens)"),
        (1, result.breaks, "breaks"),
    ):
        x = [r + offset * width / 2 for r in levels]
        right.bar(x, (counts * share).tolist(), width, label=label)
    right.set_xticks(levels)
    right.set_xlabel("decoder level r")
    right.set_ylabel("share of target tokens")
    right.legend(fontsize=8)
    right.grid(alpha=0.3, axis="y")
    fig.suptitle(title or "Depth map (teacher forcing)", fontsize=10)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


# ---------------------------------------------------------------------------------- command


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint", metavar="CKPT", help="a fairseq checkpoint of a recurnmt model")
    p.add_argument("--data", required=True, help="the fairseq data-bin directory")
    p.add_argument("--subset", default="test", help="translation subset (default test)")
    p.add_argument("--out", type=Path, default=Path("depth_map"), help="folder of the outputs")
    p.add_argument("--max-sentences", type=int, help="the first sentence pairs only (all)")
    p.add_argument("--batch-size", type=int, default=64, help="sentences per batch")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    p.add_argument("--title", default="", help="the figure's title")
    p.add_argument("--progress", action="store_true", help="a progress bar")
    return p


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = build_parser().parse_args(argv)
    if args.batch_size < 1:
        raise ValueError(f"--batch-size {args.batch_size}: give at least 1")
    if args.max_sentences is not None and args.max_sentences < 1:
        raise ValueError(f"--max-sentences {args.max_sentences}: give at least 1")
    from recurnmt.analysis.nmt_inputs import device_of, load_nmt_models, translation_batches
    from recurnmt.checkpoint_files import FAIRSEQ, read_checkpoint_file

    read_checkpoint_file(args.checkpoint, FAIRSEQ, mmap=True)  # one line for a bad file
    device = device_of(args.device)
    models, names, task = load_nmt_models([args.checkpoint], args.data, device)
    model = models[0]
    check_decoder(model)
    batches = translation_batches(task, args.subset, args.max_sentences, args.batch_size)
    result = depth_map(model, batches, task.target_dictionary.pad(), device, args.progress)
    report = {
        "checkpoint": str(args.checkpoint),
        "arch": names[0],
        "data": str(args.data),
        "subset": args.subset,
        "sentences": sum(int(b["nsentences"]) for b in batches),
        **result.as_dict(),
        "summary": where_depth_pays(result),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / JSON_NAME).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    title = args.title or f"{names[0]}: depth map on {args.subset} ({result.tokens} tokens)"
    plot(result, args.out / PNG_NAME, title)
    print(f"{names[0]} on {args.subset}: {report['sentences']} sentences, {result.tokens} tokens")
    print(table(result))
    print(report["summary"])
    print(args.out / JSON_NAME)
    print(args.out / PNG_NAME)
    return report


cli = entry_point(main, PROG)  # the console script

if __name__ == "__main__":
    sys.exit(cli())
