"""How every command of recurnmt and data_prep ends: one helper, one format, one exit code.

A setting that cannot work (an unknown model, a rank above the width, a missing checkpoint)
raises an exception whose message names the setting or file. At the command line that message
is the whole story, so :func:`run_cli` prints it as argparse prints a usage error,
``PROG: error: MESSAGE`` on one line of stderr, and exits with 2, argparse's own code for a
bad command line. Further lines of a message (the tail of a failed tool's output) follow,
indented. ``RECURNMT_TRACEBACK=1`` shows the traceback instead. Anything else (a
``RuntimeError`` from inside a training step, say) keeps its traceback: that is a bug or a
crash, not a user error. The ``main`` functions themselves raise, so tests and other Python
code can catch the exception; the command line runs them through :func:`run_cli`.

Ctrl-C, and SIGTERM (a scheduler stopping a job), end a command with ``PROG: interrupted``
and exit code 130, after the ``finally`` blocks and context managers have run (data_prep
removes its partial output that way).

Every command module follows one pattern::

    def main(argv: list[str] | None = None) -> ...:  # raises on a user error
        ...

    cli = entry_point(main, "python -m recurnmt.x")  # console scripts point here

    if __name__ == "__main__":
        sys.exit(cli())

This module imports nothing beyond the standard library: ``data_prep`` uses it too.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Sequence
from types import FrameType

EXIT_USER_ERROR = 2  # argparse exits with 2 on a bad command line too
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what shells report for Ctrl-C


class UserError(Exception):
    """A failure whose message explains it fully (no traceback): a refused download, a tool
    that rejected its input. Settings and files raise ``ValueError`` / ``OSError`` instead."""


# OSError: a missing or unreadable checkpoint or data file (fairseq raises a bare OSError);
# ValueError includes recurnmt.modules.ConfigError; KeyError: an unknown registered name
USER_ERRORS: tuple[type[BaseException], ...] = (UserError, ValueError, KeyError, OSError)


def error_message(err: BaseException) -> str:
    """The text of a user error; lines after the first indented.

    A ``KeyError``'s ``str`` is the repr of its message, so the message itself; an
    ``OSError`` of the system (``[Errno 2] No such file or directory: 'x'``) reads
    ``x: No such file or directory``.
    """
    if isinstance(err, KeyError) and err.args:
        text = str(err.args[0])
    elif isinstance(err, OSError) and err.filename is not None and err.strerror:
        text = f"{err.filename}: {err.strerror}"
    else:
        text = str(err)
    text = text.strip() or type(err).__name__
    first, *rest = text.splitlines()
    return "\n".join([first, *(f"  {line}" for line in rest)])


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _catch_sigterm() -> object | None:
    """Turns SIGTERM into ``KeyboardInterrupt`` unless someone handles it already."""
    try:
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return None
        return signal.signal(signal.SIGTERM, _raise_interrupt)
    except ValueError:  # not the main thread
        return None


def run_cli(
    main: Callable[[list[str]], object], prog: str, argv: Sequence[str] | None = None
) -> int:
    """Runs ``main(argv)`` and turns a user error into a one-line message.

    Args:
        main: the command; an ``int`` it returns is the exit code (a failed step's status),
            anything else means success.
        prog: the command's name in messages, as its argparse ``prog``.
        argv: the arguments (``sys.argv[1:]`` by default).

    Returns:
        The exit code: ``main``'s, 0, 2 for a user error, 130 when interrupted.
    """
    previous = _catch_sigterm()
    try:
        result = main(list(sys.argv[1:] if argv is None else argv))
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except USER_ERRORS as err:
        if os.environ.get("RECURNMT_TRACEBACK"):
            raise
        print(f"{prog}: error: {error_message(err)}", file=sys.stderr)
        return EXIT_USER_ERROR
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return result if isinstance(result, int) and not isinstance(result, bool) else 0


def entry_point(main: Callable[[list[str]], object], prog: str) -> Callable[..., int]:
    """The command-line function of ``main``: ``cli(argv=None) -> exit code``.

    Console scripts call it without arguments (``sys.argv``); tests pass ``argv``.
    """

    def cli(argv: Sequence[str] | None = None) -> int:
        return run_cli(main, prog, argv)

    cli.__doc__ = f"``{prog}``: runs :func:`main` under :func:`recurnmt.cli.run_cli`."
    return cli


def split_extra_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """``argv`` split at ``--``: (the command's own arguments, the ones to pass on)."""
    argv = list(argv)
    if "--" not in argv:
        return argv, []
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1 :]
