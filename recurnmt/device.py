"""``--device``: one reading of the flag for every command that takes it.

The benchmark scripts (``scripts/benchmark_{nmt,vision}.py``) and the vision trainer
(``recurnmt.vision.training.distributed``) resolve their ``--device`` here; each raises its own
exception type (``error``) so that its callers catch what they always caught. This module
imports only torch, so anything in recurnmt can use it without an import cycle.
``--deterministic`` is read here too (:func:`deterministic_algorithms`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch


def resolve_device(name: str, error: type[Exception] = ValueError) -> torch.device:
    """``--device``: ``auto`` (CUDA where present, else the CPU), ``cpu`` or ``cuda[:N]``.

    Args:
        name: the flag's value.
        error: the exception type to raise (called with the message alone); the vision
            trainer passes its ``DistributedSetupError``.

    Raises:
        error: an unknown device, CUDA asked for where there is none, or a CUDA index
            beyond the visible devices.
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise error(f"--device {name!r}: expected auto, cpu or cuda[:N]")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise error(
            f"--device {name}: no CUDA device on this machine (torch {torch.__version__}, "
            f"CUDA build {torch.version.cuda})"
        )
    if device.type == "cuda" and device.index is not None:
        visible = torch.cuda.device_count()
        if device.index >= visible:
            raise error(
                f"--device {name}: only {visible} CUDA device(s) visible "
                "(numbered from 0; CUDA_VISIBLE_DEVICES selects them)"
            )
    return device


@contextlib.contextmanager
def deterministic_algorithms(enabled: bool = True) -> Iterator[None]:
    """``--deterministic``: only deterministic kernels inside the block, restored after it.

    On CUDA some kernels accumulate with atomic adds (interpolation, pooling and scatter
    backwards), so two runs of the same training differ in the last bits and a resumed run
    drifts from one that never stopped. ``torch.use_deterministic_algorithms`` picks
    deterministic kernels where torch has them and raises, naming the operation, where it
    has none; cuDNN stops benchmarking algorithms; cuBLAS gets the fixed workspace that its
    deterministic mode needs (``CUBLAS_WORKSPACE_CONFIG``, unless already set). On the CPU
    the kernels are deterministic already.

    Args:
        enabled: False leaves everything as it is.
    """
    if not enabled:
        yield
        return
    cudnn = torch.backends.cudnn
    saved = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        cudnn.benchmark,
        cudnn.deterministic,
    )
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    cudnn.benchmark, cudnn.deterministic = False, True
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
        cudnn.benchmark, cudnn.deterministic = saved[2], saved[3]
