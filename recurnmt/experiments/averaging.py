"""Checkpoint averaging, as fairseq's ``scripts/average_checkpoints.py``.

Averaging the weights of the last few checkpoints is the standard last step of Transformer
NMT training (Vaswani et al. 2017, sec. 6.1: the last 5 checkpoints of the base model). fairseq
ships the tool as a script outside its package (not importable from an installed fairseq), so
this module implements the same behaviour:

* the last N checkpoints are picked by their numbers, ``checkpoint{epoch}.pt`` or
  ``checkpoint_{epoch}_{update}.pt``, optionally up to an upper bound;
* every floating-point tensor of ``state["model"]`` is averaged (in float64 here, then cast
  back); other entries come from the first checkpoint given (the newest one when chosen by
  number).

Two differences, both for weight-shared models and smaller files: tensors that one checkpoint
stores once under several keys (a block shared by several levels) stay one shared tensor in
the average, and the optimizer state is dropped (an average is for evaluation; resuming from
it would pair averaged weights with one checkpoint's Adam moments).

Command line::

    python -m recurnmt.experiments.averaging --dir checkpoints/run --last 5 --by update \\
        --output checkpoints/run/checkpoint_avg5.pt
    python -m recurnmt.experiments.averaging --inputs a.pt b.pt --output avg.pt
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from recurnmt.checkpoint_files import FAIRSEQ, read_checkpoint_file
from recurnmt.cli import entry_point

PROG = "python -m recurnmt.experiments.averaging"

_PATTERNS = {
    "epoch": re.compile(r"checkpoint(\d+)\.pt"),
    "update": re.compile(r"checkpoint_\d+_(\d+)\.pt"),
}


def last_checkpoints(
    save_dir: str | Path, n: int, by: str = "update", upper_bound: int | None = None
) -> list[Path]:
    """The ``n`` newest numbered checkpoints of ``save_dir``, newest first.

    Args:
        save_dir: fairseq's ``--save-dir``.
        n: how many.
        by: ``update`` (``checkpoint_E_U.pt``, written with ``--save-interval-updates``) or
            ``epoch`` (``checkpointE.pt``).
        upper_bound: ignore checkpoints numbered above this update / epoch.

    Raises:
        ValueError: fewer than ``n`` such checkpoints exist, or ``by`` is unknown.
    """
    if by not in _PATTERNS:
        raise ValueError(f"by={by!r}: choose one of {sorted(_PATTERNS)}")
    entries = []
    for path in Path(save_dir).iterdir():
        m = _PATTERNS[by].fullmatch(path.name)
        if m and (upper_bound is None or int(m.group(1)) <= upper_bound):
            entries.append((int(m.group(1)), path))
    if len(entries) < n:
        pattern = "checkpoint_E_U.pt" if by == "update" else "checkpointE.pt"
        raise ValueError(
            f"{save_dir} holds {len(entries)} {pattern} checkpoint(s), {n} needed "
            f"(saved with {'--save-interval-updates' if by == 'update' else 'epoch checkpoints'}"
            " and kept with --keep-interval-updates / --keep-last-epochs?)"
        )
    return [path for _, path in sorted(entries, reverse=True)[:n]]


def _load(path: Path) -> dict[str, Any]:
    """A fairseq checkpoint, weights-only; one line naming a missing or foreign file."""
    return read_checkpoint_file(path, FAIRSEQ)


def _tensor_key(t: torch.Tensor) -> tuple:
    """Identity of a stored tensor: views of one storage at the same place are one tensor."""
    return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride())


def average_checkpoints(paths: Sequence[str | Path]) -> dict[str, Any]:
    """The first checkpoint's state with ``model`` replaced by the average of all.

    Raises:
        ValueError: no paths, or the checkpoints hold different parameter names, shapes or
            sharing.
    """
    if not paths:
        raise ValueError("no checkpoints to average")
    first: dict[str, Any] | None = None
    keys: list[str] = []
    groups: list[list[str]] = []  # keys stored as one tensor, in the first checkpoint
    sums: list[torch.Tensor | None] = []
    for path in paths:
        state = _load(Path(path))
        model = state["model"]
        if first is None:
            first, keys = state, list(model)
            seen: dict[tuple, int] = {}
            for k in keys:
                idx = seen.setdefault(_tensor_key(model[k]), len(groups))
                if idx == len(groups):
                    groups.append([])
                groups[idx].append(k)
            sums = [None] * len(groups)
        elif list(model) != keys:
            raise ValueError(f"{path} holds other parameters than {paths[0]}")
        for g, group in enumerate(groups):
            tensor = model[group[0]]
            if any(_tensor_key(model[k]) != _tensor_key(tensor) for k in group[1:]):
                raise ValueError(f"{path} shares {group} differently from {paths[0]}")
            if tensor.shape != first["model"][group[0]].shape:
                raise ValueError(f"{group[0]} has another shape in {path}")
            if tensor.is_floating_point():
                add = tensor.detach().to(torch.float64)
                sums[g] = add.clone() if sums[g] is None else sums[g].add_(add)
    assert first is not None
    averaged: dict[str, torch.Tensor] = {}
    for g, group in enumerate(groups):
        original = first["model"][group[0]]
        value = original if sums[g] is None else (sums[g] / len(paths)).to(original.dtype)
        for k in group:
            averaged[k] = value
    first["model"] = {k: averaged[k] for k in keys}
    first.pop("last_optimizer_state", None)
    return first


def save_atomically(state: dict[str, Any], output: str | Path) -> Path:
    """``torch.save`` to a temporary sibling, then rename: no half-written checkpoint."""
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{output.name}.", dir=output.parent)
    os.close(fd)
    try:
        torch.save(state, tmp)
        os.replace(tmp, output)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return output


def main(argv: list[str] | None = None) -> int:
    """Averages checkpoints into ``--output``.

    Raises:
        OSError: a checkpoint or ``--dir`` is missing.
        ValueError: too few checkpoints, or checkpoints that do not match.
    """
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Average the weights of fairseq checkpoints.",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--inputs", nargs="+", type=Path, help="checkpoint files")
    source.add_argument("--dir", type=Path, help="a --save-dir: average its last checkpoints")
    parser.add_argument("--last", type=int, default=5, help="with --dir: how many")
    parser.add_argument("--by", choices=sorted(_PATTERNS), default="update")
    parser.add_argument("--upper-bound", type=int, help="ignore checkpoints numbered above")
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args(argv)
    paths = args.inputs or last_checkpoints(args.dir, args.last, args.by, args.upper_bound)
    print("averaging " + " ".join(str(p) for p in paths), flush=True)
    save_atomically(average_checkpoints(paths), args.output)
    print(f"wrote {args.output}")
    return 0


cli = entry_point(main, PROG)

if __name__ == "__main__":
    sys.exit(cli())
