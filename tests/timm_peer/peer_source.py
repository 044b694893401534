"""A peer project's test file from its own source distribution, at the installed version.

recurnmt carries no other project's code: timm's ``tests/test_models.py`` is taken from timm's
source distribution on the package index (``timm-1.0.31.tar.gz`` holds
``timm-1.0.31/tests/test_models.py``), at the version of timm that is installed, and kept in an
ignored cache folder (``tests/timm_peer/sdist/timm-<version>/``) so that later runs reuse it.

The environment's own installer downloads it. ``scripts/setup_env.py`` installs with uv where it
can, but gives uv the indexes pip is configured with (``pip config list``); uv has no download
command, so pip (``python -m pip download``, in every environment ``python -m venv`` makes)
fetches the source distribution from those same indexes. (Indexes named only by ``UV_*``
variables are not pip's, and are not read.)

Where the index cannot be reached, :func:`fetch` raises :class:`Unavailable` with a one-line
reason, which the suite reports as its skip reason, so an unreachable index never passes
silently. Each process of an xdist run collects on its own; a lock lets one of them download
while the others wait and then reuse the file, and a failure is remembered for the rest of the
same run, so that eight workers do not each wait out an unreachable index.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path

# pip's own retries and per-request timeout, and the whole download's limit: an index that does
# not answer costs about a minute (each configured index its own), five at most, once per run
PIP_RETRIES = 2
PIP_TIMEOUT_S = 20
DOWNLOAD_LIMIT_S = 300

Runner = Callable[..., subprocess.CompletedProcess]


class Unavailable(Exception):
    """The file could not be had; the message is one line saying why."""


def installed_version(dist: str) -> str:
    """The installed version of distribution ``dist``, as the package index names it."""
    return metadata.version(dist)


def download_command(python: str, dist: str, version: str, dest: Path) -> list[str]:
    """pip's command that downloads ``dist==version``'s source distribution (not a wheel, not
    its dependencies) into ``dest``."""
    return [
        python, "-m", "pip", "download", f"{dist}=={version}", "--no-binary", dist,
        "--no-deps", "--retries", str(PIP_RETRIES), "--timeout", str(PIP_TIMEOUT_S),
        "--disable-pip-version-check", "--quiet", "--dest", str(dest),
    ]  # fmt: skip


def first_error_line(output: str) -> str:
    """The line of pip's output that says what went wrong (its first ``ERROR:`` line, else its
    last line)."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR:")]
    return (errors or lines or ["no output"])[0].removeprefix("ERROR:").strip()


# what pip prints when it does not reach an index (retries, then "from versions: none")
UNREACHABLE = re.compile(r"connection broken by|Could not fetch URL|Max retries exceeded")
CAUSE = re.compile(r"Failed to establish a new connection: ([^'\"]+)")


def pip_reason(output: str) -> str:
    """One line from pip's output: whether the index was reached, and pip's error."""
    error = f"pip: {first_error_line(output)}"
    if not UNREACHABLE.search(output):
        return error
    cause = CAUSE.search(output)
    return "the package index could not be reached" + (
        f" ({cause.group(1).strip()}); {error}" if cause else f"; {error}"
    )


def cached_path(cache: Path, dist: str, version: str, member: str) -> Path:
    """Where :func:`fetch` keeps ``member`` of ``dist``'s source distribution at ``version``."""
    return cache / f"{dist}-{version}" / Path(member).name


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def fetch(
    dist: str,
    version: str,
    member: str,
    cache: Path,
    *,
    run_id: str | None = None,
    python: str = sys.executable,
    runner: Runner = subprocess.run,
) -> Path:
    """``member`` (a path inside the source distribution, e.g. ``tests/test_models.py``) of
    ``dist==version``'s source distribution, downloaded once into ``cache`` and reused after.

    ``run_id`` names the test run (xdist's ``testrunuid``): a failure is remembered for that run
    and not tried again by its other processes.

    Raises:
        Unavailable: the download failed (the index cannot be reached, has no source
            distribution of that version, ...) or the distribution holds no ``member``.
    """
    target = cached_path(cache, dist, version, member)
    memo = cache / f"{dist}-{version}.unavailable"
    with _locked(cache / ".lock"):
        if target.is_file():
            return target
        if run_id is not None and memo.is_file():
            noted = json.loads(memo.read_text(encoding="utf-8"))
            if noted.get("run") == run_id:
                raise Unavailable(noted["reason"])
        try:
            _download(dist, version, member, cache, target, python, runner)
        except Unavailable as err:
            memo.write_text(json.dumps({"run": run_id, "reason": str(err)}), encoding="utf-8")
            raise
        memo.unlink(missing_ok=True)
        return target


def fetch_installed(
    dist: str,
    member: str,
    cache: Path,
    *,
    run_id: str | None = None,
    runner: Runner = subprocess.run,
) -> Path:
    """:func:`fetch` at the installed version of ``dist``."""
    return fetch(dist, installed_version(dist), member, cache, run_id=run_id, runner=runner)


def _download(
    dist: str, version: str, member: str, cache: Path, target: Path, python: str, runner: Runner
) -> None:
    what = f"{dist} {version}'s source distribution"
    with tempfile.TemporaryDirectory(dir=cache, prefix=".download-") as tmp:
        cmd = download_command(python, dist, version, Path(tmp))
        try:
            proc = runner(cmd, capture_output=True, text=True, timeout=DOWNLOAD_LIMIT_S)
        except subprocess.TimeoutExpired:
            raise Unavailable(
                f"{what} not downloaded from the package index in {DOWNLOAD_LIMIT_S} s"
            ) from None
        if proc.returncode:
            reason = pip_reason(f"{proc.stderr}\n{proc.stdout}")
            raise Unavailable(f"{what} not downloaded: {reason}")
        archives = sorted(Path(tmp).glob("*.tar.gz"))
        if not archives:
            raise Unavailable(f"pip downloaded no .tar.gz of {what}")
        with tarfile.open(archives[0]) as archive:
            # the one top folder of an sdist (timm-1.0.31/), then the member's path
            found = [m for m in archive.getmembers() if m.name.partition("/")[2] == member]
            if not found or not found[0].isfile():
                raise Unavailable(f"{what} ({archives[0].name}) holds no {member}")
            data = archive.extractfile(found[0]).read()
        part = Path(tmp) / target.name
        part.write_bytes(data)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(part, target)
