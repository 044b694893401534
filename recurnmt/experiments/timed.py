"""Commands run against a wall-clock budget, their output streamed as it comes.

A check on a rented GPU has minutes, and a command that prints nothing until it ends tells
nothing when it is stopped. :func:`run_streamed` passes every line a child prints to the
terminal and to a log file as it comes (the child runs unbuffered), and stops the child with
its whole process group (benchmark workers included) at its time limit, or when this process is
stopped by Ctrl-C or SIGTERM, keeping what it printed.
:class:`Budget` shares the time left among the steps still to come, in proportion to their
weights, so that an early step that runs long shortens the later ones instead of pushing the
last ones past the end.
"""

from __future__ import annotations

import collections
import contextlib
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Budget:
    """``seconds`` of wall time from ``start`` (``time.monotonic()``), ``reserve`` kept back
    for what follows the last step (writing a report)."""

    seconds: float
    reserve: float = 10.0
    start: float = 0.0

    def __post_init__(self) -> None:
        if self.seconds <= 0:
            raise ValueError(f"--budget {self.seconds:g}: must be a positive number of seconds")
        self.start = self.start or time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def left(self) -> float:
        """Seconds left for steps (the reserve excluded; never negative)."""
        return max(0.0, self.seconds - self.reserve - self.elapsed())

    def share(self, weight: float, later: float) -> float:
        """The time limit of a step of ``weight`` followed by steps weighing ``later``."""
        return self.left() * weight / (weight + later)


@dataclass
class Streamed:
    """How a streamed command ended.

    Attributes:
        returncode: its exit status (negative: killed by that signal).
        timed_out: stopped at its time limit.
        seconds: wall time.
        tail: its last lines of output.
    """

    returncode: int
    timed_out: bool
    seconds: float
    tail: str


def run_streamed(
    cmd: Sequence[str],
    log: Path,
    timeout: float | None = None,
    *,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    tail_lines: int = 40,
) -> Streamed:
    """Runs ``cmd``, its stdout and stderr written line by line to this process's stdout and
    appended to ``log`` as they come; at ``timeout`` seconds, or when this process gets
    SIGINT or SIGTERM (then raised again here), it stops the command's process group (SIGTERM,
    then SIGKILL after 10 s)."""
    env = {**(env if env is not None else os.environ), "PYTHONUNBUFFERED": "1"}
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
    with log.open("a", encoding="utf-8") as sink:
        header = f"+ {shlex.join(cmd)}\n"
        sink.write(header)
        sink.flush()
        sys.stdout.write(header)
        sys.stdout.flush()
        proc = subprocess.Popen(
            list(cmd),
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            start_new_session=True,  # its own process group: stopped with its children
        )

        def pump() -> None:
            for line in proc.stdout:
                sys.stdout.write(line)
                sys.stdout.flush()
                sink.write(line)
                sink.flush()
                tail.append(line)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        timed_out = False
        try:
            with _terminate_raises():
                proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _stop(proc)
        except BaseException:  # Ctrl-C or SIGTERM: the command's children go with this process
            _stop(proc)
            raise
        reader.join(timeout=10)
        note = f"(stopped at its time limit, {timeout:.0f} s)\n" if timed_out else ""
        sink.write(note)
    return Streamed(proc.returncode, timed_out, round(time.monotonic() - start, 1), "".join(tail))


@contextlib.contextmanager
def _terminate_raises():
    """While inside, SIGTERM raises ``SystemExit(143)`` in the main thread, as Ctrl-C raises
    ``KeyboardInterrupt``, so that a stopped run stops the command it waits for (which runs in
    a process group of its own, out of reach of a signal sent to this one's)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminated(signum, frame):
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the process group, SIGKILL if it is still there 10 s later."""
    for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue
