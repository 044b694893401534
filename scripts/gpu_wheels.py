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
--list-missing`` there prints it), so the folder may hold more than is used. Where the
machine's image is known (``--image FILE``: the names of the packages it holds, one a line;
``scripts/gpu_check/images/`` has the images seen), the folder holds only what gpu-check
installs there: its requirements the image lacks, what those require in turn (read from each
wheel's metadata, at the lock's versions), and the pure-Python wheels of the image's packages
they require, which pip takes only where the image's version does not fit (the image's
compiled packages, numpy or pyarrow, are trusted). For this workplace's H200 image that is
a folder small enough to travel with the repository.

    make gpu-wheels PYVER=3.12 WHEELS=wheels IMAGE=scripts/gpu_check/images/nvidia-h200.txt
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
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


def pure_python_command(pins: list[str], out: Path, python_version: str) -> list[str]:
    """``pip download`` of ``pins``' pure-Python wheels (``py3-none-any``) only."""
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:"]
    cmd += ["--python-version", python_version, "--implementation", "py", "--abi", "none"]
    return [*cmd, "--platform", "any", "-d", str(out), *pins]


def read_image(path: Path) -> set[str]:
    """The normalized package names of an image file (one a line, ``#`` comments)."""
    if not path.is_file():
        raise setup_env.SetupError(f"--image {path}: no such file")
    lines = (line.split("#", 1)[0].strip() for line in path.read_text("utf-8").splitlines())
    return {setup_env.normalize(line) for line in lines if line}


def wheel_requires(wheel: Path, python_version: str) -> list[str]:
    """The normalized names a wheel requires on CPython ``python_version``, Linux x86-64,
    without extras (its ``Requires-Dist`` lines whose markers hold there)."""
    try:
        from packaging.requirements import Requirement
    except ImportError:  # pip carries its own copy
        from pip._vendor.packaging.requirements import Requirement
    with zipfile.ZipFile(wheel) as zf:
        (meta,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        text = zf.read(meta).decode("utf-8")
    env = {"python_version": python_version, "python_full_version": f"{python_version}.0",
           "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
           "os_name": "posix", "implementation_name": "cpython",
           "platform_python_implementation": "CPython", "extra": ""}  # fmt: skip
    names = []
    for line in text.splitlines():
        if line.startswith("Requires-Dist:"):
            req = Requirement(line.split(":", 1)[1].strip())
            if req.marker is None or req.marker.evaluate(env):
                names.append(setup_env.normalize(req.name))
    return names


def image_wanted(
    roots: list[str], lock: dict[str, str], image: set[str], out: Path, python_version: str
) -> dict[str, list[str]]:
    """Fills ``out`` with what a machine holding ``image`` needs to install ``roots``: the
    roots the image lacks and, level by level, their requirements that it lacks (pinned by
    ``lock``), plus the pure-Python wheels of the image's packages they require (a root the
    image holds is kept as it is); as :func:`fill`, with ``"image"``: the image's packages
    given as pure-Python wheels."""
    done: dict[str, list[str]] = {"wheels": [], "built": [], "sources": [], "image": []}
    seen = {setup_env.normalize(r) for r in roots} & image  # gpu-check keeps these as they are
    seen |= setup_env.NOT_LOCKED
    level = [setup_env.normalize(r) for r in roots]
    while level:
        level = sorted({n for n in level if n not in seen and not IMAGE_OWN.fullmatch(n)})
        seen.update(level)
        unpinned = [n for n in level if n not in lock]
        if unpinned:
            raise setup_env.SetupError(f"not in the lock: {' '.join(unpinned)}")
        lacking = [f"{n}=={lock[n]}" for n in level if n not in image]
        for pin in (f"{n}=={lock[n]}" for n in level if n in image):
            # a pure-Python wheel where there is one; a compiled package is the image's
            if pip(pure_python_command([pin], out, python_version)):
                done["image"].append(pin)
        before = set(out.iterdir())
        for kind, pins in (fill(out, python_version, lacking) if lacking else {}).items():
            done[kind] += pins
        level = [
            name
            for wheel in set(out.iterdir()) - before
            if wheel.suffix == ".whl"
            for name in wheel_requires(wheel, python_version)
        ]
    return done


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
    parser.add_argument(
        "--image",
        type=Path,
        help="the packages the GPU image holds, one name a line: only what it lacks "
        "(scripts/gpu_check/images/)",
    )
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
        if opts.image:
            needed = pins if opts.only else setup_env.pinned_requirements(opts.lock)
            roots = [p.split("==")[0] for p in needed]
            image = read_image(opts.image)
            opts.out.mkdir(parents=True, exist_ok=True)
            done = image_wanted(roots, lock, image, opts.out, opts.python_version)
        else:
            done = fill(opts.out, opts.python_version, pins)
    except (setup_env.SetupError, ValueError) as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2
    size = sum(p.stat().st_size for p in opts.out.iterdir()) / 2**20
    print(
        f"{opts.out}: {len(done['wheels'])} wheels downloaded, {len(done['built'])} built here, "
        f"{len(done['sources'])} sources to build there"
        + (f", {len(done['image'])} pure-Python ones the image holds" if "image" in done else "")
        + f" ({size:.0f} MB)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
