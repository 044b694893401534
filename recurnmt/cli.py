"""Command-line plumbing shared by the vision and analysis commands.

A setting that cannot work (an unknown model, a rank above the width, a missing checkpoint)
raises an exception whose message names the setting or file. At the command line that message is
the whole story, so :func:`run_cli` prints it on one line, ``PROG: error: MESSAGE``, as
argparse does, and exits with 2; ``RECURNMT_TRACEBACK=1`` shows the traceback instead.
Anything else (a ``RuntimeError`` from inside a training step, say) keeps its traceback.
The ``main`` functions themselves raise, so tests and other Python code see the exception.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

# OSError: a missing or unreadable checkpoint or data file (fairseq raises a bare OSError)
USER_ERRORS: tuple[type[BaseException], ...] = (ValueError, KeyError, OSError)


def run_cli(main: Callable[[list[str]], object], prog: str, argv: list[str] | None = None) -> int:
    """Runs ``main(argv)`` and turns a user error into a one-line message.

    Returns:
        The exit code: 0, 2 for a user error, 130 when interrupted.
    """
    try:
        main(sys.argv[1:] if argv is None else argv)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except USER_ERRORS as err:
        if os.environ.get("RECURNMT_TRACEBACK"):
            raise
        # a KeyError's str() is the repr of its argument; show the message itself
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f"{prog}: error: {message}", file=sys.stderr)
        return 2
    return 0


def entry_point(main: Callable[[list[str]], object], prog: str) -> Callable[[], int]:
    """A console-script function (no arguments) running ``main`` under :func:`run_cli`."""

    def cli() -> int:
        return run_cli(main, prog)

    return cli
