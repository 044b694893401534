"""Fetch, check and unpack the Debian help packages the corpus is built from."""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

from data_prep.checksums import sha256_file
from data_prep.embedded import PACKAGES, PINNED_SHA256
from data_prep.errors import DownloadError, IntegrityError

_AR_MAGIC = b"!<arch>\n"
_AR_HEADER = 60


@dataclass(frozen=True)
class DebInfo:
    """One source package file."""

    lang: str
    package: str
    version: str
    path: Path
    sha256: str
    size: int


def download_debs(dest: Path, version: str) -> dict[str, Path]:
    """``apt-get download`` both packages at ``version`` into ``dest``.

    Raises:
        DownloadError: If apt-get is missing or fails (e.g. the version is not in the
            configured suites: it is in Debian ``bookworm``).
    """
    if shutil.which("apt-get") is None:
        raise DownloadError(
            "apt-get is not available; download the two .deb files by hand "
            f"({', '.join(f'{p}_{version}' for p in PACKAGES.values())}) and pass --deb-dir"
        )
    specs = [f"{package}={version}" for package in PACKAGES.values()]
    result = subprocess.run(
        ["apt-get", "download", *specs], cwd=dest, capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise DownloadError(f"apt-get download {' '.join(specs)} failed:\n{result.stderr.strip()}")
    return find_debs(dest)


def find_debs(deb_dir: Path) -> dict[str, Path]:
    """Locate exactly one ``.deb`` per language in ``deb_dir``.

    Raises:
        FileNotFoundError: If a package is missing or ambiguous.
    """
    found: dict[str, Path] = {}
    for lang, package in PACKAGES.items():
        matches = sorted(Path(deb_dir).glob(f"{package}_*.deb"))
        if len(matches) != 1:
            raise FileNotFoundError(
                f"expected one {package}_*.deb in {deb_dir}, found {len(matches)}"
            )
        found[lang] = matches[0]
    return found


def deb_version(path: Path) -> str:
    """A package's version, from ``dpkg-deb`` if available, else from its file name."""
    if shutil.which("dpkg-deb"):
        result = subprocess.run(
            ["dpkg-deb", "-f", str(path), "Version"], capture_output=True, text=True, check=True
        )
        return result.stdout.strip()
    # pkg_<version>_<arch>.deb, with the epoch colon URL-encoded by apt.
    return unquote(path.name).split("_")[1]


def describe_debs(debs: dict[str, Path], allow_unpinned: bool) -> dict[str, DebInfo]:
    """Hash the packages and check them against the pinned sha256.

    Raises:
        IntegrityError: If a package differs from the pinned one and ``allow_unpinned`` is
            false.
    """
    infos = {}
    for lang, path in debs.items():
        digest = sha256_file(path)
        if digest != PINNED_SHA256[lang] and not allow_unpinned:
            raise IntegrityError(
                f"{path}: sha256 {digest} differs from the pinned {PINNED_SHA256[lang]}; "
                "pass --allow-unpinned to build from another package version"
            )
        infos[lang] = DebInfo(
            lang, PACKAGES[lang], deb_version(path), path, digest, path.stat().st_size
        )
    return infos


def _ar_members(path: Path) -> dict[str, tuple[int, int]]:
    """Offsets and sizes of the members of an ``ar`` archive (the ``.deb`` container)."""
    members: dict[str, tuple[int, int]] = {}
    with open(path, "rb") as handle:
        if handle.read(len(_AR_MAGIC)) != _AR_MAGIC:
            raise IntegrityError(f"{path}: not a Debian package (no ar header)")
        while header := handle.read(_AR_HEADER):
            if len(header) < _AR_HEADER:
                raise IntegrityError(f"{path}: truncated ar archive")
            name = header[:16].decode("ascii").strip().rstrip("/")
            size = int(header[48:58].decode("ascii").strip())
            members[name] = (handle.tell(), size)
            handle.seek(size + (size % 2), 1)
    return members


def extract_deb(path: Path, dest: Path) -> None:
    """Unpack a package's files into ``dest`` (``dpkg-deb -x``, or pure Python elsewhere).

    Raises:
        IntegrityError: If the package cannot be unpacked.
    """
    dest.mkdir(parents=True, exist_ok=True)
    if shutil.which("dpkg-deb"):
        result = subprocess.run(
            ["dpkg-deb", "-x", str(path), str(dest)], capture_output=True, text=True, check=False
        )
        if result.returncode != 0:
            raise IntegrityError(f"{path}: dpkg-deb -x failed: {result.stderr.strip()}")
        return
    members = _ar_members(path)
    data = [name for name in members if name.startswith("data.tar")]
    if not data:
        raise IntegrityError(f"{path}: no data.tar member")
    offset, size = members[data[0]]
    with open(path, "rb") as handle:
        handle.seek(offset)
        payload = io.BytesIO(handle.read(size))  # a few MB for these packages
    # tarfile detects gzip/xz/bzip2 itself; the "data" filter refuses unsafe members.
    with tarfile.open(fileobj=payload, mode="r:*") as tar:
        tar.extractall(dest, filter="data")
