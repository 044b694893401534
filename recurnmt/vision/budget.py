"""The early-exit budget command's former name: ``python -m recurnmt.vision.budget`` runs
``python -m recurnmt.vision.runs.budget`` (:mod:`recurnmt.vision.runs.budget`), saying
so once."""

from __future__ import annotations

import sys

from recurnmt.vision.runs.budget import build_parser, cli, main

__all__ = ["build_parser", "cli", "main"]

if __name__ == "__main__":
    print(
        "python -m recurnmt.vision.budget is now python -m recurnmt.vision.runs.budget "
        "(the same options)",
        file=sys.stderr,
    )
    sys.exit(cli())
