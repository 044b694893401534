"""Process-group setup for single-process and torchrun (multi-GPU, multi-node) training.

``torchrun`` exports RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and
MASTER_PORT. Without them the run is a single process. With them, the backend is NCCL on CUDA
and gloo on CPU, and inconsistent setups are refused before any work is done, with a message
that says what to change: a partial environment, a rank outside the world, more processes per
node than visible GPUs, or ranks that disagree on the world size. :func:`unwrap` finds the model
inside the wrappers a process trains (DDP, ``torch.compile``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from recurnmt.cli import UserError
from recurnmt.device import resolve_device as _resolve_device

_TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


class DistributedSetupError(UserError, RuntimeError):
    """The launch environment cannot give a consistent process group.

    A user error: at the command line (:mod:`recurnmt.cli`) its message is printed on one
    line, without a traceback, and the command exits with 2. Still a ``RuntimeError``, as it
    always was, for code that catches that.
    """


@dataclass(frozen=True)
class DistInfo:
    """This process's place in the run.

    Attributes:
        rank: global rank.
        world_size: number of processes.
        local_rank: rank on this node (selects the GPU).
        device: the device this process computes on.
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def _env_int(name: str) -> int:
    value = os.environ[name]
    try:
        return int(value)
    except ValueError:
        raise DistributedSetupError(f"{name}={value!r} is not an integer") from None


def resolve_device(name: str) -> torch.device:
    """``--device``: ``auto`` (CUDA where present, else the CPU), ``cpu`` or ``cuda[:N]``
    (:func:`recurnmt.device.resolve_device`).

    Raises:
        DistributedSetupError: an unknown device, or CUDA asked for where there is none.
    """
    return _resolve_device(name, error=DistributedSetupError)


def init_distributed(device: str = "auto", timeout_s: float = 1800.0) -> DistInfo:
    """Reads the torchrun environment, checks it and joins the process group.

    Raises:
        DistributedSetupError: the environment is partial or inconsistent.
    """
    if "WORLD_SIZE" not in os.environ or _env_int("WORLD_SIZE") == 1:
        return DistInfo(device=resolve_device(device))
    missing = [v for v in _TORCHRUN_VARS if v not in os.environ]
    if missing:
        raise DistributedSetupError(
            f"WORLD_SIZE={os.environ['WORLD_SIZE']} is set but {', '.join(missing)} "
            "are not; launch multi-process training with torchrun, e.g. "
            "`torchrun --nproc_per_node 2 -m recurnmt.vision.training.train ...`"
        )
    rank, world, local = _env_int("RANK"), _env_int("WORLD_SIZE"), _env_int("LOCAL_RANK")
    if world < 1 or not 0 <= rank < world:
        raise DistributedSetupError(f"RANK={rank} is outside WORLD_SIZE={world}")
    local_world = _env_int("LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in os.environ else None
    if local_world is not None and not 0 <= local < local_world:
        raise DistributedSetupError(f"LOCAL_RANK={local} is outside LOCAL_WORLD_SIZE={local_world}")
    dev = resolve_device(device)
    if dev.type == "cuda":
        visible = torch.cuda.device_count()
        if (local_world or local + 1) > visible:
            raise DistributedSetupError(
                f"{local_world or local + 1} processes per node but only {visible} visible "
                "CUDA device(s); set --nproc_per_node to at most the GPU count, or CUDA_VISIBLE_DEVICES"
            )
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
    backend = "nccl" if dev.type == "cuda" else "gloo"
    dist.init_process_group(
        backend,
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=timeout_s),
        device_id=dev if dev.type == "cuda" else None,
    )
    sizes = [None] * world
    dist.all_gather_object(sizes, world)
    if any(s != world for s in sizes):
        raise DistributedSetupError(f"ranks disagree on WORLD_SIZE: {sizes}")
    return DistInfo(rank, world, local, dev)


def check_batch_size(batch_size: int, info: DistInfo, accum_steps: int = 1) -> int:
    """The per-process micro-batch of a global ``batch_size`` split over ranks and steps.

    Raises:
        DistributedSetupError: processes x accumulation steps do not divide the global batch.
    """
    parts = info.world_size * accum_steps
    if accum_steps < 1 or batch_size % parts:
        raise DistributedSetupError(
            f"--batch-size {batch_size} (global) is not divisible by the {info.world_size} "
            f"processes x {accum_steps} accumulation steps; choose a multiple of {parts}"
        )
    return batch_size // parts


def all_reduce_sum(values: list[float], info: DistInfo) -> list[float]:
    """Sums ``values`` over all processes (identity in a single process)."""
    if not info.distributed:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=info.device)
    dist.all_reduce(t)
    return t.tolist()


def cleanup(info: DistInfo, *, synchronize: bool = True) -> None:
    """Leaves the process group.

    Args:
        synchronize: wait for every process first (after a run that ended normally), so that
            no process tears down its connections while another is still saving or
            communicating; gloo can abort a process whose peer left early ("terminate called
            without an active exception"). After an error the others may never arrive, so an
            error skips the wait.
    """
    if info.distributed and dist.is_initialized():
        if synchronize:
            dist.barrier()
        dist.destroy_process_group()


@contextmanager
def process_group(device: str = "auto") -> Iterator[DistInfo]:
    """Joins the run (:func:`init_distributed`) and leaves it at the end (:func:`cleanup`),
    waiting for the others only when the block ended without an error."""
    info = init_distributed(device)
    try:
        yield info
    except BaseException:
        cleanup(info, synchronize=False)
        raise
    cleanup(info)


def unwrap(model: nn.Module) -> nn.Module:
    """The model inside a DistributedDataParallel (or compiled) wrapper."""
    while hasattr(model, "module") or hasattr(model, "_orig_mod"):
        model = getattr(model, "module", None) or model._orig_mod
    return model
