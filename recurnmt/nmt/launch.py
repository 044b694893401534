"""Multi-process ``fairseq-train`` on CPUs (gloo) or GPUs (nccl), one node or several.

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
* ``--fp16`` / ``--bf16`` on CPU: ``Torch not compiled with CUDA`` or an ``xla_device`` error.

:func:`check_distributed` refuses all of these with a message that says what to do instead;
:class:`RecurrentTransformerModel` calls it when fairseq builds the model, and the launcher
calls it before it starts any process. The launcher builds the flags that work:

* ``--launcher fairseq`` (default): one ``fairseq-train`` per local rank with explicit
  ``--distributed-world-size/--distributed-rank/--distributed-init-method tcp://...
  --distributed-no-spawn --device-id``;
* ``--launcher torchrun``: ``torchrun ... -m recurnmt.nmt.launch --torchrun-worker -- ARGS``;
  the worker turns torchrun's ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` into the same flags with
  ``env://``, so it works on CPUs as well as GPUs;
* on CPU it adds ``--cpu --distributed-backend gloo --ddp-backend legacy_ddp``; on GPUs
  fairseq's defaults (nccl, pytorch_ddp).

Command line (``scripts/train_nmt.py`` is the same)::

    python -m recurnmt.nmt.launch --nproc 2 --device cpu -- DATA --arch ringformer_tiny ...
    python -m recurnmt.nmt.launch --nproc 8 --launcher torchrun -- DATA --arch ...
    # two nodes, 8 GPUs each; run on each node with its --node-rank
    python -m recurnmt.nmt.launch --nnodes 2 --node-rank 0 --nproc 8 \\
        --master-addr node0.example --master-port 29500 -- DATA --arch ...
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from recurnmt.modules import ConfigError

DEVICES = ("cpu", "cuda")
LAUNCHERS = ("fairseq", "torchrun")
# flags the launcher owns: a user value would contradict the processes it starts
OWNED_FLAGS = (
    "--distributed-world-size",
    "--distributed-rank",
    "--distributed-init-method",
    "--distributed-no-spawn",
    "--distributed-port",
    "--device-id",
)
PRECISION_FLAGS = ("fp16", "bf16", "memory_efficient_fp16", "memory_efficient_bf16", "amp")
_BIN = Path(sys.executable).parent


def fairseq_tool(tool: str) -> list[str]:
    """The command that runs ``fairseq-{tool}`` with this interpreter."""
    script = _BIN / f"fairseq-{tool}"
    return [str(script)] if script.is_file() else [sys.executable, "-m", f"fairseq_cli.{tool}"]


def user_dir() -> Path:
    """Absolute path of the ``--user-dir`` shim that registers recurnmt with fairseq.

    Raises:
        ConfigError: the shim is missing (recurnmt installed without its source tree).
    """
    path = Path(__file__).resolve().parents[2] / "user_dir"
    if not (path / "__init__.py").is_file():
        raise ConfigError(
            f"fairseq's --user-dir shim {path} is missing: install recurnmt from its source "
            "tree (pip install -e .) so that user_dir/ sits beside the package"
        )
    return path


def fairseq_flags(options: Mapping[str, Any]) -> list[str]:
    """Command-line flags of a ``{option: value}`` mapping, fairseq's spelling.

    ``lr_scheduler: cosine`` -> ``--lr-scheduler cosine``; ``True`` -> the bare flag;
    ``False`` / ``None`` -> nothing; a list -> the flag followed by its items.
    """
    flags: list[str] = []
    for key, value in options.items():
        if value is None or value is False:
            continue
        flag = "--" + str(key).replace("_", "-")
        if value is True:
            flags.append(flag)
        elif isinstance(value, list | tuple):
            flags += [flag, *(str(v) for v in value)]
        else:
            flags += [flag, str(value)]
    return flags


@dataclass(frozen=True)
class Step:
    """One command of a workflow, with an optional file that receives its stdout."""

    argv: tuple[str, ...]
    stdout: Path | None = None

    def __str__(self) -> str:
        line = shlex.join(self.argv)
        return f"{line} > {shlex.quote(str(self.stdout))}" if self.stdout else line


def run_steps(steps: Sequence[Step], dry_run: bool = False) -> int:
    """Prints and runs ``steps`` in order; stops at the first failure.

    Returns:
        0, or the exit status of the step that failed.
    """
    for step in steps:
        print(f"$ {step}", flush=True)
        if dry_run:
            continue
        if step.stdout is None:
            status = subprocess.run(step.argv).returncode
        else:
            step.stdout.parent.mkdir(parents=True, exist_ok=True)
            with step.stdout.open("w", encoding="utf-8") as out:
                status = subprocess.run(step.argv, stdout=out).returncode
        if status:
            print(f"step failed with exit status {status}: {step}", file=sys.stderr)
            return status
    return 0


# --- the checks --------------------------------------------------------------------------------


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
        f"use `python -m recurnmt.nmt.launch --nproc {world} [--launcher torchrun] -- ARGS` "
        "(scripts/train_nmt.py), which passes the world size and the ranks"
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
    wants_half = [f for f in PRECISION_FLAGS if getattr(args, f, False)]
    if wants_half and on_cpu and (explicit_cpu or not runtime or world > 1 or training):
        flags = " ".join("--" + f.replace("_", "-") for f in wants_half)
        problems.append(
            f"{flags} needs CUDA; on CPU fairseq fails with unrelated-looking errors "
            "('Torch not compiled with CUDA enabled', an xla_device AttributeError). "
            "Drop the flag or train on GPUs"
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
    """Refuses fairseq multi-process configurations that fail silently or obscurely.

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
        raise ConfigError(
            "refusing this fairseq training configuration:\n"
            + "\n".join(f"  - {p}" for p in problems)
        )


# --- building the commands ---------------------------------------------------------------------


@dataclass(frozen=True)
class LaunchPlan:
    """Where and how many training processes run.

    Attributes:
        nproc: processes on this node (one per GPU on GPUs).
        nnodes: nodes taking part; every node runs the launcher with its ``node_rank``.
        node_rank: this node's index, ``0 <= node_rank < nnodes``.
        master_addr: address of node 0 (the rendezvous host).
        master_port: a free TCP port on node 0; chosen automatically on one node.
        device: ``cpu`` or ``cuda``.
        launcher: ``fairseq`` (explicit per-rank flags) or ``torchrun``.
    """

    nproc: int = 1
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int | None = None
    device: str = "cpu"
    launcher: str = "fairseq"

    def __post_init__(self) -> None:
        if self.nproc < 1 or self.nnodes < 1:
            raise ConfigError(f"--nproc {self.nproc} / --nnodes {self.nnodes} must be >= 1")
        if not 0 <= self.node_rank < self.nnodes:
            raise ConfigError(f"--node-rank {self.node_rank} must lie in [0, {self.nnodes})")
        if self.device not in DEVICES:
            raise ConfigError(f"--device {self.device!r}: choose one of {DEVICES}")
        if self.launcher not in LAUNCHERS:
            raise ConfigError(f"--launcher {self.launcher!r}: choose one of {LAUNCHERS}")
        if self.nnodes > 1 and self.master_port is None:
            raise ConfigError(
                "several nodes need --master-addr (node 0's address, reachable from every "
                "node) and --master-port (the same on every node)"
            )

    @property
    def world_size(self) -> int:
        return self.nproc * self.nnodes


def _has_flag(argv: Sequence[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in argv)


def _flag_value(argv: Sequence[str], flag: str) -> str | None:
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def device_flags(plan: LaunchPlan, argv: Sequence[str]) -> list[str]:
    """Device and backend flags for ``plan`` that ``argv`` does not set itself.

    Raises:
        ConfigError: ``argv`` sets a flag the launcher owns, or ``--cpu`` on a CUDA plan.
    """
    owned = [f for f in OWNED_FLAGS if _has_flag(argv, f)]
    if owned:
        raise ConfigError(
            f"{', '.join(owned)}: the launcher sets these from --nproc/--nnodes/--node-rank; "
            "remove them from the fairseq-train arguments"
        )
    flags: list[str] = []
    if plan.device == "cpu":
        if not _has_flag(argv, "--cpu"):
            flags.append("--cpu")
        if plan.world_size > 1:
            if not _has_flag(argv, "--distributed-backend"):
                flags += ["--distributed-backend", "gloo"]
            if not _has_flag(argv, "--ddp-backend"):
                flags += ["--ddp-backend", "legacy_ddp"]
    elif _has_flag(argv, "--cpu"):
        raise ConfigError("--cpu contradicts --device cuda")
    elif plan.world_size > 1 and not _has_flag(argv, "--distributed-backend"):
        flags += ["--distributed-backend", "nccl"]
    return flags


def rank_flags(plan: LaunchPlan, local_rank: int, init_method: str) -> list[str]:
    """fairseq's explicit flags for one process of a multi-process run."""
    return [
        "--distributed-world-size",
        str(plan.world_size),
        "--distributed-rank",
        str(plan.node_rank * plan.nproc + local_rank),
        "--distributed-init-method",
        init_method,
        "--distributed-no-spawn",
        "--device-id",
        str(local_rank if plan.device == "cuda" else 0),
    ]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def rank_commands(plan: LaunchPlan, argv: Sequence[str], port: int) -> list[list[str]]:
    """``--launcher fairseq``: one ``fairseq-train`` command per local process."""
    base = [*fairseq_tool("train"), *argv, *device_flags(plan, argv)]
    if plan.world_size == 1:
        return [base]
    init = f"tcp://{plan.master_addr}:{port}"
    return [base + rank_flags(plan, r, init) for r in range(plan.nproc)]


def torchrun_command(plan: LaunchPlan, argv: Sequence[str], port: int) -> list[str]:
    """``--launcher torchrun``: the torchrun command that starts this node's workers."""
    device_flags(plan, argv)  # validate before anything starts
    run = [sys.executable, "-m", "torch.distributed.run"]
    torchrun = _BIN / "torchrun"
    if torchrun.is_file():
        run = [str(torchrun)]
    return [
        *run,
        "--nnodes",
        str(plan.nnodes),
        "--node-rank",
        str(plan.node_rank),
        "--nproc-per-node",
        str(plan.nproc),
        "--master-addr",
        plan.master_addr,
        "--master-port",
        str(port),
        "-m",
        "recurnmt.nmt.launch",
        "--torchrun-worker",
        "--device",
        plan.device,
        "--",
        *argv,
    ]


def worker_argv(
    argv: Sequence[str], device: str, environ: Mapping[str, str] | None = None
) -> list[str]:
    """The fairseq-train arguments of one torchrun worker (torchrun's env -> fairseq flags).

    Raises:
        ConfigError: torchrun's variables are missing (not started by torchrun).
    """
    environ = os.environ if environ is None else environ
    needed = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    missing = [v for v in needed if v not in environ]
    if missing:
        raise ConfigError(
            f"--torchrun-worker runs under torchrun, which sets {', '.join(missing)}; "
            "use --launcher torchrun instead of calling it directly"
        )
    world, rank, local = (int(environ[v]) for v in ("WORLD_SIZE", "RANK", "LOCAL_RANK"))
    plan = LaunchPlan(nproc=world, device=device)  # world size and device only
    flags = device_flags(plan, argv)
    return [
        *argv,
        *flags,
        "--distributed-world-size",
        str(world),
        "--distributed-rank",
        str(rank),
        "--distributed-init-method",
        "env://",
        "--distributed-no-spawn",
        "--device-id",
        str(local if device == "cuda" else 0),
    ]


def parse_train_args(argv: Sequence[str]) -> Any:
    """fairseq's parsed training arguments of ``argv`` (imports ``--user-dir``)."""
    from fairseq import options

    parser = options.get_training_parser()
    return options.parse_args_and_arch(parser, list(argv))


def check_launch(plan: LaunchPlan, argv: Sequence[str]) -> None:
    """Refuses a launch before any process starts (see :func:`check_distributed`).

    Raises:
        ConfigError: the plan cannot work on this machine or the flags would fail.
    """
    if plan.device == "cuda":
        have = torch.cuda.device_count()
        if have == 0:
            raise ConfigError("--device cuda but no CUDA device is visible: use --device cpu")
        if plan.nproc > have:
            raise ConfigError(
                f"--nproc {plan.nproc} processes on {have} visible GPU(s): NCCL needs one GPU "
                "per process (lower --nproc, or use --device cpu)"
            )
    full = [*argv, *device_flags(plan, argv)]
    if plan.world_size > 1:
        full += rank_flags(plan, 0, f"tcp://{plan.master_addr}:1")
    args = parse_train_args(full)
    check_distributed(
        args, world_size=plan.world_size, environ={}, cuda_available=plan.device == "cuda"
    )


def _thread_env(plan: LaunchPlan) -> dict[str, str]:
    env = dict(os.environ)
    if plan.device == "cpu" and plan.nproc > 1 and "OMP_NUM_THREADS" not in env:
        # N processes on a shared CPU: without this each starts one thread per core
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // plan.nproc))
    return env


def supervise(commands: Sequence[Sequence[str]], env: Mapping[str, str]) -> int:
    """Runs ``commands`` together; the first failure stops the others (they would hang).

    Returns:
        0 when every process succeeded, else the first non-zero exit status.
    """

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt  # a killed launcher takes its workers with it

    try:
        previous = signal.signal(signal.SIGTERM, stop)
    except ValueError:  # not the main thread
        previous = None
    procs = [subprocess.Popen(list(c), env=dict(env)) for c in commands]
    status = 0
    try:
        while True:
            codes = [p.poll() for p in procs]  # poll every process, every time
            failed = [c for c in codes if c not in (None, 0)]
            if failed:
                status = failed[0]
                break
            if all(c == 0 for c in codes):
                break
            time.sleep(0.2)
    except KeyboardInterrupt:
        status = 130
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.time() + 30
        for p in procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    if status == 0:
        status = next((p.returncode for p in procs if p.returncode), 0)
    return status


def launch(plan: LaunchPlan, argv: Sequence[str], dry_run: bool = False, check: bool = True) -> int:
    """Checks, prints and runs the training processes of ``plan`` on this node.

    Args:
        plan: processes, nodes, device and launcher.
        argv: the fairseq-train arguments (data directory first), without distributed flags.
        dry_run: print the commands only.
        check: run :func:`check_launch` first (parses ``argv`` with fairseq).

    Returns:
        The exit status (0 on success).
    """
    if check:
        check_launch(plan, argv)
    port = plan.master_port or (free_port() if plan.world_size > 1 else 0)
    if plan.launcher == "torchrun" and plan.world_size > 1:
        commands = [torchrun_command(plan, argv, port)]
    else:
        commands = rank_commands(plan, argv, port)
    for command in commands:
        print(f"$ {shlex.join(command)}", flush=True)
    if dry_run:
        return 0
    return supervise(commands, _thread_env(plan))


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    """The launcher's options (shared with ``python -m recurnmt.nmt.recipe run``)."""
    parser.add_argument("--nproc", type=int, default=1, help="processes on this node")
    parser.add_argument("--nnodes", type=int, default=1, help="nodes taking part")
    parser.add_argument("--node-rank", type=int, default=0, help="this node's index")
    parser.add_argument("--master-addr", default="127.0.0.1", help="node 0's address")
    parser.add_argument("--master-port", type=int, help="free port on node 0")
    parser.add_argument("--device", choices=DEVICES, help="default: cuda when available, else cpu")
    parser.add_argument("--launcher", choices=LAUNCHERS, default="fairseq")


def plan_from_args(args: argparse.Namespace) -> LaunchPlan:
    """The :class:`LaunchPlan` of parsed :func:`add_plan_arguments` options."""
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    return LaunchPlan(
        nproc=args.nproc,
        nnodes=args.nnodes,
        node_rank=args.node_rank,
        master_addr=args.master_addr,
        master_port=args.master_port,
        device=device,
        launcher=args.launcher,
    )


def _split_dashes(argv: list[str]) -> tuple[list[str], list[str]]:
    if "--" not in argv:
        return argv, []
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1 :]


def main(argv: list[str] | None = None) -> int:
    """``python -m recurnmt.nmt.launch [OPTIONS] -- FAIRSEQ_TRAIN_ARGS``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    ours, train_argv = _split_dashes(argv)
    parser = argparse.ArgumentParser(
        prog="python -m recurnmt.nmt.launch",
        description="Start fairseq-train on one or several processes (CPU gloo / CUDA nccl).",
        epilog="Arguments after -- go to fairseq-train (the data directory first).",
    )
    add_plan_arguments(parser)
    parser.add_argument("--dry-run", action="store_true", help="print the commands only")
    parser.add_argument("--torchrun-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(ours)
    if not train_argv:
        parser.error("give the fairseq-train arguments after --")
    try:
        if args.torchrun_worker:
            from fairseq_cli.train import cli_main

            device = args.device or "cpu"
            sys.argv = ["fairseq-train", *worker_argv(train_argv, device)]
            cli_main()
            return 0
        return launch(plan_from_args(args), train_argv, dry_run=args.dry_run)
    except ConfigError as e:
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
