"""What the translation analyses read: fairseq checkpoints of a model and batches of a subset.

Shared by :mod:`recurnmt.analysis.cka`, :mod:`recurnmt.analysis.depth_map` and
:mod:`recurnmt.analysis.exits`, so that no command imports another. Checkpoints load through fairseq's own loader with the plugin's
models registered (:mod:`recurnmt.nmt`), which checks each file first
(:mod:`recurnmt.nmt.checkpoint_safety`): a missing, truncated or foreign file fails in one
line naming it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

SIDES = ("encoder", "decoder")


def load_nmt_models(paths: Sequence[str | Path], data: str | Path, device: torch.device):
    """Loads fairseq checkpoints (ours or fairseq's ``transformer``) and the translation task.

    Returns:
        (models in evaluation mode, their architecture names, the task of the first).

    Raises:
        ValueError: the checkpoints' dictionaries differ (tokens would not line up).
    """
    from fairseq import checkpoint_utils

    import recurnmt.nmt  # noqa: F401  (registers our models; weights-only loading)

    models, names, task = [], [], None
    for path in paths:
        loaded, cfg, t = checkpoint_utils.load_model_ensemble_and_task(
            [str(path)], arg_overrides={"data": str(data)}
        )
        task = task or t
        models.append(loaded[0].to(device).eval())
        names.append(getattr(cfg.model, "arch", None) or getattr(cfg.model, "_name", "model"))
    for m, path in zip(models, paths, strict=True):
        for side in SIDES:
            if len(getattr(m, side).dictionary) != len(getattr(models[0], side).dictionary):
                raise ValueError(f"{path}: its {side} dictionary differs from {paths[0]}'s")
    return models, names, task


def translation_batches(
    task,
    subset: str,
    max_sentences: int | None,
    batch_size: int | None = None,
    max_tokens: int | None = None,
) -> list[dict[str, Any]]:
    """The first ``max_sentences`` sentence pairs of ``subset`` (None: all), batched by similar
    length: ``batch_size`` sentences a batch, or as many as keep a batch's padded tokens (its
    sentences times its longest side, as fairseq's ``--max-tokens``) within ``max_tokens``."""
    task.load_dataset(subset)
    ds = task.dataset(subset)
    limit = len(ds) if max_sentences is None else max_sentences
    ids = [int(i) for i in ds.ordered_indices() if i < limit]
    if max_tokens is None:
        size = batch_size or 1
        chunks = [ids[start : start + size] for start in range(0, len(ids), size)]
    else:
        chunks, chunk, longest = [], [], 0
        for i in ids:
            n = int(ds.num_tokens(i))
            if chunk and (len(chunk) + 1) * max(longest, n) > max_tokens:
                chunks.append(chunk)
                chunk, longest = [], 0
            chunk.append(i)
            longest = max(longest, n)
        chunks += [chunk] if chunk else []
    return [ds.collater([ds[i] for i in chunk]) for chunk in chunks]


def device_of(name: str) -> torch.device:
    """``auto`` (CUDA where there is one), ``cpu`` or ``cuda``."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


__all__ = ["SIDES", "device_of", "load_nmt_models", "translation_batches"]
