"""The fairseq training configurations that fail silently or obscurely, refused up front.

fairseq trains on several processes only with the right combination of flags, and several
wrong combinations fail silently or with unrelated-looking errors (seen on fairseq-fixed
0.12.3.1, torch 2.13, CPU):

* ``torchrun`` without ``--distributed-world-size``: every process trains its own model into
  the same ``--save-dir`` (fairseq ignores torchrun's environment when the world size is 1);
* ``--distributed-init-method`` without ``--distributed-no-spawn`` on CPU: fairseq spawns
  ``min(#GPUs, world size) = 0`` processes and exits 0 without training;
* ``torchrun ... --distributed-world-size N`` on CPU: ``ZeroDivisionError`` (fairseq takes the
  rank modulo the GPU count);
* the default ``--ddp-backend pytorch_ddp`` on CPU: a ``device_ids`` ValueError from
  DistributedDataParallel; the default ``--distributed-backend nccl`` on CPU: no NCCL;
* a criterion whose logging outputs cannot be summed (fairseq then gathers them with
  ``all_gather_list``, which allocates a CUDA tensor): a crash after the first update on CPU;
* ``--fp16`` / ``--amp`` on CPU: ``Torch not compiled with CUDA``;
* ``--bf16`` / ``--memory-efficient-bf16`` anywhere but on a TPU: fairseq-train's argument
  parser sets ``--tpu`` whenever ``--bf16`` is given (``fairseq/options.py``), and the
  Trainer then asks ``torch_xla`` for its device: ``AttributeError: 'NoneType' object has no
  attribute 'xla_device'`` without torch_xla, on a CPU and (by the same code path) a GPU.

:func:`check_distributed` refuses all of these with a message that says what to do instead.
Two callers, both above this module: :class:`recurnmt.nmt.model.RecurrentTransformerModel`
when fairseq builds the model, and :mod:`recurnmt.experiments.launch` before it starts any process.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Mapping
from typing import Any

import torch

from recurnmt.modules import ConfigError

PRECISION_FLAGS = ("fp16", "bf16", "memory_efficient_fp16", "memory_efficient_bf16", "amp")
BF16_FLAGS = ("bf16", "memory_efficient_bf16")  # fairseq-train: TPU only (torch_xla)


def _has_torch_xla() -> bool:
    return importlib.util.find_spec("torch_xla") is not None


def _env_int(environ: Mapping[str, str], name: str) -> int | None:
    value = environ.get(name)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _runtime_world_size() -> int:
    dist = torch.distributed
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _summable_logging(criterion: str | None) -> bool:
    if criterion is None:
        return True
    from fairseq.criterions import CRITERION_REGISTRY

    cls = CRITERION_REGISTRY.get(criterion)
    return cls is None or bool(cls.logging_outputs_can_be_summed())


def _launcher_hint(world: int) -> str:
    return (
        f"use `recurnmt-train-nmt --nproc {world} [--launcher torchrun] -- ARGS` "
        "(python -m recurnmt.experiments.launch), which passes the world size and the ranks"
    )


def distributed_problems(
    args: Any,
    *,
    world_size: int | None = None,
    environ: Mapping[str, str] | None = None,
    cuda_available: bool | None = None,
) -> list[str]:
    """What would make this fairseq training run fail or silently go wrong.

    Args:
        args: fairseq's parsed training arguments (``cfg.model`` of a legacy model holds them
            all).
        world_size: the number of processes about to be started (the launcher's view); when
            ``None``, the running process group's (fairseq's ``build_model`` view: fairseq has
            initialised it by then, and never does for generation).
        environ: the process environment (``os.environ`` by default); torchrun's
            ``WORLD_SIZE`` and SLURM's task count reveal a multi-process launch.
        cuda_available: whether CUDA can be used (``torch.cuda.is_available()`` by default).

    Returns:
        One message per problem, empty when the configuration is fine.
    """
    runtime = world_size is None
    world = _runtime_world_size() if runtime else world_size
    environ = os.environ if environ is None else environ
    cuda = torch.cuda.is_available() if cuda_available is None else cuda_available
    explicit_cpu = bool(getattr(args, "cpu", False))
    on_cpu = explicit_cpu or not cuda
    problems: list[str] = []

    launched = _env_int(environ, "WORLD_SIZE")
    if launched is not None and launched > 1 and world != launched:
        problems.append(
            f"torchrun started {launched} processes (WORLD_SIZE={launched}) but fairseq "
            f"trains in a world of {world}: each process would train its own model into the "
            "same --save-dir and overwrite the others' checkpoints. "
            + _launcher_hint(launched).capitalize()
            + (
                "; on GPUs, adding --distributed-world-size "
                f"{launched} to fairseq-train also works (not on CPU: fairseq divides by the "
                "GPU count)"
            )
        )
    tasks = _env_int(environ, "SLURM_NTASKS")
    if tasks is not None and tasks > 1 and "SLURM_PROCID" in environ and world == 1:
        problems.append(
            f"SLURM started {tasks} tasks but fairseq trains in a world of 1: each task would "
            "train its own model into the same --save-dir. Pass --distributed-world-size "
            f"{tasks} (fairseq then reads SLURM's ranks), or " + _launcher_hint(tasks)
        )

    # a checkpoint trained with --fp16 on GPUs may be decoded on a CPU machine, so outside
    # training (no process group, not fairseq-train) only an explicit --cpu refuses it
    training = "fairseq_cli.train" in sys.modules
    checked = explicit_cpu or not runtime or world > 1 or training
    wants_bf16 = [f for f in BF16_FLAGS if getattr(args, f, False)]
    if wants_bf16 and checked and not _has_torch_xla():
        flags = " ".join("--" + f.replace("_", "-") for f in wants_bf16)
        problems.append(
            f"{flags} needs a TPU: fairseq-train turns --bf16 into --tpu (fairseq/options.py) "
            "and then fails without torch_xla ('NoneType' object has no attribute "
            "'xla_device'), on CPU and GPU alike. On GPUs train with --fp16 or --amp; the "
            "models themselves run in bf16 (model.to(torch.bfloat16), torch.autocast)"
        )
    wants_half = [f for f in PRECISION_FLAGS if getattr(args, f, False) and f not in BF16_FLAGS]
    if wants_half and on_cpu and checked:
        flags = " ".join("--" + f.replace("_", "-") for f in wants_half)
        problems.append(
            f"{flags} needs CUDA; on CPU fairseq fails with unrelated-looking errors "
            "('Torch not compiled with CUDA enabled'). Drop the flag or train on GPUs"
        )

    if world > 1 and on_cpu:
        ddp = getattr(args, "ddp_backend", "pytorch_ddp")
        if ddp in ("pytorch_ddp", "c10d", "fully_sharded"):
            problems.append(
                f"--ddp-backend {ddp} does not work on CPU (fairseq wraps the model with "
                "device_ids=[device], which DistributedDataParallel rejects for CPU modules): "
                "use --ddp-backend legacy_ddp"
            )
        if getattr(args, "distributed_backend", "nccl") == "nccl":
            problems.append(
                "--distributed-backend nccl needs GPUs (fairseq's default): use "
                "--distributed-backend gloo on CPU"
            )
        if getattr(args, "distributed_init_method", None) and not getattr(
            args, "distributed_no_spawn", False
        ):
            problems.append(
                "--distributed-init-method without --distributed-no-spawn on CPU: fairseq "
                "spawns one process per GPU, i.e. none, and exits 0 without training. Start "
                "one process per rank with --distributed-rank R --distributed-no-spawn, or "
                + _launcher_hint(world)
            )
        criterion = getattr(args, "criterion", None)
        if not _summable_logging(criterion):
            problems.append(
                f"--criterion {criterion} has logging outputs that cannot be summed, so "
                "fairseq gathers them across processes with all_gather_list, which allocates "
                "a CUDA tensor: on CPU the run crashes after its first update. Train on GPUs, "
                "in one process, or with a criterion whose logging_outputs_can_be_summed() is "
                "True (e.g. label_smoothed_cross_entropy for models without ACT/mixed depth)"
            )
    return problems


def check_distributed(
    args: Any,
    *,
    world_size: int | None = None,
    environ: Mapping[str, str] | None = None,
    cuda_available: bool | None = None,
) -> None:
    """Refuses fairseq configurations that fail silently or obscurely.

    Called with ``args`` alone from ``RecurrentTransformerModel.build_model`` (inside the
    training process, after fairseq set up its process group) and with ``world_size`` by the
    launcher before it starts any process. See :func:`distributed_problems` for the
    arguments.

    Raises:
        ConfigError: naming every problem found and what to do instead.
    """
    problems = distributed_problems(
        args, world_size=world_size, environ=environ, cuda_available=cuda_available
    )
    if problems:
        # the first problem on the first line (the one-line error of a command), others below
        raise ConfigError("refusing this fairseq training configuration: " + "\n".join(problems))
