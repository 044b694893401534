"""The evaluation command's former name: ``python -m recurnmt.vision.evaluate`` runs
``python -m recurnmt.vision.training.evaluate`` (:func:`recurnmt.cli.run_former_name`)."""

from __future__ import annotations

from recurnmt.vision.training.evaluate import build_parser, cli, main

__all__ = ["build_parser", "cli", "main"]

if __name__ == "__main__":
    from recurnmt.cli import run_former_name

    run_former_name("recurnmt.vision.evaluate", "recurnmt.vision.training.evaluate")
