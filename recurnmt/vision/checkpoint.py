"""Checkpoints that resume a run exactly, and load safely.

A checkpoint holds the model, optimiser, scheduler and AMP scaler states, the epoch, the
training arguments and every process's random generator states (torch, CUDA, Python, numpy).
Restoring all of them at an epoch boundary continues the run with the same data order (the
sampler reshuffles from seed + epoch), the same augmentations and dropout masks, hence the same
losses as a run that never stopped.

:func:`model_from_checkpoint` rebuilds the model of a checkpoint (its registered name and
keyword arguments) for the commands that evaluate, analyse or distil from one.

Everything stored is a tensor or a plain Python value, so checkpoints load with
``torch.load(weights_only=True)``: a checkpoint from elsewhere cannot run code.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from recurnmt.vision.registry import create_model


def rng_state() -> dict[str, Any]:
    """This process's generator states, as tensors and plain values."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restores the states saved by :func:`rng_state`."""
    torch.set_rng_state(state["torch"])
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(path: str | Path, payload: dict[str, Any]) -> None:
    """Writes ``payload`` atomically (temporary file, then rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(payload, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Reads a checkpoint on the CPU with the weights-only (code-free) unpickler."""
    return torch.load(Path(path), map_location="cpu", weights_only=True)


def model_from_checkpoint(ckpt: dict[str, Any]) -> nn.Module:
    """Rebuilds the model stored in a checkpoint of ``recurnmt.vision.runs.train`` with its weights.

    Raises:
        KeyError: the checkpoint names a model that is not registered.
    """
    model = create_model(ckpt["model_name"], **ckpt["model_kwargs"])
    model.load_state_dict(ckpt["model"])
    return model


def unwrap(model: nn.Module) -> nn.Module:
    """The model inside a DistributedDataParallel (or compiled) wrapper."""
    while hasattr(model, "module") or hasattr(model, "_orig_mod"):
        model = getattr(model, "module", None) or model._orig_mod
    return model
