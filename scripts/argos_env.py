"""``.venv-argos``: an environment for Argos Translate 1.11, built on the project's own.

argostranslate 1.11.0 pins its own stack (``ctranslate2<5``, ``sentencepiece``, ``sacremoses``,
``spacy``, ``stanza==1.10.1``, ``minisbd``), which recurnmt's environment should not take in. So
it gets an environment of its own, kept small: ``python -m venv`` from the running Python, a
``.pth`` file that puts the project's environment (the one running this script) after the new
one's own packages, and ``pip install --no-deps -r requirements/argos.txt``, the packages that
argostranslate's import and translation need beyond the project's (that file says which and
why). torch (stanza's import), numpy, ctranslate2 and sentencepiece come from the project's
environment, so nothing large is downloaded.

It is built once and reused while ``requirements/argos.txt`` and the project's environment are
the same (a stamp in the environment records both); a lock lets parallel test processes wait
for one build. ``make argos-env`` builds it; the Argos end-to-end test builds it when missing.

    python scripts/argos_env.py [--venv .venv-argos]
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REQUIREMENTS = ROOT / "requirements" / "argos.txt"
VENV = ROOT / ".venv-argos"
STAMP = ".recurnmt-argos.json"
PIP_RETRIES, PIP_TIMEOUT_S, INSTALL_LIMIT_S = 2, 20, 600
# what pip prints when it does not reach an index
UNREACHABLE = re.compile(r"connection broken by|Could not fetch URL|Max retries exceeded")


class Unavailable(Exception):
    """The environment could not be built; the message is one line saying why."""


def base_site_packages() -> list[str]:
    """The running environment's package folders, which the new one reads after its own."""
    paths = sysconfig.get_paths()
    return list(dict.fromkeys([paths["purelib"], paths["platlib"]]))


def stamp(requirements: Path = REQUIREMENTS) -> dict:
    """What a built environment must match to be reused."""
    digest = hashlib.sha256(requirements.read_bytes()).hexdigest()
    return {"requirements": digest, "base": base_site_packages(), "python": sys.version}


def python_of(venv: Path) -> Path:
    return venv / "bin" / "python"


def is_current(venv: Path, requirements: Path = REQUIREMENTS) -> bool:
    path = venv / STAMP
    return path.is_file() and json.loads(path.read_text(encoding="utf-8")) == stamp(requirements)


def _reason(output: str) -> str:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line.removeprefix("ERROR:").strip() for line in lines if line.startswith("ERROR:")]
    error = (errors or lines or ["no output"])[0]
    if UNREACHABLE.search(output):
        return f"the package index could not be reached; pip: {error}"
    return f"pip: {error}"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def argos_settings(root: Path) -> dict[str, str]:
    """Environment variables that keep Argos Translate's folders under ``root``: importing
    ``argostranslate.settings`` creates its data, configuration and cache folders (under the
    home folder by default) and its package folder."""
    return {
        "XDG_DATA_HOME": str(root / "data"),
        "XDG_CONFIG_HOME": str(root / "config"),
        "XDG_CACHE_HOME": str(root / "cache"),
        "ARGOS_PACKAGES_DIR": str(root / "packages"),
    }


def _run(cmd: list[str], what: str, env: dict[str, str] | None = None) -> None:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=INSTALL_LIMIT_S, env=env)
    except subprocess.TimeoutExpired:
        raise Unavailable(f"{what} did not finish in {INSTALL_LIMIT_S} s") from None
    if proc.returncode:
        raise Unavailable(f"{what} failed: {_reason(proc.stderr + chr(10) + proc.stdout)}")


def build(venv: Path = VENV, requirements: Path = REQUIREMENTS) -> Path:
    """The Python of ``venv``, built first where it is missing or out of date.

    Raises:
        Unavailable: pip could not install the requirements (an unreachable index, ...).
    """
    venv.parent.mkdir(parents=True, exist_ok=True)
    with _locked(venv.parent / f".{venv.name}.lock"):  # beside it, not in it (it is rebuilt)
        if is_current(venv, requirements):
            return python_of(venv)
        shutil.rmtree(venv, ignore_errors=True)
        _run([sys.executable, "-m", "venv", str(venv)], "python -m venv")
        purelib = subprocess.run(
            [str(python_of(venv)), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        # a .pth file's lines join sys.path after the environment's own folder
        pth = "".join(f"{p}\n" for p in base_site_packages())
        (Path(purelib) / "zz-recurnmt-base.pth").write_text(pth, encoding="utf-8")
        _run(
            [str(python_of(venv)), "-m", "pip", "install", "--no-deps", "-r", str(requirements),
             "--retries", str(PIP_RETRIES), "--timeout", str(PIP_TIMEOUT_S),
             "--disable-pip-version-check", "--quiet"],
            f"pip install -r {requirements.name}",
        )  # fmt: skip
        with tempfile.TemporaryDirectory() as tmp:
            env = {**os.environ, **argos_settings(Path(tmp))}
            _run([str(python_of(venv)), "-c", "import argostranslate.translate"],
                 "import argostranslate.translate", env)  # fmt: skip
        (venv / STAMP).write_text(json.dumps(stamp(requirements)), encoding="utf-8")
        return python_of(venv)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--venv", type=Path, default=VENV)
    args = parser.parse_args(argv)
    if args.venv.exists() and not args.venv.is_dir():
        parser.error(f"--venv {args.venv}: not a folder")
    start = time.perf_counter()
    reused = is_current(args.venv)
    try:
        python = build(args.venv)
    except Unavailable as err:
        print(f"argos_env: error: {err}", file=sys.stderr)
        return 2
    how = "reused" if reused else f"built in {time.perf_counter() - start:.1f} s"
    print(f"{python.parent.parent} {how}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
