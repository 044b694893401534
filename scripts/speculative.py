"""Self-speculative decoding measured: trained models, with and without drafts from their own
first levels, against fairseq's transformer of the same width and depth (docs/speculative.md).

Two steps, each resumable (a model already trained or a measurement already made is kept; a
training stopped half-way resumes from its last checkpoint):

    python scripts/speculative.py train      # the models of MODELS on the embedded corpus
    python scripts/speculative.py measure    # the tables, the JSON and the plot

``train`` runs ``fairseq-train`` on the CPU (two data-parallel processes) for each model of
:data:`MODELS` at one size (H=128, FF=512, 4 heads, 6 levels, pre-LN: ``--embed-dim`` ...),
with the demo's recipe (Adam at 3e-3, linear decay over 1,400 updates, no dropout). The
RingFormers differ in how the draft is trained (``--mixed-depth-levels``: not at all, every
batch at a random depth, at 2 levels, at 1 level) and one runs 12 decoder levels (the same
parameters: a 1-level draft costs a twelfth of a token's levels there).

``measure`` decodes the embedded test set in this process, one model at a time (one thread,
``--threads``; a model's timing rounds take turns; ``--device cuda --dtype fp16 --doc
docs/speculative_gpu.md`` on a GPU), and reports:

* sacreBLEU of every model at full depth (beam 4), and of the drafts alone (their first R
  levels, greedy): what training for drafts costs and buys;
* identical outputs: speculative greedy against plain greedy on all 1,555 test sentences, in
  batches (``--batch``), for every draft depth R;
* speed at batch 1 (sentence by sentence, as interactive use) on ``--sentences`` sentences,
  greedy, for R = 1 .. N-1 and K = 2 .. 8: tokens/s and sentences/s, the mean accepted drafts
  per verification, as ratios to the same model's plain greedy and to fairseq's transformer;
* speed in batches of ``--batch`` sentences;
* beam search: the fraction of beam-4 steps whose selection the draft would reproduce (the
  bound on exact beam speculation), measured on the same sentences.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from types import SimpleNamespace

# studies/ is the checkout's own, not installed: python scripts/NAME.py puts scripts/ first on
# the import path, and the checkout's root goes before it
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from recurnmt.cli import entry_point
from recurnmt.experiments.artifacts import write_json
from recurnmt.experiments.commands import run_logged, train_command
from recurnmt.experiments.experiment import (
    add_size_arguments,
    missing_corpus,
    recipe_flags,
    run_flags,
    size_flags,
)
from recurnmt.experiments.launch import cpu_train_command

ROOT = Path(__file__).resolve().parent.parent
PROG = "python scripts/speculative.py"
# name -> (architecture, extra training flags, title)
MODELS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "ringformer-random": (
        "ringformer",
        ("--mixed-depth", "on", "--mixed-depth-levels", "random"),
        "RingFormer, drafts trained at a random depth every batch",
    ),
    "transformer": ("transformer", (), "fairseq's transformer"),
    "ringformer": ("ringformer", (), "RingFormer, no draft training"),
    "ringformer-r2": (
        "ringformer",
        ("--mixed-depth", "on", "--mixed-depth-levels", "2"),
        "RingFormer, drafts trained at 2 levels",
    ),
    "ringformer-r1": (
        "ringformer",
        ("--mixed-depth", "on", "--mixed-depth-levels", "1"),
        "RingFormer, drafts trained at 1 level",
    ),
    "ringformer-r1-distill": (
        "ringformer",
        ("--mixed-depth", "on", "--mixed-depth-levels", "1", "--shallow-distill", "0.5"),
        "RingFormer, drafts trained at 1 level, half on the full depth's predictions (KL)",
    ),
    "ringformer-r1-kl": (
        "ringformer",
        ("--mixed-depth", "on", "--mixed-depth-levels", "1", "--shallow-distill", "1"),
        "RingFormer, drafts trained at 1 level on the full depth's predictions alone (KL)",
    ),
    "demo": (
        "ringformer_iwslt_de_en",
        ("--encoder-layers", "3", "--decoder-layers", "3"),
        "the demo's RingFormer (3 levels, level-signal rank 8), no draft training",
    ),
    "ringformer-12-r1": (
        "ringformer",
        ("--decoder-layers", "12", "--mixed-depth", "on", "--mixed-depth-levels", "1"),
        "RingFormer with 12 decoder levels (the same parameters), drafts trained at 1 level",
    ),
    "universal_transformer-random": (
        "universal_transformer",
        ("--mixed-depth", "on", "--mixed-depth-levels", "random"),
        "Universal Transformer, drafts at a random depth",
    ),
    "takase-cycle": (
        "recurrent_transformer",
        (
            "--encoder-unique-layers",
            "2",
            "--decoder-unique-layers",
            "2",
            "--sharing-scheme",
            "cycle",
        ),  # fmt: skip
        "Takase & Kiyono's cycle sharing (2 blocks a side looped over the levels), no draft "
        "training",
    ),
    "owf": ("owf", (), "One Wide FFN (one FFN for the encoder's levels, none in the decoder)"),
    "relaxed_transformer-random": (
        "relaxed_transformer",
        ("--mixed-depth", "on", "--mixed-depth-levels", "random"),
        "relaxed recursion (2 blocks, rank 8), drafts at a random depth",
    ),
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("step", choices=("train", "measure"))
    parser.add_argument("--data", type=Path, default=ROOT / "data-bin" / "lohelp_de_en_spm4000")
    parser.add_argument("--out", type=Path, default=ROOT / "work" / "speculative")
    parser.add_argument("--doc", type=Path, default=ROOT / "docs" / "speculative.md")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    add_size_arguments(parser, pre_ln=None, heads=4)
    parser.add_argument("--max-update", type=int, default=1400)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--sentences", type=int, default=150, help="batch-1 timing sentences")
    parser.add_argument("--batch", type=int, default=64, help="sentences per batch")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--device", default="cpu", help="measure on: cpu (default) or cuda[:N] (training: CPU)"
    )
    parser.add_argument("--dtype", default="fp32", choices=("fp32", "fp16", "bf16"),
                        help="measure the models in (half precision: on CUDA)")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=2, help="timing rounds (best kept)")
    parser.add_argument("--draft-tokens", type=int, nargs="+", default=[2, 3, 4, 6, 8])
    parser.add_argument(
        "--max-draft-levels", type=int, default=5, help="the deepest draft timed (R <= this)"
    )
    args = parser.parse_args(argv)
    if args.step == "measure":  # torch: not for training
        from recurnmt.device import resolve_device

        args.device = str(resolve_device(args.device, parser.error))
    if args.dtype != "fp32" and not args.device.startswith("cuda"):
        parser.error(f"--dtype {args.dtype}: half precision is measured on CUDA (--device cuda)")
    if args.levels < 2:
        parser.error(f"--levels {args.levels}: a draft needs at least 2 levels")
    if error := missing_corpus(args.data):
        parser.error(error)
    return args


def recipe(args: argparse.Namespace) -> SimpleNamespace:
    """The demo's recipe (docs/demo.md) at this script's size."""
    return SimpleNamespace(
        dropout=0.0, lr=3e-3, lr_scheduler="polynomial_decay", warmup=200, max_tokens=2048,
        nproc=args.nproc, max_update=args.max_update, seed=args.seed,
    )  # fmt: skip


def checkpoint(args: argparse.Namespace, name: str) -> Path:
    return args.out / name / "checkpoints" / "checkpoint_last.pt"


def train(args: argparse.Namespace, models: dict = MODELS) -> None:
    """Trains ``args.models`` of ``models`` (name -> architecture, flags, title) that are not
    trained yet, each resuming from its last checkpoint."""
    size = SimpleNamespace(
        embed_dim=args.embed_dim, ffn_dim=args.ffn_dim, heads=args.heads, levels=args.levels,
        pre_ln=True,
    )  # fmt: skip
    for name in args.models:
        arch, extra, title = models[name]
        run_dir = args.out / name
        if (run_dir / "train.json").exists():  # written when training ended
            print(f"{name}: trained already ({checkpoint(args, name)})", flush=True)
            continue
        run_dir.mkdir(parents=True, exist_ok=True)
        flags = [*size_flags(size, arch), *recipe_flags(recipe(args)), *extra]
        if arch == "relaxed_transformer":
            flags += ["--encoder-unique-layers", "2", "--decoder-unique-layers", "2"]
        flags += run_flags(run_dir / "checkpoints")
        cmd = train_command(args.data, arch, flags, start=cpu_train_command(args.nproc))
        print(f"{name}: {title}\n  {shlex.join(cmd)}", flush=True)
        seconds = run_logged(cmd, run_dir / "train.log", cwd=ROOT)
        write_json(run_dir / "train.json", {"command": shlex.join(cmd), "seconds": seconds})
        print(f"  trained in {seconds / 60:.1f} min", flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.step == "train":
        train(args)
        return 0
    from studies.speculative.measure import measure  # torch and fairseq: not for training

    measure(args, MODELS)
    return 0


if __name__ == "__main__":
    sys.exit(entry_point(main, PROG)())
