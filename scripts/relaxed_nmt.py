"""Relaxed recursion on real text, on the axis the method claims: a transformer trained to its
plateau (a sunk cost) converted into relaxed recursive models and uptrained for K updates,
against the same models trained from scratch for K and for the teacher's T + K updates, the
teacher continued and the teacher re-warmed (Relaxed Recursive Transformers, Bae et al., ICLR
2025). The runs and their order: :mod:`studies.relaxed.study`; the page:
:mod:`studies.relaxed.report`.

On the embedded German-English corpus (prepared with a learned 4,000-piece vocabulary when
missing). The study is long (the teacher, 36 conversions, then the fine-tuning grid: many
hours on 2 cores); every finished run is reused, so it runs in parts: ``--hours H`` stops
starting runs after H hours and writes the page from what has run (the main cells first, so
a partial study already compares them), and the same command continues it.

Writes ``docs/relaxed_nmt.md`` (tables, paired bootstrap, verdicts computed from the numbers),
``docs/relaxed_nmt.png`` (sacreBLEU against K), ``docs/relaxed_nmt.json`` (the record: every
finished run's result) and ``docs/relaxed_nmt_hyps/`` (every evaluation's hypotheses,
gzipped). Commit the record and the hypotheses: a checkout without the run directories
(``work/relaxed_nmt``) goes on from them, and makes again what a later run needs (the teacher's
checkpoint, checked against the record; the conversions).

Run from the repository root::

    python scripts/relaxed_nmt.py --hours 2          # two hours of the study, then the page
    python scripts/relaxed_nmt.py --report           # the page from what has run
    python scripts/relaxed_nmt.py --hours 2 --teacher-free   # only runs without the teacher
    python scripts/relaxed_nmt.py --hours 2 --recover-hypotheses  # and the bootstraps it lacks
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
import time
from pathlib import Path
from typing import Any

# studies/ is the checkout's own, not installed: python scripts/NAME.py puts scripts/ first on
# the import path, and the checkout's root goes before it
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from data_prep.embedded import data_dir
from recurnmt.cli import UserError, entry_point
from recurnmt.experiments.artifacts import write_json
from recurnmt.experiments.commands import run_logged
from recurnmt.experiments.experiment import add_size_arguments
from studies.plan import LATER
from studies.relaxed.report import markdown, plot, runs
from studies.relaxed.setup import INITS
from studies.relaxed.study import Study

PROG = "python scripts/relaxed_nmt.py"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--data", help="prepared corpus (default: by --vocab-size, made if missing)")
    p.add_argument("--vocab-size", type=int, default=4000)
    p.add_argument("--out", type=Path, default=Path("work/relaxed_nmt"), help="run directories")
    p.add_argument("--doc", type=Path, default=Path("docs/relaxed_nmt.md"))
    add_size_arguments(p, "layers of the teacher, levels of the relaxed models", pre_ln=None,
                       embed_dim=128, ffn_dim=512, heads=4, levels=6)  # fmt: skip
    grid = p.add_argument_group("the conversions")
    grid.add_argument("--unique", type=int, nargs="+", default=[1, 2, 3], help="blocks M a side")
    grid.add_argument("--inits", nargs="+", choices=INITS, default=list(INITS))
    grid.add_argument("--ranks", nargs="+", default=["0", "8", "32", "full"], help="LoRA ranks")
    grid.add_argument("--main-init", choices=INITS, default="stepwise",
                      help="the main cells' init (they get every control and every seed)")  # fmt: skip
    grid.add_argument("--main-rank", default="8", help="the main cells' LoRA rank")
    budget = p.add_argument_group("uptraining")
    budget.add_argument("--budgets", type=int, nargs="+", default=[350, 700, 1400],
                        help="fine-tuning budgets K (multiples of --interval)")  # fmt: skip
    budget.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3],
                        help="seeds of the main cells (the rest of the grid: the first)")  # fmt: skip
    budget.add_argument("--tune-lrs", type=float, nargs="+", default=[3e-4, 1e-3, 3e-3],
                        help="fine-tuning peak lrs to choose from on validation")  # fmt: skip
    budget.add_argument("--tune-warmup", type=int, default=50)
    budget.add_argument("--distill", action="store_true",
                        help="the teacher's translations as the students' targets "
                        "(sequence-level distillation)")  # fmt: skip
    budget.add_argument("--teacher-distill", type=float, default=0.5, metavar="W",
                        help="the weight of word-level distillation from the teacher's "
                        "distribution in a comparison at the main cells, the middle K, seed 1 "
                        "(0: not run)")  # fmt: skip
    teacher = p.add_argument_group("the teacher (and training from scratch)")
    teacher.add_argument("--lr", type=float, default=3e-3)
    teacher.add_argument("--warmup", type=int, default=400)
    teacher.add_argument("--dropout", type=float, default=0.1)
    teacher.add_argument("--interval", type=int, default=350,
                         help="updates between the teacher's validations")  # fmt: skip
    teacher.add_argument("--patience", type=int, default=4,
                         help="validations without improvement before it stops")  # fmt: skip
    teacher.add_argument("--max-update", type=int, default=10500, help="the teacher's cap")
    teacher.add_argument("--max-tokens", type=int, default=2048)
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--lenpen", type=float, default=1.5)
    p.add_argument("--nproc", type=int, default=min(2, os.cpu_count() or 1))
    p.add_argument("--hours", type=float, help="start no run after this many hours")
    p.add_argument("--report", action="store_true", help="run nothing: the page only")
    p.add_argument("--fresh", action="store_true", help="redo finished runs")
    p.add_argument("--teacher-free", action="store_true",
                   help="without the teacher's checkpoint here (a new checkout), start only the "
                   "runs that do not need it (from scratch, T + K), not training it again")  # fmt: skip
    p.add_argument("--recover-hypotheses", action="store_true",
                   help="make again the finished runs whose paired bootstrap is missing because "
                   "their hypotheses were not kept; kept only where the new run reproduces the "
                   "recorded one")  # fmt: skip
    return p


def languages(data: Path) -> tuple[str, str]:
    """The source and target language of a binarized corpus (``train.de-en.de.bin``)."""
    for path in sorted(data.glob("train.*-*.*.bin")):
        match = re.match(r"train\.(\w+)-(\w+)\.", path.name)
        if match:
            return match.group(1), match.group(2)
    raise UserError(f"{data} holds no binarized training set (train.SRC-TGT.*.bin)")


def check(args: argparse.Namespace) -> None:
    """Impossible settings, each named."""
    for m in args.unique:
        if not 1 <= m <= args.levels:
            raise UserError(f"--unique {m}: choose 1 to --levels {args.levels} blocks")
    for r in [*args.ranks, args.main_rank]:
        if r != "full" and not (r.isdigit() and int(r) <= args.embed_dim):
            raise UserError(f"--ranks {r}: choose full or a rank from 0 to --embed-dim "
                            f"{args.embed_dim}")  # fmt: skip
    for k in args.budgets:
        if k <= 0 or k % args.interval:
            raise UserError(f"--budgets {k}: a multiple of --interval {args.interval} (so "
                            "that the teacher's T + K is a checkpoint)")  # fmt: skip
    if args.nproc < 1 or args.max_tokens % args.nproc:
        raise UserError(f"--nproc {args.nproc} must divide --max-tokens {args.max_tokens}")
    if not 0 <= args.teacher_distill <= 1:
        raise UserError(f"--teacher-distill {args.teacher_distill}: a weight in 0 .. 1")
    if args.hours is not None and args.hours <= 0:
        raise UserError(f"--hours {args.hours}: a positive number of hours")


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    check(args)
    args.data = Path(args.data or data_dir(args.vocab_size))
    if not (args.data / "dict.en.txt").exists() and args.data == data_dir(args.vocab_size):
        print(f"Preparing the embedded corpus into {args.data} ...", flush=True)
        prep = [sys.executable, "-m", "data_prep.embedded", "prepare", "--out", str(args.data)]
        args.out.mkdir(parents=True, exist_ok=True)
        run_logged([*prep, "--vocab-size", str(args.vocab_size)], args.out / "prepare.log")
    args.langs = languages(args.data)
    os.environ.setdefault("PYTHONHASHSEED", "0")
    args.record = args.doc.with_suffix(".json")  # runs finished in another checkout
    study = Study(args)
    deadline = None if args.hours is None else time.time() + 3600 * args.hours
    if args.report:
        deadline = 0.0
    results, pending = study.run(deadline)
    args.doc.parent.mkdir(parents=True, exist_ok=True)
    png = args.doc.with_suffix(".png")
    plot(results, study, png)
    once = ("--report", "--fresh", "--teacher-free", "--recover-hypotheses")
    shown = [a for a in argv if a not in once]
    hours = [i for i, a in enumerate(shown) if a == "--hours"]
    for i in reversed(hours):  # the page names the study, not how long one part ran
        del shown[i : i + 2]
    command = shlex.join([*PROG.split(), *shown])
    args.doc.write_text(markdown(results, pending, study, command, png), encoding="utf-8")
    kept = study.record.keep(results, args.out)
    record = {"results": results, "pending": pending, "bootstrap": study.record.pvalues}
    write_json(args.record, record)
    print(f"wrote {args.doc}, {png}, {args.record} (+{kept} hypotheses in "
          f"{study.record.hyps_dir})"
          + (f"; {runs(len([p for p in pending if p != LATER]))} still to do" if pending else ""))  # fmt: skip
    return results


if __name__ == "__main__":
    sys.exit(entry_point(main, PROG)())
