"""Builds a recurnmt environment: the locked one of ``make setup`` or another for ``make compat``.

    python3.11 scripts/setup_env.py --venv .venv --lock requirements/lock.txt   # make setup
    python3.12 scripts/setup_env.py --venv .venv-x --torch 2.11.0               # ranges, torch kept
    python3.12 scripts/setup_env.py --venv .venv-x --lowest                     # the lower bounds
    python3.11 scripts/setup_env.py --venv .venv-lock --write-lock requirements/lock.txt
    python scripts/setup_env.py --here              # into the environment of this python

The order matters: fairseq-fixed compiles C extensions against the torch and numpy already in
the environment (``--no-build-isolation``; otherwise a build would first download a second
torch into an isolated build environment), so torch, numpy and the build tools come first,
then fairseq-fixed and recurnmt (editable) with its extras.

- With ``--lock FILE`` every package gets the version the lock names (``-c FILE``): the demo and
  CI environment, reproducible.
- Without it, setup.cfg's ranges decide, and the torch of the environment is kept: the one
  already installed there, or ``--torch VERSION``, or the newest in range (``--lowest``: the
  lowest version of every direct requirement, uv only: that proves setup.cfg's lower bounds).
- ``--here`` installs into the environment of ``--python`` itself (default: the interpreter
  running this script) instead of a virtual environment: the user's own, whose torch,
  torchvision and torchaudio stay as they are.

The installer is uv's pip interface when ``uv`` is on PATH or can be installed into the new
environment with pip (it resolves and downloads in parallel; nothing is installed into a
``--here`` environment for it); ``--installer pip`` uses pip alone, and uv's absence falls back
to it. uv is given the package indexes pip is configured with (pip.conf and ``PIP_*``
variables, as ``pip config list`` shows them) and pip's rule of taking the best version across
them, unless ``UV_*`` variables name indexes of their own.

A torchaudio that does not load with the environment's torch is removed from the environments
made here (recurnmt never imports it; transformers would fail to) and named with ``--here``.

Standard library only: it runs on the bare interpreter that the environment is made from.
"""

from __future__ import annotations

import argparse
import configparser
import datetime
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROG = "python scripts/setup_env.py"
# the uv installed into an environment when none is on PATH (the one the lock was made with)
UV_VERSION = "0.13.9"
# installed first: fairseq-fixed's C extensions are built against them without isolation
BUILD_TOOLS = ("cython", "setuptools>=64", "wheel")
# what an environment's own torch keeps: a CUDA image's torchvision and torchaudio belong to it
KEPT = ("torch", "torchvision", "torchaudio")
# fairseq-fixed requires torchaudio (recurnmt never uses it, but transformers imports it when
# it is installed). torchaudio 2.11.0 declares no torch requirement yet loads only with torch
# 2.11 or newer, so a resolver gives it to an older torch too; earlier releases require their
# own torch exactly. Below this torch the torchaudio of the torch's version is named. Where the
# torchaudio installed still does not load (torch 2.15 from PyPI is built for CUDA 13.2, the
# last torchaudio, 2.11.0, for CUDA 13.0, and it refuses the pair), it is removed again.
TORCHAUDIO_FLOATS_FROM = (2, 11)
# never written to a lock: the installers themselves and this project
NOT_LOCKED = {"pip", "uv", "recurnmt"}
UV_INDEX_VARS = (
    "UV_INDEX",
    "UV_INDEX_URL",
    "UV_DEFAULT_INDEX",
    "UV_EXTRA_INDEX_URL",
    "UV_FIND_LINKS",
)


class SetupError(Exception):
    """A failure whose message says what to do (printed without a traceback)."""


def normalize(name: str) -> str:
    """A distribution name as indexes compare them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    return normalize(re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement).group(1))


# --- what to install ------------------------------------------------------------------------


def setup_requirements(setup_cfg: Path = ROOT / "setup.cfg") -> dict[str, list[str]]:
    """setup.cfg's requirements: ``{"install": [...], EXTRA: [...]}`` (markers kept)."""
    cfg = configparser.ConfigParser()
    if not cfg.read(setup_cfg, encoding="utf-8"):
        raise SetupError(f"{setup_cfg}: not found")

    def lines(value: str) -> list[str]:
        return [line.strip() for line in value.splitlines() if line.strip()]

    out = {"install": lines(cfg["options"]["install_requires"])}
    out.update({name: lines(value) for name, value in cfg["options.extras_require"].items()})
    return out


# fairseq-fixed 0.12.3.1's requirements but torchaudio: the GPU check installs it without its
# own (--no-deps), since recurnmt never imports torchaudio, and a torchaudio other than the one
# built for the machine's torch breaks transformers' imports (docs/install.md)
FAIRSEQ_REQUIRES = (
    "cffi", "cython", "hydra-core", "omegaconf", "numpy", "regex", "sacrebleu", "tqdm",
    "bitarray", "scikit-learn", "packaging",
)  # fmt: skip


def pinned_requirements(lock: Path = ROOT / "requirements" / "lock.txt") -> list[str]:
    """``name==version`` of what the GPU check's environment needs (``make gpu-check``;
    ``make gpu-wheels`` downloads them), at the lock's versions: setup.cfg's requirements with
    the vision extra and pytest, fairseq-fixed's own but torchaudio
    (:data:`FAIRSEQ_REQUIRES`), and the build tools of fairseq's C extensions."""
    reqs = setup_requirements()
    lines = reqs["install"] + reqs["vision"] + [r for r in reqs["dev"] if "pytest" in r]
    names = ["cython", "setuptools", "wheel", *map(requirement_name, lines), *FAIRSEQ_REQUIRES]
    pins = read_lock(lock)
    return list(dict.fromkeys(f"{normalize(n)}=={pins[normalize(n)]}" for n in names))


def first_stage(requirements: dict[str, list[str]], torch: str | None) -> list[str]:
    """torch and numpy as setup.cfg bounds them (``torch==VERSION`` if asked)."""
    picked = [r for r in requirements["install"] if requirement_name(r) in ("torch", "numpy")]
    if torch:
        picked = [r for r in picked if requirement_name(r) != "torch"] + [f"torch=={torch}"]
    return picked


def read_lock(lock: Path) -> dict[str, str]:
    """``{name: version}`` of a lock file (``name==version`` lines, ``#`` comments)."""
    try:
        text = lock.read_text(encoding="utf-8")
    except OSError as err:
        raise SetupError(f"--lock {lock}: {err.strerror}") from err
    pins = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)", line)
        if not match:
            raise SetupError(f"--lock {lock}, line {number}: {raw!r} is not NAME==VERSION")
        pins[normalize(match.group(1))] = match.group(2)
    return pins


def lock_text(versions: dict[str, str], python: str, command: str) -> str:
    """A lock file: a header saying how it was made, then ``name==version`` sorted by name."""
    header = [
        "# The exact versions `make setup` installs (the demo and CI environment), as constraints",
        "# within setup.cfg's ranges. Made by the command below on the date below; check a new one",
        "# with `make test` before committing it.",
        f"#   {command}",
        f"# Python {python}, {datetime.date.today().isoformat()}",
    ]
    pins = [f"{name}=={versions[name]}" for name in sorted(versions, key=normalize)]
    return "\n".join(header + pins) + "\n"


# --- the interpreter and its environment ------------------------------------------------------

PROBE = """
import json, platform, sys
from importlib import metadata
print(json.dumps({"python": platform.python_version(), "prefix": sys.prefix,
                  "packages": {d.metadata["Name"]: d.version for d in metadata.distributions()}}))
"""


def probe(python: Path | str) -> dict:
    """The Python version and the installed distributions of ``python``."""
    try:
        proc = subprocess.run([str(python), "-c", PROBE], capture_output=True, text=True)
    except OSError as err:
        raise SetupError(f"{python}: {err.strerror}") from err
    if proc.returncode:
        raise SetupError(f"{python} does not run: {proc.stderr.strip()[-500:]}")
    info = json.loads(proc.stdout)
    info["packages"] = {normalize(k): v for k, v in info["packages"].items()}
    return info


def ensure_venv(base_python: str, venv: Path) -> Path:
    """``venv``'s python, creating it from ``base_python``; one of another Python is refused."""
    base = probe(base_python)
    python = venv / "bin" / "python"
    if python.exists():
        have = probe(python)["python"]
        if have.split(".")[:2] != base["python"].split(".")[:2]:
            raise SetupError(
                f"{venv} holds Python {have}, not {base['python']} ({base_python}): remove it "
                f"(make clean) or choose another --venv"
            )
        return python
    print(f"creating {venv} with Python {base['python']} ({base_python})", flush=True)
    if subprocess.run([base_python, "-m", "venv", str(venv)]).returncode:
        raise SetupError(f"{base_python} -m venv {venv} failed (is the venv module there?)")
    return python


# --- the installers -------------------------------------------------------------------------


def pip_config(python: Path) -> dict[str, list[str]]:
    """pip's index settings (``index-url``, ``extra-index-url``, ``find-links``) as
    ``pip config list`` shows them: files and ``PIP_*`` variables, the most specific last."""
    proc = subprocess.run(
        [str(python), "-m", "pip", "config", "list"], capture_output=True, text=True
    )
    return parse_pip_config(proc.stdout if proc.returncode == 0 else "")


def parse_pip_config(listing: str) -> dict[str, list[str]]:
    """``pip config list`` output -> ``{key: values}`` for the index keys; the
    ``install``/``:env:`` sections override ``global`` as in pip."""
    rank = {"global": 0, "install": 1, ":env:": 2}
    found: dict[str, tuple[int, list[str]]] = {}
    for line in listing.splitlines():
        match = re.fullmatch(r"([^.]*)\.([a-z-]+)='(.*)'", line.strip())
        if not match or match.group(2) not in ("index-url", "extra-index-url", "find-links"):
            continue
        section, key, value = match.groups()
        level = rank.get(section, -1)
        if level >= found.get(key, (-1, []))[0]:
            found[key] = (level, value.split())
    return {key: values for key, (_, values) in found.items()}


def uv_index_flags(config: dict[str, list[str]], environ: dict[str, str]) -> list[str]:
    """uv flags for pip's indexes (none when ``UV_*`` variables choose uv's own)."""
    if any(environ.get(var) for var in UV_INDEX_VARS) or not config:
        return []
    flags = []
    for url in config.get("index-url", [])[:1]:
        flags += ["--index-url", url]
    for url in config.get("extra-index-url", []):
        flags += ["--extra-index-url", url]
    for link in config.get("find-links", []):
        flags += ["--find-links", link]
    # pip takes the best version across all indexes; uv's default stops at the first that has
    # the package, which fails where a local mirror holds one platform's wheels only
    return [*flags, "--index-strategy", "unsafe-best-match"]


@dataclass
class Installer:
    """``pip install`` or ``uv pip install`` into one environment."""

    python: Path
    uv: str | None = None
    index_flags: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return "uv" if self.uv else "pip"

    def install(
        self,
        requirements: list[str],
        *,
        constraints: Path | None = None,
        editable: str | None = None,
        lowest: bool = False,
    ) -> None:
        args = [*requirements]
        if editable:
            args += ["-e", editable]
        if constraints:
            args += ["-c", str(constraints)]
        if self.uv:
            cmd = [self.uv, "pip", "install", "--python", str(self.python), *self.index_flags]
            cmd += ["--resolution", "lowest-direct"] if lowest else []
            # as pip does: compiled once here, not at each first import (where Python 3.12
            # would also print fairseq's invalid-escape SyntaxWarnings to the user)
            cmd += ["--compile-bytecode"]
        else:
            cmd = [str(self.python), "-m", "pip", "install", "--quiet"]
        cmd += ["--no-build-isolation", *args]
        print("+ " + shlex.join(cmd), flush=True)
        # setuptools prints an "Editable installation" notice nobody can act on
        env = {**os.environ, "PYTHONWARNINGS": "ignore:Editable installation"}
        if subprocess.run(cmd, cwd=ROOT, env=env).returncode:
            raise SetupError(f"{self.name} could not install {' '.join(args)} (see above)")

    def uninstall(self, name: str) -> None:
        if self.uv:
            cmd = [self.uv, "pip", "uninstall", "--python", str(self.python), name]
        else:
            cmd = [str(self.python), "-m", "pip", "uninstall", "--yes", "--quiet", name]
        print("+ " + shlex.join(cmd), flush=True)
        if subprocess.run(cmd).returncode:
            raise SetupError(f"{self.name} could not uninstall {name} (see above)")


def choose_installer(python: Path, choice: str, bootstrap: bool = True) -> Installer:
    """uv (on PATH, else installed into the environment by pip when ``bootstrap``) unless
    ``choice`` is pip."""
    if choice == "pip":
        return Installer(python)
    uv = shutil.which("uv")
    if uv is None:
        local = python.parent / "uv"
        if not local.exists() and not bootstrap:
            if choice == "uv":
                raise SetupError("no uv on PATH (--here installs none into your environment)")
            return Installer(python)
        if not local.exists():
            cmd = [str(python), "-m", "pip", "install", "--quiet", f"uv=={UV_VERSION}"]
            print("+ " + shlex.join(cmd), flush=True)
            if subprocess.run(cmd).returncode:
                if choice == "uv":
                    raise SetupError(f"uv=={UV_VERSION} could not be installed with pip")
                print(f"uv=={UV_VERSION} not installable: installing with pip", flush=True)
                return Installer(python)
        uv = str(local)
    return Installer(python, uv, uv_index_flags(pip_config(python), dict(os.environ)))


# --- the build ------------------------------------------------------------------------------


def torchaudio_for(torch: str) -> str | None:
    """The torchaudio an older ``torch`` needs (None from torch 2.11 on: any, the newest)."""
    base = torch.split("+")[0]
    major_minor = tuple(int(part) for part in base.split(".")[:2])
    return f"torchaudio=={base}" if major_minor < TORCHAUDIO_FLOATS_FROM else None


def torchaudio_error(python: Path) -> str | None:
    """Why ``import torchaudio`` fails in ``python``'s environment (None: it loads, or is
    not installed)."""
    code = "import importlib.util\nif importlib.util.find_spec('torchaudio'): import torchaudio"
    proc = subprocess.run([str(python), "-c", code], capture_output=True, text=True)
    if proc.returncode == 0:
        return None
    lines = proc.stderr.strip().splitlines()
    return lines[-1] if lines else f"exit code {proc.returncode}"


def kept_constraints(installed: dict[str, str], work: Path) -> Path:
    """A constraints file holding the environment's torch (and torchvision, torchaudio) at
    their versions, and the torchaudio an older torch needs where none is installed."""
    path = work / "kept.txt"
    pins = [f"{name}=={installed[name]}" for name in KEPT if name in installed]
    if "torch" in installed and "torchaudio" not in installed:
        pins += filter(None, [torchaudio_for(installed["torch"])])
    path.write_text("".join(f"{pin}\n" for pin in pins), encoding="utf-8")
    return path


def refuse_impossible(opts: argparse.Namespace) -> None:
    """Stops on settings that contradict each other, before anything is made."""
    if opts.lowest and opts.installer == "pip":
        raise SetupError("--lowest needs uv (pip has no lowest-version resolution)")
    if opts.lock and (opts.torch or opts.lowest):
        raise SetupError("--lock fixes every version: it takes neither --torch nor --lowest")
    if opts.here and (opts.lock or opts.lowest):
        raise SetupError("--here keeps your environment's versions: it takes no --lock or --lowest")
    if opts.lock:
        read_lock(opts.lock)  # a missing or malformed lock


def install_stages(installer: Installer, opts: argparse.Namespace, extras: str) -> None:
    """torch, numpy and the build tools; then fairseq-fixed and recurnmt with ``extras``."""
    python = installer.python
    with tempfile.TemporaryDirectory() as tmp:
        before = probe(python)["packages"]
        if opts.lock:
            constraints = opts.lock
        elif "torch" in before and not opts.torch:
            print(f"keeping the environment's torch {before['torch']}", flush=True)
            constraints = kept_constraints(before, Path(tmp))
        else:
            constraints = None
        tools = list(BUILD_TOOLS)
        if opts.lowest:  # the build tools are no requirement of recurnmt's: their newest
            installer.install(tools)
            tools = []
        first = first_stage(setup_requirements(), opts.torch)
        installer.install([*first, *tools], constraints=constraints, lowest=opts.lowest)
        if not opts.lock:  # from here on the torch just installed stays
            constraints = kept_constraints(probe(python)["packages"], Path(tmp))
        installer.install([], editable=f".{extras}", constraints=constraints, lowest=opts.lowest)


def settle_torchaudio(installer: Installer, remove: bool) -> dict[str, str]:
    """Removes a torchaudio that does not load (``remove``) or says so; ``{name: why}``."""
    error = torchaudio_error(installer.python)
    if not error:
        return {}
    if not remove:  # the user's own environment: said, not changed
        print(
            f"warning: torchaudio does not load with this torch ({error}), and transformers "
            "imports it (recurnmt.hf stops with the fix): uninstall it (recurnmt does not use "
            "it) or install the torchaudio built for your torch",
            flush=True,
        )
        return {}
    print(f"torchaudio does not load with this torch ({error}): removing it", flush=True)
    installer.uninstall("torchaudio")
    return {"torchaudio": error}


def build(opts: argparse.Namespace) -> dict:
    """Creates or updates ``opts.venv`` (or ``--here`` the environment of ``opts.python``);
    what it holds afterwards and how long that took."""
    start = time.perf_counter()
    refuse_impossible(opts)
    if opts.here:
        python, where = Path(opts.python), f"the environment of {opts.python}"
        probe(python)  # it runs
    else:
        python, where = ensure_venv(opts.python, opts.venv), str(opts.venv)
    installer = choose_installer(python, opts.installer, bootstrap=not opts.here)
    extras = (
        opts.extras if opts.extras is not None else ("vision" if opts.here else "dev,vision,deploy")
    )
    install_stages(installer, opts, f"[{extras}]" if extras else "")
    removed = settle_torchaudio(installer, remove=not opts.here)
    check = subprocess.run(
        [str(python), "-c", "import fairseq, recurnmt.nmt"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )  # fairseq's import-time notices are no news here; an error is
    if check.returncode:
        raise SetupError(
            f"{python} cannot import fairseq and recurnmt.nmt:\n{check.stderr[-3000:]}"
        )
    after = probe(python)
    summary = {
        "python": after["python"],
        "installer": installer.name,
        "seconds": round(time.perf_counter() - start, 1),
        "packages": after["packages"],
        "removed": removed,
    }
    names = ("torch", "numpy", "fairseq-fixed", "transformers", "timm", "torchvision")
    versions = ", ".join(f"{n} {after['packages'][n]}" for n in names if n in after["packages"])
    print(
        f"{where}: Python {after['python']}, {versions} ({installer.name}, "
        f"{summary['seconds']:.0f} s)",
        flush=True,
    )
    return summary


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--venv", type=Path, default=ROOT / ".venv")
    parser.add_argument(
        "--python", default=sys.executable, help="interpreter the environment is made from"
    )
    parser.add_argument(
        "--here", action="store_true", help="install into --python's own environment, no venv"
    )
    parser.add_argument("--lock", type=Path, help="install exactly these versions")
    parser.add_argument("--torch", help="this torch version instead of the environment's")
    parser.add_argument(
        "--lowest", action="store_true", help="lowest version of every direct requirement (uv)"
    )
    parser.add_argument(
        "--extras", help="recurnmt's extras (default: dev,vision,deploy; with --here: vision)"
    )
    parser.add_argument("--installer", choices=("auto", "uv", "pip"), default="auto")
    parser.add_argument("--write-lock", type=Path, metavar="FILE", help="then write a lock file")
    parser.add_argument("--json", type=Path, help="write what was installed and the time here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    try:
        summary = build(opts)
    except SetupError as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2
    if opts.write_lock:
        versions = {n: v for n, v in summary["packages"].items() if n not in NOT_LOCKED}
        command = "python scripts/setup_env.py " + " ".join(argv or sys.argv[1:])
        opts.write_lock.write_text(lock_text(versions, summary["python"], command), "utf-8")
        print(f"wrote {opts.write_lock} ({len(versions)} packages)")
    if opts.json:
        opts.json.write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
