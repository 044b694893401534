"""Line-oriented text files, plain or gzip-compressed, written reproducibly."""

from __future__ import annotations

import gzip
import io
from collections.abc import Iterable, Iterator
from pathlib import Path

from data_prep.errors import IntegrityError


def open_text(path: Path) -> io.TextIOBase:
    """Open a UTF-8 text file for reading, transparently decompressing ``*.gz``."""
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="\n")
    return open(path, encoding="utf-8", newline="\n")


def read_lines(path: Path) -> list[str]:
    """Read all lines of a (possibly gzipped) text file, without their newlines.

    Raises:
        IntegrityError: If the file is not valid UTF-8 or not valid gzip (message names the file).
    """
    try:
        with open_text(path) as handle:
            return [line.rstrip("\n") for line in handle]
    except (UnicodeDecodeError, OSError, EOFError) as err:
        raise IntegrityError(f"{path}: cannot read text ({err})") from err


def iter_lines(path: Path) -> Iterator[str]:
    """Yield the lines of a (possibly gzipped) text file, without their newlines."""
    with open_text(path) as handle:
        for line in handle:
            yield line.rstrip("\n")


def write_lines(path: Path, lines: Iterable[str]) -> int:
    """Write lines (one per line, ``\\n`` endings); ``*.gz`` is compressed reproducibly.

    The gzip header carries no file name and a zero timestamp, so equal content gives equal
    bytes (and equal sha256) on every rebuild.

    Returns:
        The number of lines written.
    """
    count = 0
    if path.suffix == ".gz":
        with (
            open(path, "wb") as raw,
            gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9) as gz,
            io.TextIOWrapper(gz, encoding="utf-8", newline="\n") as handle,
        ):
            for line in lines:
                handle.write(line + "\n")
                count += 1
        return count
    with open(path, "w", encoding="utf-8", newline="\n") as handle:
        for line in lines:
            handle.write(line + "\n")
            count += 1
    return count
