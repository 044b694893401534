"""The training command's former name: ``python -m recurnmt.vision.train`` runs
``python -m recurnmt.vision.training.train`` (:func:`recurnmt.cli.run_former_name`)."""

from __future__ import annotations

from recurnmt.vision.training.train import cli, main

__all__ = ["cli", "main"]

if __name__ == "__main__":
    from recurnmt.cli import run_former_name

    run_former_name("recurnmt.vision.train", "recurnmt.vision.training.train")
