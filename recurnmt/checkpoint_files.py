"""Reading a checkpoint file, or failing in one line that names it and says what is wrong.

Every command that reads a checkpoint reads it here (:func:`read_checkpoint_file`), directly or
through fairseq's loader (``checkpoint_utils.load_checkpoint_to_cpu``, which
:mod:`recurnmt.nmt.checkpoint_safety` makes check the file here first). A file that cannot
serve ends in one message (``recurnmt.cli`` prints it as ``PROG: error: MESSAGE``, exit 2):

* no such file: ``checkpoint PATH does not exist`` (``FileNotFoundError``);
* a file ``torch.save`` did not write (a text file, an empty one), or one it wrote that was
  cut short or damaged (a copy or a download that stopped): ``PATH is not a ...``, saying which;
* a checkpoint of another kind than the command reads: a translation model (fairseq's format,
  :data:`FAIRSEQ`) where an image model (``recurnmt.vision``'s, :data:`IMAGE`) belongs, or the
  other way round, named with the model it holds.

Checkpoints load with torch's weights-only unpickler: a checkpoint from elsewhere cannot run
code. What fairseq pickles beside the weights (its arguments, an ``argparse.Namespace``) is
allow-listed (:data:`SAFE_GLOBALS`); anything else is refused, naming the class.

This module imports only torch (the image commands use it without fairseq).
"""

from __future__ import annotations

import argparse
import collections
import re
from pathlib import Path
from typing import Any

import torch

FAIRSEQ = "fairseq"  # fairseq's format: the saved configuration (cfg or args) and the weights
IMAGE = "image"  # recurnmt.vision.checkpoint's: model_name, model_kwargs and the weights
KINDS = {
    FAIRSEQ: "a fairseq checkpoint",
    IMAGE: "an image model's checkpoint",
    None: "a checkpoint",
}
# the classes fairseq pickles beside the weights (and timm's train.py its arguments)
SAFE_GLOBALS: list = [argparse.Namespace, collections.OrderedDict]
_ZIP = b"PK\x03\x04"  # torch.save's format since torch 1.6: a zip archive
_PICKLE = b"\x80"  # torch.save's former format starts with a pickle protocol byte
_HEAD = 4096  # bytes of a file looked at to say what it is


class CheckpointError(ValueError):
    """A file that is no checkpoint of the kind a command reads; the message names it."""


def allow_safe_globals() -> None:
    """Allow-lists :data:`SAFE_GLOBALS` for weights-only loading (again, if taken back: a
    ``torch.serialization.safe_globals`` context removes what it lists on exit)."""
    torch.serialization.add_safe_globals(SAFE_GLOBALS)


def kind_of(state: Any) -> str | None:
    """:data:`FAIRSEQ`, :data:`IMAGE` or None (neither) for a loaded checkpoint."""
    if not isinstance(state, dict) or "model" not in state:
        return None
    if "model_name" in state and "model_kwargs" in state:  # (its "args": the trainer's)
        return IMAGE
    if state.get("cfg") is not None or state.get("args") is not None:
        return FAIRSEQ
    return None


def model_name(state: Any) -> str | None:
    """The model a loaded checkpoint holds: fairseq's ``--arch`` or the registered image model."""
    kind = kind_of(state)
    if kind == IMAGE:
        return str(state["model_name"])
    if kind == FAIRSEQ:
        cfg = state.get("cfg")
        model = cfg.get("model") if isinstance(cfg, dict) else getattr(cfg, "model", None)
        for args in (model, state.get("args")):
            if isinstance(args, dict):
                args = argparse.Namespace(**args)
            name = getattr(args, "arch", None) or getattr(args, "_name", None)
            if name:
                return str(name)
    return None


def describe(state: Any) -> str:
    """What a loaded checkpoint is, for a message: ``a fairseq checkpoint (ringformer_tiny)``,
    or what it holds where it is neither kind."""
    kind, name = kind_of(state), model_name(state)
    if kind is not None:
        return f"{KINDS[kind]}{f' ({name})' if name else ''}"
    if isinstance(state, dict):
        keys = ", ".join(map(str, list(state)[:4])) + (", ..." if len(state) > 4 else "")
        return f"a {type(state).__name__} of {keys or 'nothing'}"
    return f"a {type(state).__name__}"


def _head(path: Path) -> bytes:
    with path.open("rb") as f:
        return f.read(_HEAD)


def _unreadable(path: Path, err: Exception, head: bytes, kind: str | None) -> CheckpointError:
    """Why torch could not load ``path`` (the caller reads ``kind``), in one line."""
    text = str(err)
    refused = re.search(r"Unsupported global: GLOBAL ([\w.]+)", text)
    if refused:
        return CheckpointError(
            f"{path} holds an object of {refused.group(1)}, which recurnmt does not unpickle "
            "(weights-only loading: a checkpoint from elsewhere cannot run code)"
        )
    if head.startswith((_ZIP, _PICKLE)):
        return CheckpointError(f"{path} is truncated or damaged: torch cannot read it")
    what = (
        "an empty file"
        if not head
        else "a text file"
        if _text(head)
        else "not a file torch.save wrote"
    )
    return CheckpointError(f"{path} is not {KINDS[kind]}: {what}")


def _text(head: bytes) -> bool:
    """The first bytes of a file read as UTF-8 text (a character may straddle their end)."""
    if b"\x00" in head:
        return False
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as err:
        return len(head) == _HEAD and err.start >= _HEAD - 3
    return True


def read_checkpoint_file(
    path: str | Path, kind: str | None = None, *, mmap: bool = False
) -> dict[str, Any]:
    """The checkpoint in ``path`` (on the CPU, weights-only), or an error naming the file.

    Args:
        path: the file.
        kind: what the caller reads, :data:`FAIRSEQ` or :data:`IMAGE`; None: any file
            ``torch.save`` wrote (a bare state dict too). ``.safetensors`` files load as
            weights (kind None only).
        mmap: map the tensors from the file instead of reading them (``torch.load(mmap=True)``,
            where the file is in torch's zip format): a cheap look at what a large checkpoint
            holds.

    Raises:
        FileNotFoundError: no such file.
        CheckpointError: a directory, not a checkpoint, a truncated or damaged one, or one of
            another kind (each named).
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    if path.is_dir():
        raise CheckpointError(f"{path} is a directory, not a checkpoint file")
    head = _head(path)
    if path.suffix == ".safetensors" and kind is None:
        from safetensors.torch import load_file

        try:
            return load_file(str(path))
        except Exception as err:  # safetensors raises its own kinds on a bad file
            raise _unreadable(path, err, head, kind) from None
    allow_safe_globals()
    try:
        state = torch.load(
            path, map_location="cpu", weights_only=True, mmap=mmap and head.startswith(_ZIP)
        )
    except Exception as err:  # torch raises many kinds on a file that is no checkpoint
        raise _unreadable(path, err, head, kind) from None
    found = kind_of(state)
    if kind is not None and found != kind:
        if found is None:  # no saved configuration, or no weights
            raise CheckpointError(f"{path} is not {KINDS[kind]}: it holds {describe(state)}")
        raise CheckpointError(f"{path} is {describe(state)}, not {KINDS[kind]}")
    return state
