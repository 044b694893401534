"""Multi-process ``fairseq-train`` on CPUs (gloo) or GPUs (nccl), one node or several.

Before it starts any process, the launcher refuses the flag combinations that fail silently
or obscurely (:func:`recurnmt.nmt.distributed_checks.check_distributed`), then builds the
flags that work:

* ``--launcher fairseq`` (default): one ``fairseq-train`` per local rank with explicit
  ``--distributed-world-size/--distributed-rank/--distributed-init-method tcp://...
  --distributed-no-spawn --device-id``;
* ``--launcher torchrun``: ``torchrun ... -m recurnmt.experiments.launch --torchrun-worker -- ARGS``;
  the worker turns torchrun's ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` into the same flags with
  ``env://``, so it works on CPUs as well as GPUs;
* on CPU it adds ``--cpu --distributed-backend gloo --ddp-backend legacy_ddp``; on GPUs
  fairseq's defaults (nccl, pytorch_ddp);
* with several processes, ``--load-checkpoint-on-all-dp-ranks``: otherwise rank 0 reads a
  checkpoint (``--restore-file``, ``--finetune-from-model``, resuming from
  ``checkpoint_last.pt``) and sends the whole state to the others through ``torch.save``, and
  their ``torch.load`` (weights-only since torch 2.6) refuses the omegaconf configuration in it
  (``Unsupported global: omegaconf.dictconfig.DictConfig``): every rank reads the file instead,
  which needs the checkpoint visible to every process (one node, or shared storage).

Command line (``recurnmt-train-nmt``, also ``python -m recurnmt.experiments.launch``)::

    recurnmt-train-nmt -- DATA --user-dir user_dir --arch ringformer_tiny ...  # one process
    recurnmt-train-nmt --nproc 2 --device cpu -- DATA --arch ringformer_tiny ...
    recurnmt-train-nmt --nproc 8 --launcher torchrun -- DATA --arch ...
    # two nodes, 8 GPUs each; run on each node with its --node-rank
    recurnmt-train-nmt --nnodes 2 --node-rank 0 --nproc 8 \\
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

from recurnmt.cli import entry_point
from recurnmt.experiments.commands import fairseq_tool
from recurnmt.modules import ConfigError
from recurnmt.nmt.distributed_checks import check_distributed

PROG = "recurnmt-train-nmt"  # also python -m recurnmt.experiments.launch
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
_BIN = Path(sys.executable).parent


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


def cpu_train_command(nproc: int) -> list[str]:
    """The start of a command that trains on this machine's CPU: ``fairseq-train --cpu``, or
    with ``nproc`` > 1 this launcher (one ``fairseq-train`` per process, gloo); the training
    arguments follow it.
    """
    if nproc > 1:
        return [
            sys.executable,
            "-m",
            "recurnmt.experiments.launch",
            "--nproc",
            str(nproc),
            "--device",
            "cpu",
            "--",
        ]
    return [*fairseq_tool("train"), "--cpu"]


def _has_flag(argv: Sequence[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in argv)


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
    if plan.world_size > 1 and not _has_flag(argv, "--load-checkpoint-on-all-dp-ranks"):
        # rank 0's broadcast of a loaded checkpoint fails under weights-only torch.load
        flags.append("--load-checkpoint-on-all-dp-ranks")
    return flags


# fairseq logs only on rank 0 (the others log warnings), but every rank draws its own progress
# bar: on a terminal the bars of ranks > 0 overwrite the master's with the same figures
QUIET_RANK = ("--log-format", "none")


def rank_flags(plan: LaunchPlan, local_rank: int, init_method: str) -> list[str]:
    """fairseq's explicit flags for one process of a multi-process run."""
    rank = plan.node_rank * plan.nproc + local_rank
    return [
        "--distributed-world-size",
        str(plan.world_size),
        "--distributed-rank",
        str(rank),
        "--distributed-init-method",
        init_method,
        "--distributed-no-spawn",
        "--device-id",
        str(local_rank if plan.device == "cuda" else 0),
        *(QUIET_RANK if rank else ()),
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
        "recurnmt.experiments.launch",
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
        *(QUIET_RANK if rank else ()),
    ]


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
    from recurnmt.nmt.build import parse_train_args  # fairseq: only when checking

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
    """The launcher's options (shared with ``recurnmt-run-nmt-recipe run``)."""
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
    """``recurnmt-train-nmt [OPTIONS] -- FAIRSEQ_TRAIN_ARGS``; the exit status.

    Raises:
        ConfigError: a plan or flags that cannot work (names the option).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    ours, train_argv = _split_dashes(argv)
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Start fairseq-train on one or several processes (CPU gloo / CUDA nccl).",
        epilog="Arguments after -- go to fairseq-train (the data directory first).",
    )
    add_plan_arguments(parser)
    parser.add_argument("--dry-run", action="store_true", help="print the commands only")
    parser.add_argument("--torchrun-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(ours)
    if not train_argv:
        parser.error("give the fairseq-train arguments after --")
    if args.torchrun_worker:
        from fairseq_cli.train import cli_main

        device = args.device or "cpu"
        sys.argv = ["fairseq-train", *worker_argv(train_argv, device)]
        cli_main()
        return 0
    return launch(plan_from_args(args), train_argv, dry_run=args.dry_run)


cli = entry_point(main, PROG)  # the console script

if __name__ == "__main__":
    sys.exit(cli())
