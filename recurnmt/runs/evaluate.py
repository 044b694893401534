"""The scoring command's former name: ``python -m recurnmt.runs.evaluate`` runs
``python -m recurnmt.runs.scoring`` (:mod:`recurnmt.runs.scoring`), saying so once."""

from __future__ import annotations

import sys

from recurnmt.runs.scoring import cli, main, model_report

__all__ = ["cli", "main", "model_report"]

if __name__ == "__main__":
    print(
        "python -m recurnmt.runs.evaluate is now python -m recurnmt.runs.scoring "
        "(the same options)",
        file=sys.stderr,
    )
    sys.exit(cli())
