"""The training command's former name: ``python -m recurnmt.vision.train`` runs
``python -m recurnmt.vision.training.train`` (:mod:`recurnmt.vision.training.train`), saying
so once."""

from __future__ import annotations

import sys

from recurnmt.vision.training.train import cli, main

__all__ = ["cli", "main"]

if __name__ == "__main__":
    print(
        "python -m recurnmt.vision.train is now python -m recurnmt.vision.training.train "
        "(the same options)",
        file=sys.stderr,
    )
    sys.exit(cli())
