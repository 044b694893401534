"""The scoring command's former name: ``python -m recurnmt.experiments.evaluate`` runs
``python -m recurnmt.experiments.scoring`` (:mod:`recurnmt.experiments.scoring`), saying so once."""

from __future__ import annotations

import sys

from recurnmt.experiments.scoring import cli, main, model_report

__all__ = ["cli", "main", "model_report"]

if __name__ == "__main__":
    print(
        "python -m recurnmt.experiments.evaluate is now python -m recurnmt.experiments.scoring "
        "(the same options)",
        file=sys.stderr,
    )
    sys.exit(cli())
