"""The scoring command's former name: ``python -m recurnmt.experiments.evaluate`` runs
``python -m recurnmt.experiments.scoring`` (:func:`recurnmt.cli.run_former_name`)."""

from __future__ import annotations

from recurnmt.experiments.scoring import cli, main, model_report

__all__ = ["cli", "main", "model_report"]

if __name__ == "__main__":
    from recurnmt.cli import run_former_name

    run_former_name("recurnmt.experiments.evaluate", "recurnmt.experiments.scoring")
