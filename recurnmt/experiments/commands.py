"""The commands of the NMT workflows: fairseq's tools and flags, printed and run in order.

Every ``fairseq-train`` and ``fairseq-generate`` command line that recurnmt writes is spelled
here, once: :func:`train_command` and :func:`generate_command` (the tool of this interpreter,
the data directory, the ``--user-dir`` shim, then the caller's flags, which
:func:`fairseq_flags` writes from an ``{option: value}`` mapping). Training
(:mod:`recurnmt.experiments.launch`), the evaluation plan (:mod:`recurnmt.experiments.evaluation`), the
recipes (:mod:`recurnmt.experiments.recipe`) and the scripts (with the flags of
:mod:`recurnmt.experiments.experiment`) all build theirs with them, and run them as :class:`Step`
objects (printed, then run in order) or with :func:`run_logged` (output in a log file, timed).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recurnmt.cli import UserError
from recurnmt.modules import ConfigError

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


def train_command(
    data: str | Path,
    arch: str,
    flags: Sequence[str] = (),
    *,
    start: Sequence[str] | None = None,
) -> list[str]:
    """``fairseq-train DATA --user-dir USER_DIR --arch ARCH FLAGS...``.

    Args:
        data: the binarized data directory.
        arch: a registered architecture.
        flags: the rest of the command line, in order (later flags win in fairseq).
        start: what runs fairseq-train: this interpreter's ``fairseq-train`` by default, the
            launcher's command (:func:`recurnmt.experiments.launch.cpu_train_command`), or ``()`` for
            the arguments alone (the launcher adds its own start).
    """
    start = fairseq_tool("train") if start is None else start
    return [*start, str(data), "--user-dir", str(user_dir()), "--arch", arch, *flags]


def generate_command(
    data: str | Path, checkpoint: str | Path, flags: Sequence[str] = ()
) -> list[str]:
    """``fairseq-generate DATA --user-dir USER_DIR --path CHECKPOINT FLAGS...``."""
    return [
        *fairseq_tool("generate"),
        str(data),
        "--user-dir",
        str(user_dir()),
        "--path",
        str(checkpoint),
        *flags,
    ]


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
    from recurnmt.nmt.quiet import quiet_env

    env = quiet_env(dict(os.environ))
    for step in steps:
        print(f"$ {step}", flush=True)
        if dry_run:
            continue
        if step.stdout is None:
            status = subprocess.run(step.argv, env=env).returncode
        else:
            step.stdout.parent.mkdir(parents=True, exist_ok=True)
            with step.stdout.open("w", encoding="utf-8") as out:
                status = subprocess.run(step.argv, stdout=out, env=env).returncode
        if status:
            print(f"step failed with exit status {status}: {step}", file=sys.stderr)
            return status
    return 0


def run_logged(
    cmd: Sequence[str],
    log: Path,
    *,
    stdout: Path | None = None,
    show_stderr: bool = False,
    cwd: Path | None = None,
) -> float:
    """Runs one command with its output in ``log`` (stdout in ``stdout`` if given).

    Args:
        cmd: the command line; written at the top of ``log``.
        log: receives stdout and stderr (stderr only when ``stdout`` is given).
        stdout: a file for the command's stdout (fairseq-generate's translations).
        show_stderr: let stderr (fairseq's progress bar) reach the terminal instead.
        cwd: the working directory.

    Returns:
        The wall time in seconds.

    Raises:
        UserError: the command failed; the message quotes the end of its log.
    """
    from recurnmt.nmt.quiet import quiet_env

    env = quiet_env(dict(os.environ, PYTHONUNBUFFERED="1"))
    start = time.time()
    with log.open("w", encoding="utf-8") as log_f:
        log_f.write(f"$ {shlex.join(cmd)}\n")
        log_f.flush()
        out_f = stdout.open("w", encoding="utf-8") if stdout else log_f
        try:
            status = subprocess.run(
                list(cmd), cwd=cwd, env=env, stdout=out_f, stderr=None if show_stderr else log_f
            ).returncode
        finally:
            if stdout:
                out_f.close()
    if status:
        tail = "\n".join(log.read_text(encoding="utf-8").splitlines()[-15:])
        raise UserError(f"{cmd[0]} failed with exit status {status} (log: {log}):\n{tail}")
    return time.time() - start
