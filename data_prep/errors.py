"""Exceptions whose message fully explains a failed preparation (no traceback needed).

They are :class:`recurnmt.cli.UserError`: a command ends on one with one ``PROG: error:``
line and exit code 2, like every recurnmt command.
"""

from __future__ import annotations

from recurnmt.cli import UserError


class PrepError(UserError, RuntimeError):
    """A preparation step failed for a reason the message states."""


class IntegrityError(PrepError):
    """A file is missing, unreadable or does not match its recorded sha256 / row count."""


class DownloadError(PrepError):
    """A download failed or gave something other than what was expected."""


class BinarizeError(PrepError):
    """``fairseq-preprocess`` failed."""
