"""Shared command-line plumbing: clean error messages and atomic behaviour on SIGTERM."""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from types import FrameType

from data_prep.errors import PrepError

# Errors whose message is the whole story; anything else keeps its traceback.
EXPECTED_ERRORS: tuple[type[BaseException], ...] = (PrepError, FileExistsError, FileNotFoundError)


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def run_cli(main: Callable[[], int | None], name: str) -> int:
    """Run a command's ``main`` and turn failures into a one-line message and exit code.

    SIGTERM is turned into ``KeyboardInterrupt`` so that temporary output is removed (the
    atomic-output context managers clean up on any exception) rather than left behind.

    Args:
        main: The command body; returns an exit code or ``None`` for success.
        name: Command name for messages, e.g. ``"data_prep.embedded"``.

    Returns:
        The process exit code (0 success, 1 error, 130 interrupted).
    """
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        return int(main() or 0)
    except KeyboardInterrupt:
        print(f"{name}: interrupted; no partial output was left behind", file=sys.stderr)
        return 130
    except EXPECTED_ERRORS as err:
        print(f"{name}: error: {err}", file=sys.stderr)
        return 1
