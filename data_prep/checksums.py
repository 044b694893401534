"""sha256 manifests (``sha256sum`` format) for shipped or downloaded files."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path

from data_prep.errors import IntegrityError

MANIFEST_NAME = "MANIFEST.sha256"


def sha256_file(path: Path, chunk_size: int = 1 << 20) -> str:
    """Hex sha256 digest of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(chunk_size):
            digest.update(chunk)
    return digest.hexdigest()


def write_manifest(directory: Path, names: Iterable[str]) -> Path:
    """Write ``MANIFEST.sha256`` for the given files of ``directory``.

    The format is that of ``sha256sum``, so ``sha256sum -c MANIFEST.sha256`` also checks it.

    Returns:
        The manifest's path.
    """
    lines = [f"{sha256_file(directory / name)}  {name}" for name in sorted(names)]
    manifest = directory / MANIFEST_NAME
    manifest.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return manifest


def read_manifest(directory: Path) -> dict[str, str]:
    """Parse ``MANIFEST.sha256`` of ``directory`` into ``{file name: sha256}``.

    Raises:
        IntegrityError: If the manifest is missing or malformed.
    """
    manifest = directory / MANIFEST_NAME
    if not manifest.is_file():
        raise IntegrityError(f"{manifest}: manifest is missing")
    entries: dict[str, str] = {}
    for number, line in enumerate(manifest.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        digest, sep, name = line.partition("  ")
        if not sep or len(digest) != 64 or not name:
            raise IntegrityError(f"{manifest}:{number}: malformed line {line!r}")
        entries[name] = digest
    return entries


def verify_manifest(directory: Path, hint: str = "") -> dict[str, str]:
    """Check every file listed in ``directory``'s manifest.

    Args:
        directory: The directory holding ``MANIFEST.sha256`` and the files it lists.
        hint: Appended to error messages (how to repair the files).

    Returns:
        The manifest entries.

    Raises:
        IntegrityError: Naming the first file that is missing or whose sha256 differs.
    """
    try:
        entries = read_manifest(directory)
    except IntegrityError as err:
        raise IntegrityError(f"{err}{hint}") from None
    for name, expected in entries.items():
        path = directory / name
        if not path.is_file():
            raise IntegrityError(f"{path}: file is missing (listed in {MANIFEST_NAME}){hint}")
        actual = sha256_file(path)
        if actual != expected:
            raise IntegrityError(
                f"{path}: file is corrupt (sha256 {actual[:12]}... does not match "
                f"{expected[:12]}... recorded in {MANIFEST_NAME}){hint}"
            )
    return entries
