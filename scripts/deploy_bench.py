"""Serving recursive models: trained models decoded by recurnmt in PyTorch and by CTranslate2
from ``recurnmt-export-ct2``'s directories, on the embedded test set (docs/deploy.md).

    python scripts/deploy_bench.py

trains the models it measures where ``scripts/speculative.py train`` has not (the same runs:
H=128, FF=512, 4 heads, 6 levels, pre-LN, the demo's recipe), exports each to CTranslate2 in
float32 and int8, and reports sacreBLEU (greedy and beam 4), greedy outputs identical to
fairseq's generator, tokens/s at batch 1 and 16, beam 1 and 4, against fairseq's transformer
decoded by fairseq's generator, and the sizes on disk. Resumable: a model measured is kept in
the JSON beside the page.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

# studies/ is the checkout's own, not installed: python scripts/NAME.py puts scripts/ first on
# the import path, and the checkout's root goes before it
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from recurnmt.cli import UserError, entry_point

ROOT = Path(__file__).resolve().parent.parent
PROG = "python scripts/deploy_bench.py"
MODELS = {
    "transformer": "fairseq's transformer (6 + 6 layers)",
    "ringformer": "RingFormer (one block a side, 6 levels, level-signal rank 8)",
    "demo": "the demo's RingFormer (3 levels a side)",
    "relaxed_transformer-random": "relaxed recursion (2 blocks a side, rank-8 LoRA per level)",
    "takase-cycle": "Takase & Kiyono's cycle sharing (`recurrent_transformer`, 2 blocks a side)",
    "owf": "One Wide FFN (the encoder's FFN shared by its levels, the decoder without FFN)",
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=ROOT / "data-bin" / "lohelp_de_en_spm4000")
    parser.add_argument("--runs", type=Path, default=ROOT / "work" / "speculative",
                        help="scripts/speculative.py's runs (trained there when missing)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=ROOT / "work" / "deploy")
    parser.add_argument("--doc", type=Path, default=ROOT / "docs" / "deploy.md")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--sentences", type=int, default=150, help="timing sentences")
    parser.add_argument("--rounds", type=int, default=2, help="timing rounds (best kept)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.sentences < 1:
        parser.error("--rounds and --sentences must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        raise UserError("CTranslate2 is not installed: pip install 'recurnmt[deploy]'") from None
    missing = [m for m in args.models if not (args.runs / m / "train.json").exists()]
    if missing:
        train = [sys.executable, str(ROOT / "scripts" / "speculative.py"), "train", "--data",
                 str(args.data), "--out", str(args.runs), "--models", *missing]  # fmt: skip
        subprocess.run(train, cwd=ROOT, check=True)
    from studies.deploy.measure import measure
    from studies.deploy.report import write_report

    write_report(args.doc, measure(args, MODELS))
    return 0


if __name__ == "__main__":
    sys.exit(entry_point(main, PROG)())
