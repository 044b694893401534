"""The real ``fairseq-train`` and ``fairseq-generate`` of the families, timed as users run them.

``scripts/benchmark_nmt.py`` times the models in one harness; this runs the command lines
themselves on the embedded German-English corpus, one architecture after another at the same
size and recipe, and reads the speed fairseq reports: training words/s of every epoch from the
json log (the steady state is the last epoch: the first one meets every batch shape for the
first time, issue 25), and what ``fairseq-generate`` says of its own speed on the test set
(sentences/s and tokens/s, beam 4 by default). Ratios are to the first architecture; the
``--json`` document is written after every architecture (``"complete"`` once all are in).

Every hypothesis is decoded to exactly ``--gen-len`` tokens (``--min-len N --max-len-a 0
--max-len-b N``, fairseq-generate's own flags), as ``scripts/profile_decoding.py`` does: models
trained for a few minutes stop at very different lengths (on the CPU, 3 epochs on 2,000 pairs:
fairseq's transformer 6 tokens a sentence, ``ringformer`` 28, most of them up to the length
limit), so that their own lengths would compare how long they talk, not how fast they decode.
``--gen-len 0`` keeps the models' own lengths (up to 1.5 x the source + 10). ``--gen-shards N``
translates every N-th batch of the test set (fairseq-generate's ``--distributed-world-size N
--distributed-rank 0``: its ``--num-shards`` is not read by fairseq 0.12's generate).

    python scripts/fairseq_speed.py --device cuda --dtype fp16             # base size, 2 epochs
    python scripts/fairseq_speed.py --device cpu --dtype fp32 --embed-dim 32 --ffn-dim 64 \\
        --heads 2 --levels 2 --max-tokens 1024 --max-train 300 --gen-shards 25   # a smoke run

``make gpu-check`` runs it as its first measurement. By default every command runs with cuDNN's
attention last in torch's order for every model, fairseq's ``transformer`` included (torch's
``TORCH_CUDNN_SDPA_DEPRIORITIZED``, which the plugin sets: recurnmt/modules/sdpa.py); ``--sdpa
torch`` runs them with torch's own order (cuDNN first on Hopper), for the first epoch with
cuDNN's per-shape plans.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from recurnmt.cli import UserError, entry_point
from recurnmt.experiments.artifacts import write_json
from recurnmt.experiments.commands import generate_command, run_logged, train_command
from recurnmt.experiments.experiment import (
    add_size_arguments,
    decoding_flags,
    recipe_flags,
    run_flags,
    size_flags,
)
from recurnmt.experiments.fairseq_log import epoch_stats, generation_speed
from recurnmt.experiments.launch import cpu_train_command
from recurnmt.modules.sdpa import ENV, POLICIES, parse_policy, set_policy
from recurnmt.nmt.quiet import quiet_env

ROOT = Path(__file__).resolve().parent.parent

PROG = "python scripts/fairseq_speed.py"
# fairseq 0.12's --bf16 implies --tpu (torch_xla): half precision on a GPU is --fp16
PRECISION_FLAGS = {"fp32": [], "fp16": ["--fp16"]}


def prepare_data(args: argparse.Namespace) -> Path:
    """The binarized embedded corpus: ``--data``, or prepared into the work directory."""
    if args.data:
        if not (args.data / "dict.en.txt").is_file():
            raise UserError(f"--data {args.data}: no dict.en.txt there (a data-bin directory?)")
        return args.data
    out = args.out / f"data_train{args.max_train or 'all'}"
    if not (out / "dict.en.txt").is_file():
        cmd = [sys.executable, "-m", "data_prep.embedded", "prepare", "--out", str(out)]
        cmd += ["--workers", str(args.workers), "--force"]
        cmd += ["--max-train", str(args.max_train)] if args.max_train else []
        print(f"preparing the embedded corpus into {out} ...", flush=True)
        subprocess.run(cmd, cwd=ROOT, env=quiet_env(dict(os.environ)), check=True)
    return out


def measure(arch: str, data: Path, args: argparse.Namespace) -> dict:
    """Trains ``arch`` for ``--epochs`` epochs, translates the test set; the speeds."""
    run = args.out / arch
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir(parents=True)
    recipe = argparse.Namespace(
        dropout=0.1, lr=5e-4, lr_scheduler="inverse_sqrt", warmup=100, max_tokens=args.max_tokens,
        nproc=1, max_update=0, seed=1,
    )  # fmt: skip
    flags = [*size_flags(args, arch), *recipe_flags(recipe), *PRECISION_FLAGS[args.dtype]]
    flags += ["--max-epoch", str(args.epochs), "--disable-validation"]
    flags += run_flags(run / "checkpoints")
    start = cpu_train_command(1) if args.device == "cpu" else None
    train = train_command(data, arch, flags, start=start)
    print(f"[{arch}] training {args.epochs} epochs ...", flush=True)
    train_s = run_logged(train, run / "train.log", cwd=ROOT)
    epochs = epoch_stats(run / "train.log")
    if args.epochs not in epochs:
        raise UserError(f"[{arch}] no end-of-epoch line for epoch {args.epochs} in {run}/train.log")
    decoding = [*decoding_flags(args.beam, 1.0, args.device), *PRECISION_FLAGS[args.dtype]]
    decoding += generation_flags(args.gen_len, args.gen_shards)
    checkpoint = run / "checkpoints" / "checkpoint_last.pt"
    generate = generate_command(data, checkpoint, decoding)
    print(f"[{arch}] translating the test set (beam {args.beam}) ...", flush=True)
    run_logged(generate, run / "generate.log", stdout=run / "generate.txt", cwd=ROOT)
    speed = generation_speed(run / "generate.txt") or generation_speed(run / "generate.log")
    if speed is None:
        raise UserError(f"[{arch}] fairseq-generate printed no 'Translated ...' line ({run})")
    row = {
        "arch": arch,
        "train_wps": epochs[args.epochs]["wps"],
        "first_epoch_wps": epochs[1]["wps"],
        "train_seconds": round(train_s, 1),
        "gen_sentences_per_s": speed["sentences_per_s"],
        "gen_tokens_per_s": speed["tokens_per_s"],
        "gen_sentences": speed["sentences"],
        "gen_tokens": speed["tokens"],
        "train_command": shlex.join(train),
        "generate_command": shlex.join(generate),
    }
    print(
        f"[{arch}] {row['train_wps']:.0f} words/s in epoch {args.epochs} "
        f"({row['first_epoch_wps']:.0f} in epoch 1); generation {row['gen_sentences_per_s']:.1f} "
        f"sentences/s, {row['gen_tokens_per_s']:.0f} tokens/s",
        flush=True,
    )
    return row


def generation_flags(length: int, shards: int) -> list[str]:
    """``fairseq-generate`` flags after :func:`decoding_flags`, whose length limit they
    override (argparse keeps the last): every hypothesis ``length`` tokens long (0: the
    model's own lengths), every ``shards``-th batch of the test set."""
    flags = []
    if length:
        flags += ["--min-len", str(length), "--max-len-a", "0", "--max-len-b", str(length)]
    if shards > 1:  # the batches of rank 0 of N (fairseq_cli/generate.py shards by these)
        flags += ["--distributed-world-size", str(shards), "--distributed-rank", "0"]
    return flags


COLUMNS = (
    ("train words/s (last epoch)", "train_wps", ".0f"),
    ("first epoch", "first_epoch_wps", ".0f"),
    ("generate sentences/s", "gen_sentences_per_s", ".1f"),
    ("tokens/s", "gen_tokens_per_s", ".0f"),
)


def table(rows: list[dict]) -> str:
    """Markdown rows with each figure's ratio to the first architecture's."""
    base = rows[0]
    header = ["arch"] + [f"{title} | ratio" for title, _, _ in COLUMNS]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * (1 + 2 * len(COLUMNS))]
    for row in rows:
        cells = [f"`{row['arch']}`"]
        for _, key, fmt in COLUMNS:
            cells += [format(row[key], fmt), f"{row[key] / max(base[key], 1e-12):.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--archs", nargs="+", default=["transformer", "ringformer"])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    parser.add_argument("--dtype", choices=sorted(PRECISION_FLAGS), default="fp16")
    add_size_arguments(parser, embed_dim=512, ffn_dim=2048)
    parser.add_argument("--max-tokens", type=int, default=8192)
    parser.add_argument("--epochs", type=int, default=2, help="the last one is timed")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument(
        "--gen-shards", type=int, default=1, help="translate every N-th batch of the test set"
    )
    parser.add_argument(
        "--gen-len",
        type=int,
        default=32,
        help="tokens every hypothesis is decoded to, the same work for every model "
        "(0: the models' own lengths)",
    )
    parser.add_argument("--data", type=Path, help="a binarized corpus (default: the embedded)")
    parser.add_argument("--max-train", type=int, help="prepare only N training pairs")
    parser.add_argument("--workers", type=int, default=4, help="fairseq-preprocess workers")
    parser.add_argument("--out", type=Path, default=ROOT / "work" / "fairseq_speed")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument(
        "--sdpa",
        choices=POLICIES,
        help=f"{ENV} for every command (default: this environment's, else no-cudnn): "
        "no-cudnn leaves cuDNN's attention last in torch's order for every model, torch "
        "keeps torch's (cuDNN first on Hopper)",
    )
    args = parser.parse_args(argv)
    if args.gen_len < 0:
        raise ValueError(f"--gen-len {args.gen_len}: a number of tokens, or 0")
    if args.gen_shards < 1:
        raise ValueError(f"--gen-shards {args.gen_shards}: at least 1")
    if args.epochs < 2:
        raise ValueError(f"--epochs {args.epochs}: at least 2 (the first is not timed)")
    if args.device == "cpu" and args.dtype != "fp32":
        raise ValueError("--dtype fp16 needs --device cuda (fairseq trains fp16 on a GPU only)")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    from recurnmt.nmt.build import check_arch

    for arch in args.archs:
        check_arch(arch)
    if args.sdpa:  # the commands' environment (run_logged passes this process's on)
        os.environ[ENV] = args.sdpa
        set_policy(args.sdpa)  # and torch's switches, which importing recurnmt set here
    data = prepare_data(args)
    settings = {k: str(v) for k, v in vars(args).items() if k != "json"}
    doc = {"device": args.device, "dtype": args.dtype, "settings": settings, "results": []}
    doc["sdpa"] = parse_policy(os.environ.get(ENV))
    for arch in args.archs:  # the document is written after every architecture
        doc["results"].append(measure(arch, data, args))
        doc["complete"] = len(doc["results"]) == len(args.archs)
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            write_json(args.json, doc)
    print(table(doc["results"]))
    return doc


if __name__ == "__main__":
    sys.exit(entry_point(main, PROG)())
