"""The commands of the NMT workflows: fairseq's tools and flags, printed and run in order.

Training (:mod:`recurnmt.runs.launch`), the evaluation plan (:mod:`recurnmt.runs.evaluation`)
and the recipes (:mod:`recurnmt.runs.recipe`) all build ``fairseq-*`` command lines with the
``--user-dir`` shim and run them as :class:`Step` objects; the spelling lives here, below
all three.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
