"""Exceptions whose message fully explains a failed preparation (no traceback needed)."""

from __future__ import annotations


class PrepError(RuntimeError):
    """A preparation step failed for a reason the message states."""


class IntegrityError(PrepError):
    """A file is missing, unreadable or does not match its recorded sha256 / row count."""


class DownloadError(PrepError):
    """A download failed or gave something other than what was expected."""


class BinarizeError(PrepError):
    """``fairseq-preprocess`` failed."""
