"""The Universal Transformer at RingFormer's Table 4 setting: what holds it back, measured.

Trains, on the embedded German-English corpus and at one setting (H=128, FF=512, 4 heads,
6 levels per side, post-LN, shared embeddings, Adam (0.9, 0.98) at lr 1e-3 after 400
inverse-sqrt warm-up updates, clip 1.0, dropout 0.1, label smoothing 0.1, 4,096 tokens a
batch, seed 1), fairseq's transformer, RingFormer and the Universal Transformer, and the
variants that separate the suspects: the coordinate embedding's scale, per-level layer norms,
one shared block without any coordinate embedding (at two learning rates), and the UT with
its layer norms before each sub-layer, as the UT's own code (tensor2tensor) places them.
Each run is one ``fairseq-train`` process on one CPU thread, ``--jobs`` at a time.

Writes ``docs/ut_table4.md`` (validation perplexity after every epoch and at the end, its
ratio to the transformer's, the commands), ``.json`` and ``.png`` (training perplexity
against updates). A finished run (``OUT/NAME/train.log`` ending in fairseq's "done training")
is read, not rerun, unless ``--fresh``.

Run from the repository root::

    python scripts/ut_table4.py                      # every row (about 4 CPU-hours)
    python scripts/ut_table4.py --only transformer universal_transformer
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from data_prep.embedded import data_dir
from recurnmt.cli import UserError, entry_point
from recurnmt.experiments.artifacts import write_json
from recurnmt.experiments.commands import train_command
from recurnmt.experiments.experiment import recipe_flags, size_flags
from recurnmt.experiments.fairseq_log import log_records
from recurnmt.nmt.quiet import quiet_env

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
PROG = "python scripts/ut_table4.py"
VOCAB = 4000
SIZE = SimpleNamespace(embed_dim=128, ffn_dim=512, heads=4, levels=6, pre_ln=False)
RECIPE = dict(
    dropout=0.1, lr=1e-3, lr_scheduler="inverse_sqrt", warmup=400, max_tokens=4096, nproc=1,
    seed=1,
)  # fmt: skip
PRE_LN = ("--encoder-normalize-before", "--decoder-normalize-before")
NO_COORDINATE = ("--level-signal", "none", "--positions", "input")


@dataclass(frozen=True)
class Row:
    """One run: ``name`` (its folder), what it is, its architecture, updates and own flags."""

    name: str
    label: str
    arch: str
    updates: int = 800
    flags: tuple[str, ...] = field(default=())


ROWS = (
    Row("transformer", "fairseq `transformer`", "transformer"),
    Row("ringformer", "`ringformer`", "ringformer"),
    Row("universal_transformer", "`universal_transformer` (UT sec. 2.1, post-LN)", "universal_transformer"),
    Row("ut_pre_ln", "`universal_transformer`, pre-LN (the UT's tensor2tensor code)", "universal_transformer", flags=PRE_LN),
    Row("ut_coordinate_0.25", "UT, `--coordinate-scale 0.25`", "universal_transformer", 300, ("--coordinate-scale", "0.25")),
    Row("ut_per_level_norms", "UT, `--layer-norms per-level`", "universal_transformer", 300, ("--layer-norms", "per-level")),
    Row("shared", "one shared block, no coordinate embedding", "universal_transformer", 300, NO_COORDINATE),
    Row("shared_lr3e-4", "one shared block, no coordinate embedding, lr 3e-4", "universal_transformer", 300, (*NO_COORDINATE, "--lr", "3e-4")),
)  # fmt: skip


def command(row: Row, data: Path, out: Path) -> list[str]:
    """The ``fairseq-train`` command line of ``row``."""
    recipe = recipe_flags(SimpleNamespace(**RECIPE, max_update=row.updates))
    own = ["--num-workers", "0", "--no-save", "--save-dir", str(out / "checkpoints")]
    own += ["--log-format", "json", "--log-interval", "50", "--cpu", "--data-buffer-size", "0"]
    return train_command(data, row.arch, [*size_flags(SIZE), *recipe, *own, *row.flags])


def finished(log: Path) -> bool:
    return log.exists() and "done training" in log.read_text(encoding="utf-8", errors="replace")


def run_all(rows: list[Row], data: Path, out: Path, jobs: int, fresh: bool) -> None:
    """Runs the rows that have no finished log, ``jobs`` at a time (one thread each)."""
    todo = [r for r in rows if fresh or not finished(out / r.name / "train.log")]
    env = quiet_env(dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1"))
    env["PYTHONHASHSEED"] = "0"
    running: list[tuple[Row, subprocess.Popen, Any]] = []
    while todo or running:
        while todo and len(running) < jobs:
            row = todo.pop(0)
            (out / row.name).mkdir(parents=True, exist_ok=True)
            log = (out / row.name / "train.log").open("w", encoding="utf-8")
            cmd = command(row, data, out / row.name)
            print(f"[{row.name}] {row.updates} updates ...", flush=True)
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
            running.append((row, proc, log))
        time.sleep(5)
        for item in list(running):
            row, proc, log = item
            if proc.poll() is not None:
                log.close()
                running.remove(item)
                if proc.returncode:
                    raise UserError(f"[{row.name}] fairseq-train failed (log: {log.name})")
                print(f"[{row.name}] done", flush=True)


def read(row: Row, out: Path) -> dict[str, Any]:
    """The run's training curve and validation perplexities, from its log."""
    log = out / row.name / "train.log"
    curve = [(int(r["num_updates"]), float(r["ppl"])) for r in log_records(log, "train_inner")]
    valid = [float(r["ppl"]) for r in log_records(log, "valid")]
    return {"name": row.name, "label": row.label, "updates": row.updates, "train": curve,
            "valid": valid}  # fmt: skip


def markdown(results: list[dict[str, Any]], rows: list[Row], data: Path, out: Path) -> str:
    """The table, the setting and every command."""
    base = next((r["valid"][-1] for r in results if r["name"] == "transformer"), None)
    epochs = max(len(r["valid"]) for r in results)
    heads = " | ".join(f"epoch {i + 1}" for i in range(epochs - 1))
    lines = [
        "# The Universal Transformer at RingFormer's Table 4 setting",
        "",
        f"Written by `{PROG}`. Data: `{data.relative_to(ROOT)}` (the embedded LibreOffice-help "
        f"German -> English corpus, a joint {VOCAB:,}-piece sentencepiece vocabulary; 231 "
        "updates make an epoch). Every run: H=128, FF=512, 4 heads, 6 levels per side, "
        "post-LN unless said, shared embeddings, Adam (0.9, 0.98) at lr 1e-3 after 400 "
        "inverse-sqrt warm-up updates, clip 1.0, dropout 0.1, label smoothing 0.1, 4,096 "
        "tokens a batch, seed 1; one `fairseq-train` process on one CPU thread each.",
        "",
        "Validation perplexity after every epoch and at the last update (fairseq validates at "
        "the end of each epoch and of training):",
        "",
        f"| model | updates | {heads} | last | / transformer |",
        "| --- | --- | " + "--- | " * (epochs - 1) + "--- | --- |",
    ]
    for r in results:
        cells = [f"{v:.1f}" for v in r["valid"][:-1]] + ["-"] * (epochs - len(r["valid"]))
        ratio = f"{r['valid'][-1] / base:.2f}" if base and r["updates"] == 800 else "-"
        lines.append(
            f"| {r['label']} | {r['updates']} | {' | '.join(cells)} | {r['valid'][-1]:.1f} "
            f"| {ratio} |"
        )
    lines += ["", "![training perplexity against updates](ut_table4.png)", "", "Commands:", ""]
    for row in rows:
        cmd = command(row, data.relative_to(ROOT), out / row.name)
        cmd = shlex.join(["fairseq-train", *cmd[1:]]).replace(f"{ROOT}/", "")
        lines.append(f"- {row.name}: `{cmd}`")
    return "\n".join(lines) + "\n"


def plot(results: list[dict[str, Any]], path: Path) -> None:
    """Training perplexity (log scale) against updates, one line per run."""
    from matplotlib.figure import Figure  # no pyplot: no global backend state

    fig = Figure(figsize=(7, 4.2), dpi=120)
    ax = fig.add_subplot()
    for r in results:
        updates, ppl = zip(*r["train"], strict=True)
        ax.plot(updates, ppl, marker=".", label=r["label"].replace("`", ""))
    ax.set_yscale("log")
    ax.set_xlabel("updates")
    ax.set_ylabel("training perplexity (label-smoothed)")
    ax.set_title("Table 4 setting on the embedded corpus: who leaves the plateau")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    names = [r.name for r in ROWS]
    parser.add_argument("--only", nargs="+", choices=names, help="these rows (default: all)")
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time (one thread each)")
    parser.add_argument("--out", type=Path, default=Path("work/ut_table4"), help="runs")
    parser.add_argument("--doc", type=Path, default=Path("docs/ut_table4.md"))
    parser.add_argument("--fresh", action="store_true", help="rerun finished runs")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.jobs < 1:
        raise UserError(f"--jobs must be at least 1, got {args.jobs}")
    rows = [r for r in ROWS if not args.only or r.name in args.only]
    data = ROOT / data_dir(VOCAB)
    if not (data / "dict.en.txt").exists():
        prep = [str(BIN / "python"), "-m", "data_prep.embedded", "prepare"]
        prep += ["--vocab-size", str(VOCAB), "--out", str(data)]
        subprocess.run(prep, cwd=ROOT, env=quiet_env(dict(os.environ)), check=True)
    out = ROOT / args.out
    run_all(rows, data, out, args.jobs, args.fresh)
    results = [read(row, out) for row in rows]
    doc = ROOT / args.doc
    doc.parent.mkdir(parents=True, exist_ok=True)
    plot(results, doc.with_suffix(".png"))
    doc.write_text(markdown(results, rows, data, args.out), encoding="utf-8")
    write_json(doc.with_suffix(".json"), results, indent=1)
    print(f"wrote {args.doc} (and .json, .png)")


if __name__ == "__main__":
    sys.exit(entry_point(main, PROG)())
