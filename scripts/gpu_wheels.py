"""``make gpu-wheels``: a folder of wheels for a GPU machine that reaches no package index.

    make gpu-wheels PYVER=3.12 WHEELS=wheels      # here, with an index
    make gpu-check WHEELS=wheels                  # there: installs from the folder alone

It holds every package requirements/lock.txt pins, for that Python on Linux x86-64, except
what a CUDA image brings with its torch (torch, torchvision, torchaudio, triton and the
``nvidia-*`` / ``cuda-*`` libraries) and the installers:

- a wheel from the index where one exists for that Python (``pip download --only-binary``);
- otherwise the source, built into a wheel here when the result is pure Python (hydra's
  ``antlr4-python3-runtime`` has no wheel at all), else left as the source for the GPU
  machine to build. fairseq-fixed is the one such package: PyPI has a wheel of it for CPython
  3.12 only. Its source is then built there by ``make gpu-check`` against the machine's own
  torch and numpy (``--no-build-isolation``, with cython, setuptools and wheel from the
  folder): 143-158 s on this 2-core machine, about 40 s on a 16-core one.

gpu-check installs only what the machine lacks (``python3 -m scripts.gpu_check
--list-missing`` there prints it), so the folder may hold more than is used.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import setup_env  # scripts/ is this script's own directory, so its first import path

ROOT = setup_env.ROOT
PROG = "python scripts/gpu_wheels.py"
# what a CUDA image's torch brings (never downloaded: the machine's own are kept)
IMAGE_OWN = re.compile(r"(torch|torchvision|torchaudio|triton|nvidia-.*|cuda-.*)")
# manylinux tags a current x86-64 GPU image accepts, newest first
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


def wanted(lock: dict[str, str]) -> list[str]:
    """``name==version`` of every pin but the image's own and the installers."""
    return [
        f"{name}=={version}"
        for name, version in sorted(lock.items())
        if not IMAGE_OWN.fullmatch(name) and name not in setup_env.NOT_LOCKED
    ]


def download_command(pins: list[str], out: Path, python_version: str) -> list[str]:
    """``pip download`` of ``pins``' wheels for ``python_version`` on Linux x86-64."""
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:"]
    cmd += ["--python-version", python_version, "--implementation", "cp", "-d", str(out)]
    for platform in PLATFORMS:
        cmd += ["--platform", platform]
    return [*cmd, *pins]


def pip(cmd: list[str]) -> bool:
    return subprocess.run(cmd, cwd=ROOT).returncode == 0


def fill(out: Path, python_version: str, pins: list[str]) -> dict[str, list[str]]:
    """Fills ``out``; ``{"wheels": pins downloaded, "built": built here, "sources": left
    to build there}``."""
    out.mkdir(parents=True, exist_ok=True)
    print(f"downloading {len(pins)} wheels for Python {python_version} into {out} ...", flush=True)
    if pip(download_command(pins, out, python_version)):
        return {"wheels": pins, "built": [], "sources": []}
    done: dict[str, list[str]] = {"wheels": [], "built": [], "sources": []}
    for pin in pins:  # one by one, to find the pins without a wheel
        if pip(download_command([pin], out, python_version)):
            done["wheels"].append(pin)
        else:
            done[build_or_keep_source(pin, out)].append(pin)
    return done


def build_or_keep_source(pin: str, out: Path) -> str:
    """Downloads ``pin``'s source; builds a pure-Python wheel of it into ``out`` (``"built"``)
    or keeps the source there (``"sources"``)."""
    with tempfile.TemporaryDirectory() as tmp:
        sdist = Path(tmp) / "sdist"
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"]
        if not pip([*cmd, "--no-binary=:all:", "-d", str(sdist), pin]):
            raise setup_env.SetupError(f"{pin}: neither a wheel nor its source on the index")
        (source,) = sdist.iterdir()
        built = Path(tmp) / "built"
        build = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(built)]
        if pip([*build, str(source)]):
            (wheel,) = built.glob("*.whl")
            if wheel.name.endswith("-none-any.whl"):
                shutil.copy(wheel, out / wheel.name)
                print(f"  {pin}: no wheel on the index, built {wheel.name}", flush=True)
                return "built"
        shutil.copy(source, out / source.name)
        print(f"  {pin}: no wheel for this Python; {source.name} is built there", flush=True)
        return "sources"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "wheels", help="the folder to fill")
    parser.add_argument(
        "--python-version", default="3.12", help="the GPU machine's Python (default 3.12)"
    )
    parser.add_argument("--lock", type=Path, default=ROOT / "requirements" / "lock.txt")
    parser.add_argument("--only", nargs="+", help="these packages of the lock only")
    opts = parser.parse_args(argv)
    if not re.fullmatch(r"3\.\d+", opts.python_version):
        raise ValueError(f"--python-version {opts.python_version}: say it as 3.12")
    return opts


def main(argv: list[str] | None = None) -> int:
    try:
        opts = parse_args(argv)
        lock = setup_env.read_lock(opts.lock)
        pins = wanted(lock)
        if opts.only:
            names = {setup_env.normalize(n) for n in opts.only}
            unknown = names - {setup_env.normalize(p.split("==")[0]) for p in pins}
            if unknown:
                raise setup_env.SetupError(f"--only {' '.join(sorted(unknown))}: not in the lock")
            pins = [p for p in pins if setup_env.normalize(p.split("==")[0]) in names]
        done = fill(opts.out, opts.python_version, pins)
    except (setup_env.SetupError, ValueError) as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2
    size = sum(p.stat().st_size for p in opts.out.iterdir()) / 2**20
    print(
        f"{opts.out}: {len(done['wheels'])} wheels downloaded, {len(done['built'])} built here, "
        f"{len(done['sources'])} sources to build there ({size:.0f} MB)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
