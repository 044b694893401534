"""``recurnmt-exits``: the decoding exits' learned test and thresholds, for a trained model.

Two subcommands, on a fairseq checkpoint of a recurnmt translation model (its decoder a recurnmt
stack that does not halt with ACT, whose halting decides each position's depth itself):

* ``train``: the ``classifier`` test's units (:mod:`recurnmt.analysis.exit_training`: one
  logistic unit per decoder level on CALM's oracle labels, Schuster et al. 2022),
  written to ``--out FILE`` for ``fairseq-generate --exit-test classifier --exit-classifier
  FILE``;
* ``calibrate``: the threshold of a test (``margin``, ``saturation`` or ``classifier``) that
  saves the most levels at a stated agreement with full-depth decoding, on the validation set
  (:mod:`recurnmt.analysis.exit_calibration`); JSON, markdown and PNG in ``--out DIR``, and the
  ``fairseq-generate`` flags that use it.

Command line::

    recurnmt-exits train CKPT --data DIR --out FILE [--subset train] [--max-tokens 4096]
        [--epochs 3] [--max-sentences N] [--lr 0.01] [--seed 1] [--device auto]
    recurnmt-exits calibrate CKPT --data DIR --exit-test {margin,saturation,classifier}
        [--exit-classifier FILE] [--agreement 0.99] [--beam 4] [--batch-size 64]
        [--max-sentences N] [--min-exit-level 1] [--thresholds T ...] [--out DIR] [--no-cost]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from recurnmt.cli import entry_point
from recurnmt.modules.decoding.options import EXIT_TESTS

PROG = "recurnmt-exits"  # also python -m recurnmt.analysis.exits
OUT_NAMES = ("calibration.json", "calibration.md", "calibration.png")
USER_DIR = "user_dir"  # fairseq's --user-dir of the plugin, from the repository root


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True, metavar="{train,calibrate}")

    def common(q: argparse.ArgumentParser) -> None:
        q.add_argument(
            "checkpoint", metavar="CKPT", help="a fairseq checkpoint of a recurnmt model"
        )
        q.add_argument("--data", required=True, help="the fairseq data-bin directory")
        q.add_argument("--max-sentences", type=int, help="the first sentence pairs only (all)")
        q.add_argument("--device", default="auto", help="auto, cpu or cuda")

    t = sub.add_parser("train", help="train the classifier test's units (CALM's oracle labels)")
    common(t)
    t.add_argument("--out", type=Path, required=True, help="the units' file")
    t.add_argument("--subset", default="train", help="train or valid (default train)")
    t.add_argument("--max-tokens", type=int, default=4096, help="target tokens per batch")
    t.add_argument("--epochs", type=int, default=3, help="passes over the subset")
    t.add_argument("--lr", type=float, default=0.01, help="Adam's learning rate")
    t.add_argument("--seed", type=int, default=1, help="the batches' order")

    c = sub.add_parser("calibrate", help="the threshold meeting an agreement, on valid")
    common(c)
    c.add_argument("--exit-test", required=True, help=f"one of {', '.join(EXIT_TESTS)}")
    c.add_argument("--exit-classifier", help="the units of recurnmt-exits train (classifier)")
    c.add_argument("--agreement", type=float, default=0.99,
                   help="the token agreement with full depth to meet (default 0.99)")  # fmt: skip
    c.add_argument("--subset", default="valid", help="the validation subset (default valid)")
    c.add_argument("--beam", type=int, default=4, help="beam size (1: greedy)")
    c.add_argument("--batch-size", type=int, default=64, help="sentences per batch")
    c.add_argument("--max-len-a", type=float, default=0, help="fairseq's --max-len-a")
    c.add_argument("--max-len-b", type=int, default=200, help="fairseq's --max-len-b")
    c.add_argument("--min-exit-level", type=int, default=1, help="the fewest levels a row runs")
    c.add_argument("--thresholds", type=float, nargs="+",
                   help="the grid (default: the test's own, exit_calibration.GRIDS)")  # fmt: skip
    c.add_argument(
        "--out", type=Path, default=Path("exits_calibration"), help="the outputs' folder"
    )
    c.add_argument("--no-cost", action="store_true", help="skip timing the tests' own cost")
    c.add_argument("--title", default="", help="the figure's title")
    return p


def _positive(args: argparse.Namespace, *names: str) -> None:
    for name in names:
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name.replace('_', '-')} {value}: give at least 1")


def _load(args: argparse.Namespace, what: str):
    """(model, its architecture's name, the task, the device, a batch mover)."""
    from fairseq import utils

    from recurnmt.analysis.level_states import check_decoder
    from recurnmt.analysis.nmt_inputs import device_of, load_nmt_models
    from recurnmt.checkpoint_files import FAIRSEQ, read_checkpoint_file

    read_checkpoint_file(args.checkpoint, FAIRSEQ, mmap=True)  # one line for a bad file
    device = device_of(args.device)
    models, names, task = load_nmt_models([args.checkpoint], args.data, device)
    model = models[0]
    check_decoder(model, what)
    for p in model.parameters():
        p.requires_grad_(False)  # frozen

    def move(sample: dict[str, Any]) -> dict[str, Any]:
        return utils.move_to_cuda(sample, device) if device.type == "cuda" else sample

    return model, names[0], task, device, move


# ------------------------------------------------------------------------------------ train


def train(args: argparse.Namespace) -> dict[str, Any]:
    if args.subset not in ("train", "valid"):
        raise ValueError(f"--subset {args.subset}: train or valid (units never learn the test set)")
    _positive(args, "max_tokens", "epochs", "max_sentences")
    if not args.lr > 0:
        raise ValueError(f"--lr {args.lr}: give a positive learning rate")
    from recurnmt.analysis.exit_training import score_units, train_units
    from recurnmt.analysis.nmt_inputs import translation_batches

    model, arch, task, _, move = _load(args, "the exit units")
    batches = translation_batches(task, args.subset, args.max_sentences, max_tokens=args.max_tokens)
    if not batches:
        raise ValueError(f"--subset {args.subset}: no sentences in {args.data}")
    pad = task.target_dictionary.pad()
    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    units = train_units(model, batches, pad, move, args.epochs, args.lr, args.seed, log)
    scores = score_units(model, units, batches, pad, move)
    stack = model.decoder.stack
    about = {
        "checkpoint": str(args.checkpoint),
        "arch": arch,
        "levels": len(stack.active_levels),
        "embed_dim": units.weight.size(1),
        "data": str(args.data),
        "subset": args.subset,
        "sentences": sum(int(b["nsentences"]) for b in batches),
        "tokens": scores.tokens,
        "epochs": args.epochs,
        "lr": args.lr,
        "seed": args.seed,
        "labels": "CALM (Schuster et al. 2022): level r's argmax = the full depth's",
        "last_level": "always exits (never asked: a row reaching level N leaves it anyway)",
        "per_level": scores.as_rows(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    units.save(args.out, **about)
    print(f"{arch} on {args.subset}: {about['sentences']} sentences, {scores.tokens} tokens")
    print("level  accuracy  agreement    auc")
    for row in about["per_level"]:
        auc = "   -" if row["auc"] is None else f"{row['auc']:.3f}"
        print(f"{row['level']:>5}  {row['accuracy']:8.1%}  {row['agreement']:9.1%}  {auc:>5}")
    print(args.out)
    return about


# -------------------------------------------------------------------------------- calibrate


def _check_calibration(args: argparse.Namespace) -> None:
    """``recurnmt-exits calibrate``'s settings among themselves, each refused by its flag."""
    from recurnmt.modules.decoding.options import THRESHOLDS

    if args.subset.startswith("test"):
        raise ValueError(
            f"--subset {args.subset}: a threshold is never calibrated on the test set; "
            "calibrate on the validation set (valid)"
        )
    if args.exit_test not in EXIT_TESTS:
        raise ValueError(f"--exit-test {args.exit_test}: choose one of {', '.join(EXIT_TESTS)}")
    if args.exit_test == "classifier" and not args.exit_classifier:
        raise ValueError("--exit-test classifier: needs --exit-classifier (recurnmt-exits train)")
    if args.exit_test != "classifier" and args.exit_classifier:
        raise ValueError(f"--exit-classifier: needs --exit-test classifier, not {args.exit_test}")
    if not 0 < args.agreement <= 1:
        raise ValueError(f"--agreement {args.agreement}: a share in (0, 1]")
    _positive(args, "beam", "batch_size", "max_sentences", "min_exit_level")
    low, high = THRESHOLDS[args.exit_test]
    for t in args.thresholds or ():
        if not low <= t <= high:
            raise ValueError(f"--thresholds {t:g}: the {args.exit_test} test's confidence lies "
                             f"in [{low:g}, {high:g}]")  # fmt: skip


def calibrate(args: argparse.Namespace) -> dict[str, Any]:
    _check_calibration(args)
    from fairseq.sequence_generator import SequenceGenerator

    from recurnmt.analysis import exit_calibration as cal
    from recurnmt.analysis.nmt_inputs import translation_batches
    from recurnmt.checkpoint_files import read_checkpoint_file
    from recurnmt.modules.decoding.exits import ExitClassifier
    from recurnmt.nmt.speculative import flag_names

    units = None
    if args.exit_classifier:  # before the model: a bad file in one line, by its flag
        try:
            read_checkpoint_file(args.exit_classifier)  # missing, a text file, truncated
        except (OSError, ValueError) as error:
            raise ValueError(f"--exit-classifier: {error}") from None
        with flag_names():
            units = ExitClassifier.load(Path(args.exit_classifier))[0]
    model, arch, task, device, move = _load(args, "exits")
    if units is not None:
        units = units.to(device)
    test, level = args.exit_test, args.min_exit_level

    def exits_at(threshold: float, which: str = test):
        return cal.make_exits(model, which, threshold, level, units if which == "classifier"
                              else None, args.exit_classifier)  # fmt: skip

    exits_at(math.inf)  # the level and the classifier's levels, before any decoding
    batches = translation_batches(task, args.subset, args.max_sentences, args.batch_size)
    if not batches:
        raise ValueError(f"--subset {args.subset}: no sentences in {args.data}")
    tgt = task.target_dictionary

    def generator():
        return SequenceGenerator([model], tgt, beam_size=args.beam, max_len_a=args.max_len_a,
                                 max_len_b=args.max_len_b)  # fmt: skip

    thresholds = sorted(args.thresholds or cal.GRIDS[test], reverse=True)
    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    reference, points, _ = cal.calibrate(model, generator, batches, exits_at, thresholds, move, log)
    chosen = cal.choose(points, args.agreement)
    levels = len(model.decoder.stack.active_levels)
    cost = None
    if not args.no_cost:
        tests = [t for t in EXIT_TESTS if t != "classifier" or units is not None]
        never = {t: exits_at(math.inf, t) for t in tests}
        cost = cal.exit_test_cost(model, generator, batches, never, move)
    flags = None
    if chosen is not None:
        flags = (f"--task speculative_translation --user-dir {USER_DIR} --beam {args.beam} "
                 f"--exit-test {test} --exit-threshold {chosen.threshold:g} "
                 f"--min-exit-level {level}")  # fmt: skip
        if units is not None:
            flags += f" --exit-classifier {args.exit_classifier}"
    report = {
        "checkpoint": str(args.checkpoint),
        "arch": arch,
        "data": str(args.data),
        "subset": args.subset,
        "sentences": sum(int(b["nsentences"]) for b in batches),
        "levels": levels,
        "exit_test": test,
        "exit_classifier": args.exit_classifier,
        "min_exit_level": level,
        "beam": args.beam,
        "max_len_a": args.max_len_a,
        "max_len_b": args.max_len_b,
        "target_agreement": args.agreement,
        "agreement": "token agreement: sum over sentences of the positions t < |f| with h_t = "
        "f_t over sum |f| (f: the full depth's best hypothesis, h: with exits); identical: the "
        "share of sentences with h = f",
        "full_depth": cal.as_dict(reference),
        "points": [cal.as_dict(p) for p in points],
        "chosen_threshold": None if chosen is None else chosen.threshold,
        "fairseq_generate_flags": flags,
        "cost": cost,
    }
    _write_calibration(args, report, reference, points, chosen, cost)
    return report


def _write_calibration(args, report: dict[str, Any], reference, points, chosen, cost) -> None:
    """The calibration's JSON, markdown table and plot in ``args.out``, and what it prints."""
    from recurnmt.analysis import exit_calibration as cal

    arch, test, levels, flags = report["arch"], args.exit_test, report["levels"], \
        report["fairseq_generate_flags"]  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    json_path, md_path, png_path = (args.out / name for name in OUT_NAMES)
    json_path.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    title = args.title or f"{arch}: {test} exits on {args.subset} (beam {args.beam})"
    verdict = (
        f"chosen threshold {chosen.threshold:g}: agreement {chosen.agreement:.2%} >= "
        f"{args.agreement:g} at {chosen.mean_levels:.2f} of {levels} levels"
        if chosen is not None
        else f"no threshold of the grid meets agreement {args.agreement:g}: decode without exits"
    )
    md = [f"# {title}", "", cal.points_table(reference, points, chosen), "", verdict + "."]
    if cost is not None:
        md += ["", "The tests' own cost (threshold +inf: never exit):", "", cal.cost_table(cost)]
    md_path.write_text("\n".join(md) + "\n", encoding="utf-8")
    cal.plot(points, levels, args.agreement, chosen, png_path, title)
    print(
        f"{arch} on {args.subset}: {report['sentences']} sentences, {test} test, beam {args.beam}"
    )
    print(cal.points_table(reference, points, chosen))
    if cost is not None:
        print(cal.cost_table(cost))
    print(verdict)
    if flags is not None:
        print(f"fairseq-generate {args.data} --path {args.checkpoint} {flags}")
    for path in (json_path, md_path, png_path):
        print(path)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = build_parser().parse_args(argv)
    return train(args) if args.command == "train" else calibrate(args)


cli = entry_point(main, PROG)  # the console script

if __name__ == "__main__":
    sys.exit(cli())
