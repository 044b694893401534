"""Decoding with each step compiled (``fairseq-generate --task speculative_translation
--compile-decoding``) against fairseq's own greedy and beam search, on the CPU, for the models
``python scripts/speculative.py train`` trained (docs/compiled_decoding.md; the measurement:
:mod:`studies.speculative.compiled`).

    python scripts/speculative.py train --models ringformer-random transformer
    python scripts/compiled_decoding.py      # the models trained of --models; resumable
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# studies/ is the checkout's own, not installed: python scripts/NAME.py puts scripts/ first on
# the import path, and the checkout's root goes before it
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from recurnmt.cli import entry_point
from recurnmt.experiments.experiment import missing_corpus

ROOT = Path(__file__).resolve().parent.parent
PROG = "python scripts/compiled_decoding.py"
MODELS = {
    "ringformer-random": "RingFormer, drafts trained at a random depth every batch",
    "universal_transformer-random": "Universal Transformer, drafts at a random depth",
    "relaxed_transformer-random": "relaxed recursion (2 blocks, rank 8), drafts at a random depth",
    "transformer": "fairseq's transformer (fairseq's searches only)",
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=ROOT / "data-bin" / "lohelp_de_en_spm4000")
    parser.add_argument("--out", type=Path, default=ROOT / "work" / "speculative",
                        help="where scripts/speculative.py trained the models")  # fmt: skip
    parser.add_argument("--doc", type=Path, default=ROOT / "docs" / "compiled_decoding.md")
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--sentences", type=int, default=150, help="timed test sentences")
    parser.add_argument("--batch", type=int, default=64, help="sentences per batch")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=2, help="timing rounds (best kept)")
    parser.add_argument("--drafts", nargs="+", default=["1:2", "2:3", "4:3"], metavar="R:K",
                        help="the speculative greedy settings measured (draft levels:tokens; "
                        "R is cut to a model's levels - 1)")  # fmt: skip
    args = parser.parse_args(argv)
    args.device = "cpu"
    if args.sentences < 1 or args.batch < 1 or args.rounds < 1 or args.threads < 1:
        parser.error("--sentences, --batch, --rounds and --threads: at least 1")
    args.drafts = [_draft(parser, value) for value in args.drafts]
    if error := missing_corpus(args.data):
        parser.error(error)
    return args


def _draft(parser: argparse.ArgumentParser, value: str) -> tuple[int, int]:
    """``R:K``, at least 1 level and 1 token, or the parser's error naming the flag."""
    try:
        levels, tokens = (int(part) for part in value.split(":"))
    except ValueError:
        parser.error(f"--drafts {value}: draft levels:tokens, for example 1:2")
    if levels < 1 or tokens < 1:
        parser.error(f"--drafts {value}: at least 1 level and 1 token")
    return levels, tokens


def main(argv: list[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    from studies.speculative.compiled import measure  # torch, fairseq: after parsing

    measure(args, MODELS)
    print(f"wrote {args.doc.relative_to(ROOT) if args.doc.is_relative_to(ROOT) else args.doc}")
    return 0


if __name__ == "__main__":
    sys.exit(entry_point(main, PROG)())
