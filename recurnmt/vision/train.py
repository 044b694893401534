"""The training command's former name: ``python -m recurnmt.vision.train`` runs
``python -m recurnmt.vision.runs.train`` (:mod:`recurnmt.vision.runs.train`), saying
so once."""

from __future__ import annotations

import sys

from recurnmt.vision.runs.train import cli, main

__all__ = ["cli", "main"]

if __name__ == "__main__":
    print(
        "python -m recurnmt.vision.train is now python -m recurnmt.vision.runs.train "
        "(the same options)",
        file=sys.stderr,
    )
    sys.exit(cli())
