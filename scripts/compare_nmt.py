"""The translation families compared on real text: same size, budget, seed and recipe.

Trains fairseq's ``transformer`` and recurnmt's ``ringformer``, ``universal_transformer``,
``owf`` and ``sret`` on the embedded German-English corpus with one ``fairseq-train`` recipe
at RingFormer's Table 4 size by default (H=128, FF=512, 6 levels, 8 heads, Adam at lr 1e-3,
800 updates), pre-LN (``--no-pre-ln``: Table 4's post-LN, where the families that share one
block over every level have not left the unigram plateau after 800 updates of this warm-up,
``docs/ut_table4.md``), each in its own process; translates the test set with each (beam 4);
and writes a Markdown table (sacreBLEU, chrF, validation perplexity, P*, training time,
generation speed) and a BLEU-vs-P* plot. Finished runs are kept (``OUT/ARCH/result.json``)
and reused unless ``--fresh``; the table records the full settings.

Run from the repository root::

    python scripts/compare_nmt.py                       # Table 4 size, 800 updates
    python scripts/compare_nmt.py --max-update 300 --archs transformer ringformer
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from data_prep.embedded import data_dir
from recurnmt.cli import UserError, entry_point
from recurnmt.experiments.artifacts import write_json
from recurnmt.experiments.commands import generate_command, run_logged, train_command
from recurnmt.experiments.experiment import (
    SCHEDULES,
    add_recipe_arguments,
    add_size_arguments,
    decoding_flags,
    processes,
    recipe_flags,
    run_flags,
    size_flags,
)
from recurnmt.experiments.fairseq_log import train_stats, valid_ppl
from recurnmt.experiments.launch import cpu_train_command
from recurnmt.experiments.results import family_order, family_title
from recurnmt.nmt.quiet import quiet_env

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent

PROG = "python scripts/compare_nmt.py"
ARCHS = ("transformer", "ringformer", "universal_transformer", "owf", "sret")  # the default five


def p_star(arch: str, flags: list[str]) -> int:
    """P* (RingFormer Table 1) of ``arch`` built with ``flags``."""
    from recurnmt.nmt.build import build_model
    from recurnmt.parameters import parameter_report

    return parameter_report(build_model(arch, flags)[0]).p_star


def train_and_test(arch: str, args: argparse.Namespace, run_dir: Path) -> dict[str, Any]:
    """Trains ``arch``, translates the test set and scores it; writes ``result.json``."""
    import sacrebleu

    from recurnmt.experiments.scoring import read_hypotheses

    flags = [*size_flags(args, arch), *recipe_flags(args), *run_flags(run_dir / "checkpoints")]
    train = train_command(args.data, arch, flags, start=cpu_train_command(args.nproc))
    print(f"[{arch}] training {args.max_update} updates ...", flush=True)
    train_s = run_logged(train, run_dir / "train.log", cwd=ROOT)
    gen_out = run_dir / "generate-test.txt"
    checkpoint = run_dir / "checkpoints" / "checkpoint_last.pt"
    generate = generate_command(args.data, checkpoint, decoding_flags(args.beam, args.lenpen))
    print(f"[{arch}] translating the test set ...", flush=True)
    gen_s = run_logged(generate, run_dir / "generate.log", stdout=gen_out, cwd=ROOT)
    hyps = read_hypotheses(gen_out.read_text(encoding="utf-8").splitlines(), "D")
    refs = (ROOT / args.data / "test.raw.en").read_text(encoding="utf-8").splitlines()
    bleu = sacrebleu.metrics.BLEU()
    chrf = sacrebleu.metrics.CHRF()
    bleu_score, chrf_score = bleu.corpus_score(hyps, [refs]), chrf.corpus_score(hyps, [refs])
    result = {
        "arch": arch,
        "p_star": p_star(arch, size_flags(args, arch) + ["--share-all-embeddings"]),
        "bleu": round(bleu_score.score, 2),
        "bleu_text": str(bleu_score),
        "bleu_signature": str(bleu.get_signature()),
        "chrf": round(chrf_score.score, 2),
        "chrf_signature": str(chrf.get_signature()),
        "valid_ppl": valid_ppl(run_dir / "train.log"),
        "train": train_stats(run_dir / "train.log"),
        "train_seconds": round(train_s, 1),
        "test_sentences": len(refs),
        "generate_seconds": round(gen_s, 1),
        "sentences_per_second": round(len(refs) / gen_s, 1),
        "train_command": shlex.join(train),
        "generate_command": shlex.join(generate),
    }
    (run_dir / "result.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(
        f"[{arch}] BLEU {result['bleu']:.2f}, valid ppl {result['valid_ppl']}, "
        f"{train_s / 60:.1f} min training",
        flush=True,
    )
    return result


def markdown(results: list[dict[str, Any]], args: argparse.Namespace, plot: Path) -> str:
    """The comparison table and its settings, as Markdown."""
    size = f"H={args.embed_dim}, FF={args.ffn_dim}, {args.heads} heads"
    size += f", {args.levels} levels" if args.levels else ""
    lines = [
        "# The translation families on the embedded corpus",
        "",
        f"Written by `{shlex.join([*PROG.split(), *args.argv])}` (one run of every model).",
        "",
        f"Data: `{args.data}` (LibreOffice help, German -> English: 32,194 training pairs, "
        f"{results[0]['test_sentences']:,} test sentences; joint sentencepiece vocabulary of "
        f"{args.vocab_size or 8000:,} pieces{' learned on the training split' if args.vocab_size else ''}"
        f"). Every model: {size}, "
        f"{'pre' if args.pre_ln else 'post'}-LN, shared embeddings, Adam (0.9, 0.98), "
        f"lr {args.lr} with {SCHEDULES[args.lr_scheduler]} after {args.warmup} warm-up "
        f"updates, dropout {args.dropout}, label smoothing 0.1, {args.max_update} updates of "
        f"{args.max_tokens} tokens, seed {args.seed}, {processes(args.nproc)} on this "
        f"machine's {os.cpu_count()} CPU cores. Test set translated "
        f"with beam {args.beam}, length penalty {args.lenpen}; detokenized sacreBLEU and chrF "
        f"against the raw references ({results[0]['bleu_signature']}). P* counts every "
        "parameter except the token embeddings and the vocabulary head (RingFormer Table 1).",
        "",
        "| model | `--arch` | P* | sacreBLEU | chrF | valid ppl | train ppl (last) "
        "| training | generation |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]

    def num(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    for r in results:
        lines.append(
            f"| {family_title(r['arch'])} | `{r['arch']}` | {r['p_star'] / 1e6:.2f}M "
            f"| {r['bleu']:.2f} | {r['chrf']:.2f} | {num(r['valid_ppl'])} "
            f"| {num(r['train'].get('ppl'))} | {r['train_seconds'] / 60:.1f} min "
            f"| {r['sentences_per_second']:.1f} sent/s |"
        )
    lines += [
        "",
        "Training and generation times are wall-clock, each model's own, and move with whatever "
        "else the machine runs meanwhile; speed is compared by `scripts/benchmark_nmt.py`, "
        "which times every model on the same batches, the models taking turns.",
        "",
        f"![sacreBLEU against P*]({plot.name})",
        "",
    ]
    return "\n".join(lines)


def plot_bleu_vs_pstar(results: list[dict[str, Any]], path: Path) -> None:
    """A scatter plot of sacreBLEU against P*, one labelled point per model."""
    from matplotlib.figure import Figure  # no pyplot: no global backend state

    fig = Figure(figsize=(6, 4), dpi=120)
    ax = fig.add_subplot()
    for r in results:
        x = r["p_star"] / 1e6
        ax.scatter([x], [r["bleu"]], s=36)
        ax.annotate(
            family_title(r["arch"]),
            (x, r["bleu"]),
            xytext=(5, 4),
            fontsize=8,
            textcoords="offset points",
        )
    ax.margins(x=0.3, y=0.15)  # room for the labels right of the outermost points
    ax.set_xlabel("P* (millions of parameters, embeddings and head excluded)")
    ax.set_ylabel("sacreBLEU (test)")
    ax.set_title("Translation families on the embedded de-en corpus")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)


def build_parser() -> argparse.ArgumentParser:
    """The command line; its defaults are RingFormer's Table 4 setting."""
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--archs", nargs="+", default=list(ARCHS), choices=family_order())
    parser.add_argument(
        "--data",
        help="prepared corpus (default: data-bin/lohelp_de_en[_spmN], prepared when missing)",
    )
    parser.add_argument(
        "--vocab-size",
        type=int,
        help="sentencepiece vocabulary learned on the training split (default: shipped 8,000)",
    )
    parser.add_argument(
        "--nproc", type=int, default=1, help="data-parallel CPU processes per model (gloo)"
    )
    parser.add_argument("--out", type=Path, default=Path("work/compare_nmt"), help="runs")
    parser.add_argument("--doc", type=Path, default=Path("docs/compare_nmt.md"))
    add_size_arguments(
        parser,
        levels_help="levels per side (0: each family's default)",
        pre_ln_help="layer norms before each sub-layer (default), as the demo and the UT's own "
        "code; --no-pre-ln is Table 4's post-LN, where one block shared by every level stays "
        "on the unigram plateau for hundreds of updates at this warm-up (docs/ut_table4.md)",
        pre_ln=True,
    )
    add_recipe_arguments(parser)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--lenpen", type=float, default=1.0)
    parser.add_argument("--fresh", action="store_true", help="retrain finished runs")
    return parser


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv

    from recurnmt.nmt.build import check_arch

    for arch in args.archs:
        check_arch(arch)
    if args.nproc < 1:
        raise UserError(f"--nproc must be at least 1, got {args.nproc}")
    if args.max_tokens % args.nproc:
        raise UserError(
            f"--max-tokens {args.max_tokens} must split evenly over --nproc {args.nproc}"
        )
    args.data = args.data or str(data_dir(args.vocab_size))
    data = ROOT / args.data
    if not (data / "dict.en.txt").exists():
        prep = [str(BIN / "python"), "-m", "data_prep.embedded", "prepare", "--out", args.data]
        prep += ["--vocab-size", str(args.vocab_size)] if args.vocab_size else []
        subprocess.run(prep, cwd=ROOT, env=quiet_env(dict(os.environ)), check=True)
    os.environ.setdefault("PYTHONHASHSEED", "0")

    results = []
    for arch in args.archs:
        run_dir = ROOT / args.out / arch
        done = run_dir / "result.json"
        if done.exists() and not args.fresh:
            print(f"[{arch}] reusing {done.relative_to(ROOT)}", flush=True)
            results.append(json.loads(done.read_text(encoding="utf-8")))
            continue
        if run_dir.exists():
            import shutil

            shutil.rmtree(run_dir)
        run_dir.mkdir(parents=True)
        results.append(train_and_test(arch, args, run_dir))

    doc = ROOT / args.doc
    doc.parent.mkdir(parents=True, exist_ok=True)
    plot = doc.with_suffix(".png")
    plot_bleu_vs_pstar(results, plot)
    doc.write_text(markdown(results, args, plot), encoding="utf-8")
    write_json(doc.with_suffix(".json"), results)
    print(f"wrote {doc.relative_to(ROOT)}, {plot.relative_to(ROOT)}")


if __name__ == "__main__":
    sys.exit(entry_point(main, PROG)())
