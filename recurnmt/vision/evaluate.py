"""The evaluation command's former name: ``python -m recurnmt.vision.evaluate`` runs
``python -m recurnmt.vision.runs.evaluate`` (:mod:`recurnmt.vision.runs.evaluate`), saying
so once."""

from __future__ import annotations

import sys

from recurnmt.vision.runs.evaluate import build_parser, cli, main

__all__ = ["build_parser", "cli", "main"]

if __name__ == "__main__":
    print(
        "python -m recurnmt.vision.evaluate is now python -m recurnmt.vision.runs.evaluate "
        "(the same options)",
        file=sys.stderr,
    )
    sys.exit(cli())
