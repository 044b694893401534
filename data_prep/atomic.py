"""Atomic output directories: build in a temporary sibling, rename into place at the end.

A failed or interrupted preparation (an exception, Ctrl-C) removes its temporary directory and
leaves the final path untouched, so a directory at the final path is always complete.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

TMP_MARK = ".tmp-"


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def atomic_output_dir(final: Path, *, replace: bool = False) -> Iterator[Path]:
    """Yield an empty temporary directory that becomes ``final`` if the block succeeds.

    The temporary directory lives next to ``final`` (same filesystem, so the rename is atomic)
    and is named ``.<name>.tmp-XXXX``.

    Args:
        final: The directory to produce.
        replace: If ``final`` already exists, swap the new directory in and delete the old one.
            Otherwise an existing ``final`` is an error.

    Yields:
        The temporary directory to fill.

    Raises:
        FileExistsError: If ``final`` exists and ``replace`` is false (checked before and after
            the block, so no work is lost silently).
    """
    final = Path(final)
    if final.exists() and not replace:
        raise FileExistsError(f"{final} already exists (pass --force to replace it)")
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}{TMP_MARK}", dir=final.parent))
    os.chmod(tmp, 0o777 & ~_current_umask())  # mkdtemp makes it private (0700)
    try:
        yield tmp
        if final.exists():
            if not replace:
                raise FileExistsError(f"{final} appeared while it was being built")
            old = Path(tempfile.mkdtemp(prefix=f".{final.name}.old-", dir=final.parent))
            os.replace(final, old / final.name)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
