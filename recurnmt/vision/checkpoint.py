"""The file a vision model is saved in and rebuilt from, written and read safely.

:func:`save_checkpoint` writes a payload atomically, :func:`load_checkpoint` reads one back and
:func:`model_from_checkpoint` rebuilds the model it stores (registered name, keyword arguments,
weights) for the commands that evaluate, convert, analyse or distil from one. A checkpoint of
the training command holds more, what resumes its run exactly (optimiser, scheduler, scaler,
epoch, arguments and every process's random streams: :mod:`recurnmt.vision.training.state`); one of
the converter holds the model alone.

Everything stored is a tensor or a plain Python value, so checkpoints load with
``torch.load(weights_only=True)``: a checkpoint from elsewhere cannot run code. A missing,
truncated or foreign file (a text file, a translation model's checkpoint) fails in one line
naming it (:func:`recurnmt.checkpoint_files.read_checkpoint_file`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from recurnmt.checkpoint_files import IMAGE, read_checkpoint_file
from recurnmt.vision.registry import create_model


def save_checkpoint(path: str | Path, payload: dict[str, Any]) -> None:
    """Writes ``payload`` atomically (temporary file, then rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(payload, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: str | Path, kind: str | None = IMAGE) -> dict[str, Any]:
    """Reads a checkpoint on the CPU with the weights-only (code-free) unpickler.

    Args:
        path: the file.
        kind: what it must hold: an image model (the default), or None for any weights
            (the converter's timm checkpoints).

    Raises:
        FileNotFoundError: no such file.
        CheckpointError: not a checkpoint (truncated, a text file) or not an image model's.
    """
    return read_checkpoint_file(path, kind)


def model_from_checkpoint(ckpt: dict[str, Any]) -> nn.Module:
    """Rebuilds the model stored in a checkpoint (of ``recurnmt.vision.training.train`` or the
    converter) with its weights.

    Raises:
        KeyError: the checkpoint names a model that is not registered.
    """
    model = create_model(ckpt["model_name"], **ckpt["model_kwargs"])
    model.load_state_dict(ckpt["model"])
    return model
