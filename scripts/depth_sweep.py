"""Quality against the number of levels run at inference, trained with and without mixed depth.

Elastic depth: a weight-shared model trained at N levels runs at K levels
(``fairseq-generate --model-overrides "{'encoder_levels': K, 'decoder_levels': K}"``,
``python -m recurnmt.vision.training.evaluate --encoder-levels K``). This script trains one model plainly and
one with SReT's mixed-depth training (appendix B: the loss of the shallow branch, every block
once, is added), same seed and budget, and scores both at K = 1 ... ``--max-levels``:

* ``nmt``: RingFormers (``--arch``) on the embedded German-English corpus with
  ``fairseq-train`` (``--mixed-depth on`` for one; size and recipe flags as
  ``scripts/compare_nmt.py``), the test set translated at every K (beam 4), detokenized
  sacreBLEU against the raw references;
* ``vision``: RingFormer-ViTs (``--model``) on the digits with ``python -m
  recurnmt.vision.training.train`` (``--mixed-depth`` for one), top-1 on the digits' evaluation half
  with ``python -m recurnmt.vision.training.evaluate --encoder-levels K``, and its multiply-accumulates.

A depth that a model does not define is asked of the model before anything runs and shown as
refused, with the model's reason (RingFormer's level signals and norms are learned for its N
levels only, so K > N is refused; a Universal Transformer, ``--arch universal_transformer``
or ``--model uit_mini_patch4``, runs deeper too). Writes ``DOC_DIR/depth_sweep_TASK.md``
(table and settings), ``.png`` (the plot) and ``.json``. Finished trainings are kept
(``OUT/TASK/{plain,mixed}/result.json``) and reused unless ``--fresh``, with the scores
already measured; flags after ``--`` go to the training command.

Run from the repository root, one command per task::

    python scripts/depth_sweep.py nmt       # 6 levels, H=128, 800 updates of 4,096 tokens
    python scripts/depth_sweep.py vision    # ringformer_vit_mini_patch4, 60 digits epochs
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from recurnmt.cli import entry_point, split_extra_args
from recurnmt.experiments.artifacts import write_json
from recurnmt.experiments.commands import generate_command, run_logged, train_command
from recurnmt.experiments.experiment import (
    add_recipe_arguments,
    add_size_arguments,
    decoding_flags,
    recipe_flags,
    run_flags,
    size_flags,
)
from recurnmt.experiments.launch import cpu_train_command

ROOT = Path(__file__).resolve().parent.parent

PROG = "python scripts/depth_sweep.py"
VARIANTS = {"plain": "trained without mixed depth", "mixed": "trained with mixed depth"}
METRIC = {"nmt": "sacreBLEU (test)", "vision": "top-1 % (digits, evaluation half)"}

Score = dict[str, Any]  # {"score": float, ...} or {"refused": reason}


# ---------------------------------------------------------------- translation


def nmt_train(args: argparse.Namespace, variant: str, run_dir: Path) -> dict[str, Any]:
    """Trains one translation model; returns its command, wall seconds and checkpoint."""
    flags = [*size_flags(args, args.arch), *recipe_flags(args)]
    flags += ["--mixed-depth", "on" if variant == "mixed" else "off"]
    flags += [*run_flags(run_dir / "checkpoints"), *args.extra]
    cmd = train_command(args.data, args.arch, flags, start=cpu_train_command(args.nproc))
    seconds = run_logged(cmd, run_dir / "train.log", cwd=ROOT)
    checkpoint = run_dir / "checkpoints" / "checkpoint_last.pt"
    return {"command": shlex.join(cmd), "seconds": round(seconds, 1), "checkpoint": str(checkpoint)}


def nmt_refusal(checkpoint: str, depth: int) -> str | None:
    """Why the translation model refuses ``depth`` levels (None: it runs them)."""
    from fairseq import checkpoint_utils

    import recurnmt.nmt  # noqa: F401  (the plugin, and its safe checkpoint loading)
    from recurnmt.modules import ConfigError

    overrides = {"encoder_levels": depth, "decoder_levels": depth}
    try:
        checkpoint_utils.load_model_ensemble([checkpoint], arg_overrides=overrides)
    except ConfigError as err:
        return str(err)
    return None


def nmt_score(args: argparse.Namespace, checkpoint: str, depth: int, run_dir: Path) -> Score:
    """sacreBLEU of the test set translated at ``depth`` levels."""
    from recurnmt.experiments.scoring import score

    levels = f"{{'encoder_levels': {depth}, 'decoder_levels': {depth}}}"
    flags = [*decoding_flags(args.beam, lenpen=1.0), "--model-overrides", levels]
    cmd = generate_command(args.data, Path(checkpoint), flags)
    out = run_dir / f"generate-test-K{depth}.txt"
    seconds = run_logged(cmd, run_dir / f"generate-K{depth}.log", stdout=out, cwd=ROOT)
    refs = (Path(args.data) / "test.raw.en").read_text(encoding="utf-8").splitlines()
    result, _ = score(out.read_text(encoding="utf-8").splitlines(), refs)
    bleu = result["sacrebleu"]
    return {"score": bleu["score"], "signature": bleu["signature"], "seconds": round(seconds, 1)}


# ---------------------------------------------------------------- images


def vision_train(args: argparse.Namespace, variant: str, run_dir: Path) -> dict[str, Any]:
    """Trains one image model; returns its command, wall seconds and checkpoint."""
    cmd = [sys.executable, "-m", "recurnmt.vision.training.train", "--model", args.model]
    cmd += ["--data", "digits", "--epochs", str(args.epochs), "--seed", str(args.seed)]
    cmd += ["--output", str(run_dir), "--no-progress", "--no-tensorboard"]
    cmd += ["--threads", str(args.threads)]
    cmd += [*(["--mixed-depth"] if variant == "mixed" else []), *args.extra]
    seconds = run_logged(cmd, run_dir / "train.log", cwd=ROOT)
    checkpoint = run_dir / "checkpoint.pt"  # the last epoch (best.pt is chosen on this data)
    return {"command": shlex.join(cmd), "seconds": round(seconds, 1), "checkpoint": str(checkpoint)}


def _vision_model(checkpoint: str):
    from recurnmt.vision.checkpoint import load_checkpoint, model_from_checkpoint

    return model_from_checkpoint(load_checkpoint(checkpoint))


def vision_depth(checkpoint: str) -> int:
    """The levels the image model was built with (all its stacks together)."""
    from recurnmt.modules import RecurrentStack

    model = _vision_model(checkpoint)
    return sum(m.num_levels for m in model.modules() if isinstance(m, RecurrentStack))


def vision_refusal(checkpoint: str, depth: int) -> str | None:
    """Why the image model refuses ``depth`` levels (None: it runs them)."""
    from recurnmt.modules import ConfigError

    model = _vision_model(checkpoint)
    if not hasattr(model, "set_depth"):
        return f"a {type(model).__name__} has no elastic depth"
    try:
        model.set_depth(depth)
    except ConfigError as err:
        return str(err.renamed({"levels": "--encoder-levels"}))
    return None


def vision_score(args: argparse.Namespace, checkpoint: str, depth: int, run_dir: Path) -> Score:
    """Top-1 accuracy (and MACs per image) at ``depth`` levels."""
    cmd = [
        sys.executable,
        "-m",
        "recurnmt.vision.training.evaluate",
        checkpoint,
        "--encoder-levels",
        str(depth),
    ]
    out = run_dir / f"evaluate-K{depth}.json"
    seconds = run_logged([*cmd, "--json"], run_dir / f"evaluate-K{depth}.log", stdout=out, cwd=ROOT)
    report = json.loads(out.read_text(encoding="utf-8").strip().splitlines()[-1])
    macs = round(1e3 * report["GMACs"], 3)
    return {"score": report["top1"], "MMACs": macs, "seconds": round(seconds, 1)}


# ---------------------------------------------------------------- the sweep


def trained(args: argparse.Namespace, variant: str) -> dict[str, Any]:
    """Trains one variant, or reuses its finished run (with the scores it has)."""
    train, depth_of, _, _ = TASKS[args.task]
    run_dir = ROOT / args.out / args.task / variant
    done = run_dir / "result.json"
    if done.exists() and not args.fresh:
        print(f"[{variant}] reusing {done}", flush=True)
        return json.loads(done.read_text(encoding="utf-8"))
    if run_dir.exists():
        import shutil

        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    print(f"[{variant}] training ({VARIANTS[variant]}) ...", flush=True)
    result = {"variant": variant, "train": train(args, variant, run_dir), "scores": {}}
    result["trained_levels"] = depth_of(args, result["train"]["checkpoint"])
    done.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return result


def score_depths(args: argparse.Namespace, result: dict[str, Any], max_levels: int) -> None:
    """Scores ``result``'s model at every K <= ``max_levels`` not scored yet (or records
    the model's refusal), saving after each."""
    _, _, refusal, score = TASKS[args.task]
    run_dir = ROOT / args.out / args.task / result["variant"]
    checkpoint = result["train"]["checkpoint"]
    for depth in range(1, max_levels + 1):
        if str(depth) in result["scores"]:
            continue
        reason = refusal(checkpoint, depth)
        if reason is None:
            print(f"[{result['variant']}] scoring at {depth} levels ...", flush=True)
            result["scores"][str(depth)] = score(args, checkpoint, depth, run_dir)
        else:
            result["scores"][str(depth)] = {"refused": reason}
        (run_dir / "result.json").write_text(json.dumps(result, indent=2) + "\n", "utf-8")


TASKS: dict[str, tuple[Callable, Callable, Callable, Callable]] = {
    "nmt": (nmt_train, lambda args, ckpt: args.levels, nmt_refusal, nmt_score),
    "vision": (vision_train, lambda args, ckpt: vision_depth(ckpt), vision_refusal, vision_score),
}


def markdown(task: str, results: dict[str, dict], max_levels: int, command: str, plot: str) -> str:
    """The table of scores against levels, with its settings and the refusal reasons.

    Args:
        task: ``nmt`` or ``vision``.
        results: per variant (``plain``, ``mixed``), as :func:`sweep_variant` returns.
        max_levels: the deepest K scored.
        command: the command line that wrote it.
        plot: the PNG's file name, linked under the table.
    """
    trained = {r["trained_levels"] for r in results.values()}
    lines = [
        f"# {METRIC[task]} against the levels run at inference ({task})",
        "",
        f"Written by `{command}`. Each model is trained at {'/'.join(map(str, sorted(trained)))} "
        "levels, then run at K levels (elastic depth); *mixed depth* adds the loss of the "
        "shallow branch (every block once) in training (SReT appendix B).",
        "",
        "| levels K | " + " | ".join(VARIANTS[v] for v in results) + " |",
        "| --- | " + " | ".join("---" for _ in results) + " |",
    ]
    reasons: list[str] = []
    for depth in range(1, max_levels + 1):
        cells = []
        for r in results.values():
            s = r["scores"].get(str(depth))
            if s is None:
                cells.append("-")
            elif "refused" in s:
                if s["refused"] not in reasons:
                    reasons.append(s["refused"])
                cells.append(f"refused [{reasons.index(s['refused']) + 1}]")
            else:
                extra = f" ({s['MMACs']:.2f} MMACs)" if "MMACs" in s else ""
                cells.append(f"{s['score']:.2f}{extra}")
        mark = " (trained)" if depth in trained else ""
        lines.append(f"| {depth}{mark} | " + " | ".join(cells) + " |")
    if reasons:
        lines += [""] + [f"[{i}] {reason}" for i, reason in enumerate(reasons, 1)]
    lines += ["", "Training commands:", ""]
    lines += [f"- {v}: `{r['train']['command']}`" for v, r in results.items()]
    lines += ["", f"![{METRIC[task]} against levels]({plot})", ""]
    return "\n".join(lines)


def plot_sweep(task: str, results: dict[str, dict], path: Path) -> None:
    """Scores against K, one line per variant, a dotted line at the trained depth."""
    from matplotlib.figure import Figure  # no pyplot: no global backend state (Agg)

    fig = Figure(figsize=(6, 4), dpi=120)
    ax = fig.add_subplot()
    for variant, r in results.items():
        points = sorted((int(k), s["score"]) for k, s in r["scores"].items() if "score" in s)
        if points:
            ax.plot(*zip(*points, strict=True), marker="o", label=VARIANTS[variant])
    for depth in sorted({r["trained_levels"] for r in results.values()}):
        ax.axvline(depth, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("levels run at inference (K)")
    ax.set_ylabel(METRIC[task])
    ax.set_title(f"Elastic depth ({task}); dotted: trained depth", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("task", choices=sorted(TASKS))
    parser.add_argument("--out", type=Path, default=Path("work/depth_sweep"), help="runs")
    parser.add_argument("--doc-dir", type=Path, default=Path("docs"))
    parser.add_argument(
        "--max-levels", type=int, help="score K = 1 ... this (default: twice the trained depth)"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--fresh", action="store_true", help="retrain finished runs")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="CPU threads of every training and evaluation command (OMP_NUM_THREADS; "
        "default 1, as the demo's measured runs)",
    )
    g = parser.add_argument_group("nmt (size and recipe as scripts/compare_nmt.py)")
    g.add_argument("--arch", default="ringformer")
    g.add_argument("--data", default="data-bin/lohelp_de_en")
    add_size_arguments(g, levels_help="levels per side in training")
    add_recipe_arguments(g)
    g.add_argument(
        "--nproc", type=int, default=1, help="data-parallel CPU processes per model (gloo)"
    )
    g.add_argument("--beam", type=int, default=4)
    g = parser.add_argument_group("vision")
    g.add_argument("--model", default="ringformer_vit_mini_patch4")
    g.add_argument("--epochs", type=int, default=60)
    return parser


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    own, extra = split_extra_args(argv)
    parser = build_parser()
    args = parser.parse_args(own)
    args.extra = extra
    if args.threads < 1:
        parser.error(f"--threads {args.threads}: at least 1")
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # inherited by every command run
    if args.max_levels is not None and args.max_levels < 1:
        parser.error(f"--max-levels {args.max_levels}: at least 1")
    if args.task == "nmt":
        from recurnmt.nmt.build import check_arch

        if args.levels < 1:
            parser.error(f"--levels {args.levels}: at least 1")
        if args.nproc < 1 or args.max_tokens % args.nproc:
            parser.error(f"--nproc {args.nproc}: at least 1, dividing --max-tokens evenly")

        check_arch(args.arch)
        if not (ROOT / args.data / "test.raw.en").exists():
            parser.error(
                f"--data {args.data}: no prepared corpus with test.raw.en "
                "(python -m data_prep.embedded prepare --out data-bin/lohelp_de_en)"
            )
        args.data = str(ROOT / args.data)
    else:
        from recurnmt.vision import list_models

        if args.model not in list_models():
            parser.error(f"--model {args.model}: not a registered image model")

    results = {variant: trained(args, variant) for variant in VARIANTS}
    max_levels = args.max_levels or 2 * max(r["trained_levels"] for r in results.values())
    for result in results.values():
        score_depths(args, result, max_levels)
    doc_dir = ROOT / args.doc_dir
    doc_dir.mkdir(parents=True, exist_ok=True)
    doc = doc_dir / f"depth_sweep_{args.task}.md"
    plot = doc.with_suffix(".png")
    plot_sweep(args.task, results, plot)
    command = shlex.join([*PROG.split(), *argv])
    doc.write_text(markdown(args.task, results, max_levels, command, plot.name), "utf-8")
    write_json(doc.with_suffix(".json"), results)
    print(doc.read_text(encoding="utf-8"))
    print(f"wrote {doc}, {plot}")


if __name__ == "__main__":
    sys.exit(entry_point(main, PROG)())
