"""The evaluation command's former name: ``python -m recurnmt.vision.evaluate`` runs
``python -m recurnmt.vision.training.evaluate`` (:mod:`recurnmt.vision.training.evaluate`), saying
so once."""

from __future__ import annotations

import sys

from recurnmt.vision.training.evaluate import build_parser, cli, main

__all__ = ["build_parser", "cli", "main"]

if __name__ == "__main__":
    print(
        "python -m recurnmt.vision.evaluate is now python -m recurnmt.vision.training.evaluate "
        "(the same options)",
        file=sys.stderr,
    )
    sys.exit(cli())
