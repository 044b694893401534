"""Per-row exits measured: trained models decoding the embedded test set with rows leaving the
level loop early, against the same model at full depth (docs/adaptive_depth.md).

Two steps, each resumable (a model trained or a point measured is kept):

    python scripts/adaptive_depth.py train      # the models of MODELS (scripts/speculative.py's)
    python scripts/adaptive_depth.py measure    # calibration, the curves, the page and the plot

``train`` is ``scripts/speculative.py train`` for these models, at its size (H=128, FF=512, 4
heads, 6 levels, pre-LN) and recipe, into the same folder (a model trained for one study serves
both). ``measure`` calibrates each exit test's threshold on the validation set for the stated
agreements with full-depth decoding, then decodes the test set at batch 64 beam 4 (the whole
grid of thresholds: the curve), batch 64 greedy and batch 1 beam 4, with sacreBLEU, tokens/s as
a ratio to full depth, the mean levels run and a paired bootstrap against full depth
(:mod:`studies.adaptive.measure`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# studies/ is the checkout's own, not installed: the checkout's root goes first on the path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from recurnmt.cli import entry_point
from recurnmt.experiments.experiment import missing_corpus

ROOT = Path(__file__).resolve().parent.parent
PROG = "python scripts/adaptive_depth.py"
MODELS = {
    "ringformer-random": (
        "ringformer",
        ("--mixed-depth", "on", "--mixed-depth-levels", "random"),
        "RingFormer trained at a random depth every batch (mixed depth)",
    ),
    "relaxed_transformer-random": (
        "relaxed_transformer",
        ("--mixed-depth", "on", "--mixed-depth-levels", "random"),
        "relaxed recursion (2 blocks, rank 8) trained at a random depth every batch",
    ),
}
TESTS = ("saturation", "margin", "classifier")


def parse_args(argv: list[str]) -> argparse.Namespace:
    from scripts.speculative import parse_args as speculative_args

    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("step", choices=("train", "measure"))
    parser.add_argument("--data", type=Path, default=ROOT / "data-bin" / "lohelp_de_en_spm4000")
    parser.add_argument("--out", type=Path, default=ROOT / "work" / "speculative")
    parser.add_argument("--doc", type=Path, default=ROOT / "docs" / "adaptive_depth.md")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--tests", nargs="+", default=list(TESTS), choices=list(TESTS))
    parser.add_argument(
        "--agreements",
        nargs="+",
        type=float,
        default=[0.8, 0.6],
        help="the consistencies with full depth (sacreBLEU against its outputs / 100) a "
        "threshold is calibrated for",
    )
    parser.add_argument("--min-exit-level", type=int, default=1)
    parser.add_argument(
        "--unit-epochs",
        type=int,
        default=2,
        help="recurnmt-exits train's passes for the classifier test's units",
    )
    parser.add_argument(
        "--unit-sentences",
        type=int,
        default=8000,
        help="training sentences the units learn from (0: all)",
    )
    parser.add_argument(
        "--valid-sentences",
        type=int,
        default=512,
        help="validation sentences the thresholds are calibrated on",
    )
    parser.add_argument("--sentences", type=int, default=100, help="batch-1 sentences")
    parser.add_argument("--batch", type=int, default=64, help="sentences per batch")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    args, rest = parser.parse_known_args(argv)
    if args.step == "train":  # scripts/speculative.py's training, its size and recipe flags
        args.train = speculative_args(["train", "--data", str(args.data), "--out",
                                       str(args.out), *rest])  # fmt: skip
        args.train.models = args.models
    elif rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if error := missing_corpus(args.data):
        parser.error(error)
    if any(not 0 < a <= 1 for a in args.agreements):
        parser.error(f"--agreements {args.agreements}: each in (0, 1]")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.step == "train":
        from scripts.speculative import train

        train(args.train, MODELS)
        return 0
    from studies.adaptive.measure import measure  # torch and fairseq: not for training

    measure(args, MODELS)
    return 0


if __name__ == "__main__":
    sys.exit(entry_point(main, PROG)())
