"""The check's environment (item 1 of the package's docstring): ``.venv-gpu``, a virtual
environment of ``--python`` that sees that interpreter's packages (the machine's own CUDA torch,
torchvision and numpy, whatever their versions), with what it lacks installed at
requirements/lock.txt's pins from the package index or from a wheels folder alone; what an
interpreter holds (the report's device line, its Python, torch, CUDA and package versions);
and the environment the steps' commands run in."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
from pathlib import Path

from recurnmt.cli import UserError  # standard library only
from recurnmt.experiments.timed import run_streamed  # standard library only
from scripts.setup_env import normalize, pinned_requirements  # standard library only

ROOT = Path(__file__).resolve().parents[2]

# the versions the report shows beside torch's (probe())
REPORTED_PACKAGES = ("numpy", "fairseq-fixed", "timm", "torchvision", "triton")

PROBE = """
import json, platform, sys
from importlib import metadata
out = {"python": platform.python_version(), "executable": sys.executable, "packages": {},
       "site": [p for p in sys.path if p.endswith("-packages")]}
for name in sys.argv[1:]:
    try:
        out["packages"][name] = metadata.version(name)
    except metadata.PackageNotFoundError:
        out["packages"][name] = None
try:
    import torch
except ImportError:
    out["torch"] = None
else:
    cuda = torch.cuda.is_available()
    out.update(torch=torch.__version__, cuda=torch.version.cuda, cuda_available=cuda,
               cudnn=torch.backends.cudnn.version() if cuda else None,
               device_name=torch.cuda.get_device_name() if cuda else
               f"CPU ({platform.machine()}, {torch.get_num_threads()} threads)")
print(json.dumps(out))
"""


def probe(python: Path | str, packages: list[str] = ()) -> dict:
    """What ``python`` holds: its version, torch and CUDA, and ``packages``' versions."""
    proc = subprocess.run(
        [str(python), "-c", PROBE, *packages], capture_output=True, text=True, cwd=ROOT
    )
    if proc.returncode:
        raise UserError(f"{python} does not run: {proc.stderr.strip()[-500:]}")
    return json.loads(proc.stdout)


def has_nvidia_driver() -> bool:
    """An NVIDIA driver on this machine (its ``nvidia-smi`` or its kernel module)."""
    return shutil.which("nvidia-smi") is not None or Path("/proc/driver/nvidia/version").exists()


def missing_requirements(installed: dict[str, str | None]) -> list[str]:
    """The pinned requirements whose package is not installed at all (an installed one is
    kept at its version: the GPU machine's torch, torchvision and numpy stay)."""
    have = {normalize(k) for k, v in installed.items() if v}
    return [r for r in pinned_requirements() if normalize(r.split("==")[0]) not in have]


def base_site_pth(venv: Path, site_dirs: list[str]) -> Path:
    """Makes ``venv`` see ``site_dirs`` after its own packages (what it installs wins)."""
    (lib,) = (venv / "lib").glob("python3*/site-packages")
    pth = lib / "_recurnmt_gpu_base.pth"
    pth.write_text("".join(f"{d}\n" for d in site_dirs), encoding="utf-8")
    return pth


def pip(
    python: Path, args: list[str], opts: argparse.Namespace, index_url: str | None = None
) -> None:
    """``pip install``: from ``opts.wheels`` alone when given, else from the index; its
    output streamed to the terminal and ``opts.log``."""
    wheels = opts.wheels
    source = ["--no-index", "--find-links", str(wheels)] if wheels else []
    if index_url and not wheels:
        source = ["--index-url", index_url]
    cmd = [str(python), "-m", "pip", "install", "--progress-bar", "off", *source, *args]
    if run_streamed(cmd, opts.log, cwd=ROOT).returncode:
        where = f"the wheels in {wheels}" if wheels else "the package index"
        raise UserError(f"pip could not install {' '.join(args)} from {where} (log: {opts.log})")


def build_environment(opts: argparse.Namespace) -> Path:
    """``opts.venv`` on ``opts.python``'s torch, with the rest installed; its python."""
    base = probe(opts.python)
    venv_python = opts.venv / "bin" / "python"
    if not venv_python.exists():
        print(f"creating {opts.venv} on {base['executable']} (Python {base['python']})")
        if subprocess.run([str(opts.python), "-m", "venv", str(opts.venv)]).returncode:
            raise UserError(f"{opts.python} -m venv {opts.venv} failed (is ensurepip there?)")
    base_site_pth(opts.venv, base.get("site") or [])
    names = sorted({normalize(r.split("==")[0]) for r in pinned_requirements()})
    installed = probe(venv_python, names)
    if installed["torch"] is None or installed["cuda"] is None:
        pins = [r for r in pinned_requirements() if r.split("==")[0] in ("torch", "torchvision")]
        print(f"no CUDA torch in {opts.python}: installing {' '.join(pins)} (CUDA wheel)")
        pip(venv_python, pins, opts, opts.torch_index_url)
        installed = probe(venv_python, names)
    missing = missing_requirements(installed["packages"])
    first = [r for r in missing if r.split("==")[0] in ("numpy", "cython", "setuptools", "wheel")]
    fairseq = [r for r in missing if r.startswith("fairseq-fixed")]
    rest = [r for r in missing if r not in first + fairseq]
    if first:
        pip(venv_python, first, opts)
    if fairseq:  # a wheel, or its C extensions compile against the torch and numpy installed;
        # its requirements but torchaudio are among the rest (FAIRSEQ_REQUIRES)
        pip(venv_python, ["--no-build-isolation", "--no-deps", *fairseq], opts)
    if rest:
        pip(venv_python, rest, opts)
    # recurnmt itself: its requirements are all there now, the machine's torch among them
    pip(venv_python, ["--no-deps", "--no-build-isolation", "-e", str(ROOT)], opts)


def child_env() -> dict[str, str]:
    """The environment of the steps' commands: the checkout first on their import path, their
    output unbuffered (streamed as it comes)."""
    return {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
