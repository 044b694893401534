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


def run_cli(main: Callable[[], object], name: str) -> int:
    """Run a command's ``main`` and turn failures into a one-line message and exit code.

    SIGTERM is turned into ``KeyboardInterrupt`` so that temporary output is removed (the
    atomic-output context managers clean up on any exception) rather than left behind.

    Args:
        main: The command body; an ``int`` result is the exit code, anything else means 0.
        name: Command name for messages, e.g. ``"data_prep.embedded"``.

    Returns:
        The process exit code (0 success, 1 error, 130 interrupted).
    """
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        result = main()
        return result if isinstance(result, int) else 0
    except KeyboardInterrupt:
        print(f"{name}: interrupted; no partial output was left behind", file=sys.stderr)
        return 130
    except EXPECTED_ERRORS as err:
        print(f"{name}: error: {err}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous)
