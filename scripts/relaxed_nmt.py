"""Relaxed recursion on real text: a trained transformer converted into relaxed recursive
models, against the same models trained from scratch (Relaxed Recursive Transformers, Bae et
al., ICLR 2025).

On the embedded German-English corpus (prepared with a learned 4,000-piece vocabulary when
missing), each step a real command with its log in its run directory:

1. the teacher: fairseq's ``transformer`` trained with the demo's recipe
   (``scripts/demo_nmt.py``: H=128, FF=512, 4 heads, 3 levels, pre-LN, shared embeddings,
   Adam (0.9, 0.98) at lr 3e-3 after 200 warm-up updates, decayed linearly to 0, no dropout,
   label smoothing 0.1, 2,048 tokens per update over 2 processes, 1,400 updates, seed 1);
2. for M unique blocks per side (1 and 2) and LoRA rank r (0, 8 and 32): ``recurnmt-convert``
   (``--init stepwise``, cycle sharing, per-level norms), evaluated as converted; then
   fine-tuned for ``--finetune-updates`` with the same recipe (``fairseq-train
   --finetune-from-model``) and evaluated again;
3. the same relaxed architecture trained from scratch for the teacher's and the fine-tuning's
   updates together, evaluated;

and writes ``docs/relaxed_nmt.md`` (model, P*, sacreBLEU, chrF, validation perplexity,
updates; and whether the converted models beat the ones trained from scratch at equal total
updates, from the numbers), ``docs/relaxed_nmt.png`` (sacreBLEU against P*) and
``docs/relaxed_nmt.json``. Every model is evaluated alike: ``fairseq-generate`` on the test set
(beam 4, length penalty 1.5, sentencepiece removed; detokenized sacreBLEU and chrF against
the raw references) and ``fairseq-validate`` on the validation set. Finished runs are reused
(``OUT/RUN/result.json``, while their settings are unchanged) unless ``--fresh``.

``--distill``: sequence-level knowledge distillation (Kim & Rush 2016): the teacher's beam
translations of the training set replace its targets for fine-tuning and for training from
scratch (validation and test stay the real ones).

Run from the repository root::

    python scripts/relaxed_nmt.py                    # the full experiment (hours on 2 cores)
    python scripts/relaxed_nmt.py --unique 1 --ranks 8 --finetune-updates 300
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

from data_prep.embedded import data_dir
from recurnmt.cli import UserError, entry_point
from recurnmt.runs.artifacts import write_json
from recurnmt.runs.commands import (
    fairseq_tool,
    generate_command,
    run_logged,
    train_command,
    user_dir,
)
from recurnmt.runs.experiment import (
    decoding_flags,
    processes,
    recipe_flags,
    run_flags,
    size_flags,
)
from recurnmt.runs.fairseq_log import valid_ppl
from recurnmt.runs.launch import cpu_train_command

PROG = "python scripts/relaxed_nmt.py"
TEACHER = "transformer"  # fairseq's own
RELAXED = "relaxed_transformer"
# the demo's recipe (scripts/demo_nmt.py, README "The demo")
DEMO = dict(
    embed_dim=128, ffn_dim=512, heads=4, levels=3, max_update=1400, max_tokens=2048, nproc=2,
    lr=3e-3, warmup=200, dropout=0.0, seed=1, beam=4, lenpen=1.5, vocab_size=4000,
)  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--data", help="prepared corpus (default: by --vocab-size, made if missing)")
    p.add_argument("--vocab-size", type=int, default=DEMO["vocab_size"])
    p.add_argument("--out", type=Path, default=Path("work/relaxed_nmt"), help="run directories")
    p.add_argument("--doc", type=Path, default=Path("docs/relaxed_nmt.md"))
    p.add_argument("--unique", type=int, nargs="+", default=[1, 2], help="blocks M per side")
    p.add_argument("--ranks", type=int, nargs="+", default=[0, 8, 32], help="LoRA ranks r")
    p.add_argument("--init", choices=("stepwise", "average", "lower"), default="stepwise")
    p.add_argument("--max-update", type=int, default=DEMO["max_update"], help="the teacher's")
    p.add_argument("--finetune-updates", type=int, default=700)
    p.add_argument("--distill", action="store_true", help="teacher translations as targets")
    for name in ("embed_dim", "ffn_dim", "heads", "levels", "max_tokens", "seed", "warmup"):
        p.add_argument("--" + name.replace("_", "-"), type=int, default=DEMO[name])
    for name in ("lr", "lenpen"):
        p.add_argument("--" + name, type=float, default=DEMO[name])
    p.add_argument("--beam", type=int, default=DEMO["beam"])
    p.add_argument("--nproc", type=int, default=min(DEMO["nproc"], os.cpu_count() or 1))
    p.add_argument("--fresh", action="store_true", help="redo finished runs")
    return p


def model_flags(args: argparse.Namespace) -> list[str]:
    """The demo's model size, pre-LN (both sides alike)."""
    return size_flags(argparse.Namespace(**vars(args), pre_ln=True))


def recipe(args: argparse.Namespace, updates: int) -> list[str]:
    """The demo's training recipe for ``updates`` updates (shared embeddings included)."""
    schedule = dict(lr_scheduler="polynomial_decay", max_update=updates, dropout=DEMO["dropout"])
    return recipe_flags(argparse.Namespace(**{**vars(args), **schedule}))


def relaxed_flags(unique: int, rank: int) -> list[str]:
    """The relaxed architecture's own flags (both sides alike)."""
    return [
        "--encoder-unique-layers", str(unique), "--decoder-unique-layers", str(unique),
        "--sharing-scheme", "cycle", "--level-lora-rank", str(rank), "--layer-norms", "per-level",
    ]  # fmt: skip


def p_star(arch: str, flags: list[str]) -> int:
    """P* (RingFormer Table 1: embeddings and head excluded) of ``arch`` with ``flags``."""
    from recurnmt.nmt.build import build_model
    from recurnmt.parameters import parameter_report

    return parameter_report(build_model(arch, [*flags, "--share-all-embeddings"])[0]).p_star


def languages(data: Path) -> tuple[str, str]:
    """The source and target language of a binarized corpus (``train.de-en.de.bin``)."""
    for path in sorted(data.glob("train.*-*.*.bin")):
        match = re.match(r"train\.(\w+)-(\w+)\.", path.name)
        if match:
            return match.group(1), match.group(2)
    raise UserError(f"{data} holds no binarized training set (train.SRC-TGT.*.bin)")


def evaluate(checkpoint: Path, run_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    """sacreBLEU and chrF on the test set, perplexity on the validation set."""
    import sacrebleu

    from recurnmt.runs.scoring import read_hypotheses

    out = run_dir / "generate-test.txt"
    gen = generate_command(args.data, checkpoint, decoding_flags(args.beam, args.lenpen))
    run_logged(gen, run_dir / "generate.log", stdout=out)
    hyps = read_hypotheses(out.read_text(encoding="utf-8").splitlines(), "D")
    refs = (args.data / f"test.raw.{args.langs[1]}").read_text(encoding="utf-8").splitlines()
    bleu, chrf = sacrebleu.metrics.BLEU(), sacrebleu.metrics.CHRF()
    validate = [
        *fairseq_tool("validate"), str(args.data), "--task", "translation",
        "--user-dir", str(user_dir()), "--path", str(checkpoint), "--valid-subset", "valid",
        "--max-tokens", "8000", "--cpu",
    ]  # fmt: skip
    run_logged(validate, run_dir / "validate.log")
    return {
        "bleu": round(bleu.corpus_score(hyps, [refs]).score, 2),
        "chrf": round(chrf.corpus_score(hyps, [refs]).score, 2),
        "valid_ppl": valid_ppl(run_dir / "validate.log"),
        "bleu_signature": str(bleu.get_signature()),
    }


def train(arch: str, flags: list[str], run_dir: Path, args, data: Path) -> Path:
    """Trains ``arch`` (``flags``: model, recipe and any --finetune-from-model) on ``data``."""
    save_dir = run_dir / "checkpoints"
    cmd = train_command(
        data, arch, [*flags, *run_flags(save_dir)], start=cpu_train_command(args.nproc)
    )
    run_logged(cmd, run_dir / "train.log")
    return run_dir / "checkpoints" / "checkpoint_last.pt"


def distilled(teacher: Path, args: argparse.Namespace) -> Path:
    """The corpus with the teacher's translations of the training set as targets (Kim & Rush
    2016, sequence-level distillation), binarized with the corpus's own dictionaries."""
    out = args.out / "distilled"
    stamp = json.dumps(settings(args), sort_keys=True)
    if (out / "done").exists() and (out / "done").read_text(encoding="utf-8") == stamp:
        return out
    shutil.rmtree(out, ignore_errors=True)
    (out / "text").mkdir(parents=True)
    src, tgt = args.langs
    extra = ["--gen-subset", "train", "--post-process", "none"]  # pieces, as binarized
    gen = generate_command(args.data, teacher, [*decoding_flags(args.beam, args.lenpen), *extra])
    run_logged(gen, out / "generate.log", stdout=out / "generate-train.txt")
    lines = (out / "generate-train.txt").read_text(encoding="utf-8").splitlines()
    pairs = {}
    for kind, side in (("S", src), ("H", tgt)):
        found = {}
        for line in lines:
            if line.startswith(f"{kind}-"):
                key, *_, text = line.split("\t")
                found[int(key[2:])] = text
        pairs[side] = [found[i] for i in sorted(found)]
    for side, text in pairs.items():
        (out / "text" / f"train.{side}").write_text("\n".join(text) + "\n", encoding="utf-8")
    run_logged(
        [
            *fairseq_tool("preprocess"),
            "--source-lang",
            src,
            "--target-lang",
            tgt,
            "--trainpref",
            str(out / "text" / "train"),
            "--destdir",
            str(out),
            "--srcdict",
            str(args.data / f"dict.{src}.txt"),
            "--tgtdict",
            str(args.data / f"dict.{tgt}.txt"),
            "--workers",
            "1",
        ],  # fmt: skip
        out / "preprocess.log",
    )
    for path in args.data.glob("valid.*"):
        shutil.copy(path, out / path.name)
    (out / "done").write_text(stamp, encoding="utf-8")
    print(f"[distilled] {len(pairs[src]):,} training pairs with the teacher's targets", flush=True)
    return out


def settings(args: argparse.Namespace) -> dict[str, Any]:
    """What a run's result depends on (a finished run is reused while these are unchanged)."""
    keys = ("embed_dim", "ffn_dim", "heads", "levels", "max_tokens", "seed", "warmup", "lr")
    keys += ("max_update", "finetune_updates", "init", "distill", "beam", "lenpen", "nproc")
    return {k: getattr(args, k) for k in keys} | {"data": str(args.data)}


# what the teacher does not depend on: it trains on the corpus itself, for --max-update
TEACHER_FREE = ("finetune_updates", "init", "distill")


def run(name: str, args, body, free: tuple[str, ...] = ()) -> dict[str, Any]:
    """``body(run_dir)``'s result, or the finished one of an earlier call with these settings
    (those named in ``free`` aside: a ``--distill`` experiment reuses the plain one's teacher
    when given the same ``--out``, or a copy of its teacher directory)."""
    run_dir = args.out / name
    done = run_dir / "result.json"
    if done.exists() and not args.fresh:
        result = json.loads(done.read_text(encoding="utf-8"))
        stored, wanted = result.get("settings") or {}, settings(args)
        if all(stored.get(k) == v for k, v in wanted.items() if k not in free):
            print(f"[{name}] reusing {done}", flush=True)
            return result
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    print(f"[{name}] ...", flush=True)
    result = {"run": name, **body(run_dir), "settings": settings(args)}
    done.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    ppl = result["valid_ppl"]
    print(f"[{name}] BLEU {result['bleu']:.2f}, chrF {result['chrf']:.2f}, valid ppl {ppl}")
    return result


def experiment(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every run of the experiment, in table order."""
    from recurnmt.nmt.convert import convert

    size = model_flags(args)
    teacher_ckpt = args.out / "teacher" / "checkpoints" / "checkpoint_last.pt"

    def teacher(run_dir: Path) -> dict[str, Any]:
        train(TEACHER, [*size, *recipe(args, args.max_update)], run_dir, args, args.data)
        found = evaluate(teacher_ckpt, run_dir, args)
        pstar = p_star(TEACHER, size)
        return {"kind": "teacher", "unique": args.levels, "rank": None, "p_star": pstar,
                "updates": args.max_update, **found}  # fmt: skip

    results = [run("teacher", args, teacher, free=TEACHER_FREE)]
    data = distilled(teacher_ckpt, args) if args.distill else args.data
    total = args.max_update + args.finetune_updates
    for m in args.unique:
        for r in args.ranks:
            flags = [*size, *relaxed_flags(m, r)]
            common = {"unique": m, "rank": r, "p_star": p_star(RELAXED, flags)}
            converted = args.out / f"m{m}-r{r}" / "converted" / "converted.pt"

            def before(run_dir: Path, m=m, r=r, converted=converted, common=common):
                convert(teacher_ckpt, converted, arch=RELAXED, encoder_unique_layers=m,
                        decoder_unique_layers=m, init=args.init, level_lora_rank=r,
                        layer_norms="per-level", force=True)  # fmt: skip
                found = evaluate(converted, run_dir, args)
                return {"kind": "converted", **common, "updates": args.max_update, **found}

            def tuned(run_dir: Path, flags=flags, converted=converted, common=common):
                tune = [*flags, *recipe(args, args.finetune_updates)]
                ckpt = train(RELAXED, [*tune, "--finetune-from-model", str(converted)],
                             run_dir, args, data)  # fmt: skip
                found = evaluate(ckpt, run_dir, args)
                return {"kind": "fine-tuned", **common, "updates": total, **found}

            def scratch(run_dir: Path, flags=flags, common=common):
                ckpt = train(RELAXED, [*flags, *recipe(args, total)], run_dir, args, data)
                found = evaluate(ckpt, run_dir, args)
                return {"kind": "from scratch", **common, "updates": total, **found}

            results.append(run(f"m{m}-r{r}/converted", args, before))
            results.append(run(f"m{m}-r{r}/finetuned", args, tuned))
            results.append(run(f"m{m}-r{r}/scratch", args, scratch))
    return results


def verdict(results: list[dict[str, Any]]) -> str:
    """Whether the converted, fine-tuned models beat the same ones trained from scratch at
    equal total updates, with the numbers (computed, never written by hand)."""

    def key(r: dict[str, Any]) -> tuple:
        return r["unique"], r["rank"]

    scratch = {key(r): r for r in results if r["kind"] == "from scratch"}
    pairs = [(r, scratch[key(r)]) for r in results if r["kind"] == "fine-tuned"]
    if not pairs:
        return "No relaxed model was trained."
    wins = sum(t["bleu"] > s["bleu"] for t, s in pairs)
    how = {len(pairs): "beat", 0: "did not beat"}.get(wins, "beat in part")
    detail = "; ".join(
        f"M={t['unique']}, r={t['rank']}: {t['bleu']:.2f} against {s['bleu']:.2f} "
        f"(chrF {t['chrf']:.2f} against {s['chrf']:.2f})"
        for t, s in pairs
    )
    return (
        f"At equal total updates ({pairs[0][0]['updates']:,}), the converted and fine-tuned "
        f"models {how} the same architectures trained from scratch: higher sacreBLEU in "
        f"{wins} of {len(pairs)} settings ({detail})."
    )


def markdown(results: list[dict[str, Any]], args: argparse.Namespace, plot: Path) -> str:
    """The results table, the verdict and the settings, as Markdown."""
    teacher = results[0]
    distill = " on the teacher's translations (sequence-level distillation)" if args.distill else ""
    lines = [
        "# Relaxed recursion on the embedded corpus",
        "",
        f"Written by `{shlex.join([*PROG.split(), *args.argv])}`. Teacher: fairseq's "
        f"`transformer` (H={args.embed_dim}, FF={args.ffn_dim}, {args.heads} heads, "
        f"{args.levels} levels, pre-LN, shared embeddings) trained with the demo's recipe "
        f"({args.max_update:,} updates of {args.max_tokens:,} tokens, Adam at lr {args.lr}, "
        f"{args.warmup} warm-up updates then linear decay, {processes(args.nproc)}, seed "
        f"{args.seed}). Relaxed models: `{RELAXED}` with M blocks per side looped in a cycle, "
        f"a rank-r LoRA and bias deltas per level, per-level norms; converted with "
        f"`recurnmt-convert --init {args.init}`, fine-tuned for {args.finetune_updates:,} "
        f"updates with the same recipe{distill}; the same architectures trained from scratch "
        f"for {args.max_update + args.finetune_updates:,} updates{distill}. Test set: beam {args.beam}, length penalty {args.lenpen}, detokenized "
        f"sacreBLEU ({teacher['bleu_signature']}) and chrF; perplexity on the validation set "
        "(`fairseq-validate`). P* excludes the embeddings and the head (RingFormer Table 1).",
        "",
        "| model | M | r | P* | sacreBLEU | chrF | valid ppl | updates |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        ppl = "-" if r["valid_ppl"] is None else f"{r['valid_ppl']:.2f}"
        lines.append(
            f"| {r['kind']} | {r['unique']} | {'-' if r['rank'] is None else r['rank']} "
            f"| {r['p_star'] / 1e6:.3f}M | {r['bleu']:.2f} | {r['chrf']:.2f} | {ppl} "
            f"| {r['updates']:,} |"
        )
    lines += ["", verdict(results), "", f"![sacreBLEU against P*]({plot.name})", ""]
    return "\n".join(lines)


def plot_bleu(results: list[dict[str, Any]], path: Path) -> None:
    """sacreBLEU against P*, one marker per kind of run."""
    from matplotlib.figure import Figure  # no pyplot: no global backend state

    fig = Figure(figsize=(6.5, 4.2), dpi=120)
    ax = fig.add_subplot()
    markers = {"teacher": "*", "converted": "x", "fine-tuned": "o", "from scratch": "s"}
    for kind, marker in markers.items():
        runs = [r for r in results if r["kind"] == kind]
        if runs:
            ax.scatter([r["p_star"] / 1e6 for r in runs], [r["bleu"] for r in runs],
                       marker=marker, s=40, label=kind)  # fmt: skip
        for r in runs:
            if kind == "fine-tuned":  # one label per setting (its runs share the x)
                ax.annotate(f"M{r['unique']} r{r['rank']}", (r["p_star"] / 1e6, r["bleu"]),
                            xytext=(4, 3), textcoords="offset points", fontsize=7)  # fmt: skip
    ax.set_xlabel("P* (millions of parameters, embeddings and head excluded)")
    ax.set_ylabel("sacreBLEU (test)")
    ax.set_title("Relaxed recursive models from a trained transformer")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    for m in args.unique:
        if not 1 <= m <= args.levels:
            raise UserError(f"--unique {m}: choose 1 to --levels {args.levels} blocks")
    for r in args.ranks:
        if not 0 <= r <= args.embed_dim:
            raise UserError(f"--ranks {r}: choose a rank from 0 to --embed-dim {args.embed_dim}")
    if args.nproc < 1 or args.max_tokens % args.nproc:
        raise UserError(f"--nproc {args.nproc} must divide --max-tokens {args.max_tokens}")
    args.data = Path(args.data or data_dir(args.vocab_size))
    if not (args.data / "dict.en.txt").exists() and args.data == data_dir(args.vocab_size):
        print(f"Preparing the embedded corpus into {args.data} ...", flush=True)
        prep = [sys.executable, "-m", "data_prep.embedded", "prepare", "--out", str(args.data)]
        args.out.mkdir(parents=True, exist_ok=True)
        run_logged([*prep, "--vocab-size", str(args.vocab_size)], args.out / "prepare.log")
    args.langs = languages(args.data)
    os.environ.setdefault("PYTHONHASHSEED", "0")
    results = experiment(args)
    args.doc.parent.mkdir(parents=True, exist_ok=True)
    plot = args.doc.with_suffix(".png")
    plot_bleu(results, plot)
    args.doc.write_text(markdown(results, args, plot), encoding="utf-8")
    write_json(args.doc.with_suffix(".json"), results)
    print(verdict(results))
    print(f"wrote {args.doc}, {plot}, {args.doc.with_suffix('.json')}")
    return results


if __name__ == "__main__":
    sys.exit(entry_point(main, PROG)())
