"""The early-exit budget command's former name: ``python -m recurnmt.vision.budget`` runs
``python -m recurnmt.vision.training.budget`` (:mod:`recurnmt.vision.training.budget`), saying
so once."""

from __future__ import annotations

import sys

from recurnmt.vision.training.budget import build_parser, cli, main

__all__ = ["build_parser", "cli", "main"]

if __name__ == "__main__":
    print(
        "python -m recurnmt.vision.budget is now python -m recurnmt.vision.training.budget "
        "(the same options)",
        file=sys.stderr,
    )
    sys.exit(cli())
