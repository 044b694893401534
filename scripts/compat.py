"""``make compat``: recurnmt in a second environment, another Python and torch inside setup.cfg's
ranges, checked by the smoke subset of the tests.

    make compat PY=python3.12 TORCH=2.11.0        # that torch, the newest of the rest in range
    make compat PY=python3.12 LOWEST=1            # every direct requirement at its lower bound
    make compat PY=python3.13                     # the newest of everything
    make compat PY=python3.12 TORCH=2.11.0 INSTALLER=pip   # as `pip install -e .` does it
    make compat PY=python3.11 LOCKED=1            # the demo and CI environment (the lock)

It builds ``.venv-compat/NAME`` with ``scripts/setup_env.py`` (the ranges decide, and the torch
installed first is kept; with ``--lock`` the lock's versions), then

1. checks the installed distribution's metadata (``importlib.metadata``): its Requires-Python
   admits the environment's Python and its torch requirement the environment's torch, and the
   torch installed first is still there;
2. runs ``pytest -m smoke``: imports, every family's forward/backward and step-by-step decoding,
   ``fairseq-train``/``fairseq-generate`` through the command line, the export to transformers
   and vision training steps (the ``smoke`` marker in the tests says which);

and writes what it found (versions, each step's result and time) to ``docs/compat/NAME.json``
and its row of docs/install.md's table to the terminal; ``--table`` prints the table of every saved run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import setup_env  # scripts/ is this script's own directory, so its first import path

ROOT = setup_env.ROOT
PROG = "python scripts/compat.py"
RESULTS = ROOT / "docs" / "compat"
SHOWN = (
    "torch", "numpy", "fairseq-fixed", "transformers", "timm", "torchvision", "torchaudio",
    "datasets",
)  # fmt: skip

METADATA_CHECK = """
import json, platform, sys
from importlib import metadata
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

dist = metadata.distribution("recurnmt")
python = Version(platform.python_version())
torch = Version(metadata.version("torch").split("+")[0])
requires_python = dist.metadata["Requires-Python"]
torch_specs = [str(r.specifier) for r in map(Requirement, dist.requires or [])
               if r.name == "torch" and (r.marker is None or r.marker.evaluate())]
exact = [r for r in dist.requires or [] if "==" in r]
ok = (python in SpecifierSet(requires_python)
      and len(torch_specs) == 1 and torch in SpecifierSet(torch_specs[0]))
print(json.dumps({"requires_python": requires_python, "torch_requirement": torch_specs,
                  "exact_pins": exact, "ok": ok}))
"""


def env_name(python: str, torch: str | None, lowest: bool, installer: str, locked: bool) -> str:
    version = setup_env.probe(python)["python"].rsplit(".", 1)[0]
    kind = "locked" if locked else ("lowest" if lowest else "newest")
    parts = [f"py{version}", f"torch{torch}" if torch else kind]
    if installer == "pip":
        parts.append("pip")
    return "-".join(parts)


def run_step(cmd: list[str], log: Path) -> tuple[int, str, float]:
    """Runs ``cmd`` with its output streamed to the terminal and ``log``: exit code, last
    line, seconds."""
    print("+ " + " ".join(cmd), flush=True)
    start = time.perf_counter()
    last = ""
    with log.open("a", encoding="utf-8") as out:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for line in proc.stdout:
            sys.stdout.write(line)
            out.write(line)
            last = line.strip("= \n") or last
        code = proc.wait()
    return code, last, round(time.perf_counter() - start, 1)


def check(opts: argparse.Namespace) -> dict:
    """Builds the environment and runs the checks; the result document."""
    locked = opts.lock is not None
    name = opts.name or env_name(opts.python, opts.torch, opts.lowest, opts.installer, locked)
    venv = ROOT / ".venv-compat" / name
    venv.parent.mkdir(exist_ok=True)
    log = venv.parent / f"{name}.log"
    log.write_text("", encoding="utf-8")
    result = {
        "name": name,
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "make compat " + " ".join(opts.make_args),
        "resolution": "lock" if locked else ("lowest-direct" if opts.lowest else "newest"),
    }
    setup = argparse.Namespace(
        venv=venv,
        python=opts.python,
        lock=opts.lock,
        torch=opts.torch,
        lowest=opts.lowest,
        extras="dev,vision",
        here=False,
        installer=opts.installer,
    )
    env = setup_env.build(setup)
    python = venv / "bin" / "python"
    result["setup"] = {"installer": env["installer"], "seconds": env["seconds"]}
    result["python"] = env["python"]
    result["versions"] = {n: env["packages"][n] for n in SHOWN if n in env["packages"]}
    result["removed"] = env["removed"]
    proc = subprocess.run([str(python), "-c", METADATA_CHECK], capture_output=True, text=True)
    meta = json.loads(proc.stdout) if proc.returncode == 0 else {"ok": False, "error": proc.stderr}
    if opts.torch and env["packages"].get("torch", "").split("+")[0] != opts.torch:
        meta.update(ok=False, error=f"torch {env['packages'].get('torch')} is not {opts.torch}")
    result["metadata"] = meta
    print(f"metadata: {json.dumps(meta)}", flush=True)
    cmd = [str(python), "-m", "pytest", "-m", "smoke", "-q", "-p", "no:cacheprovider"]
    code, summary, seconds = run_step(cmd, log)
    result["smoke"] = {"summary": summary, "returncode": code, "seconds": seconds}
    result["passed"] = bool(meta.get("ok")) and code == 0
    return result


def brief(summary: str) -> str:
    """pytest's last line without what says nothing here: deselections and the time."""
    summary = re.sub(r", \d+ deselected", "", summary)
    return re.sub(r" in [\d.]+s( \([\d:]+\))?$", "", summary)


def row(result: dict) -> str:
    """The line of one run in docs/install.md's table."""
    versions = result["versions"]
    status = "pass" if result["passed"] else "**FAIL**"
    resolution = {"lock": "requirements/lock.txt", "newest": "newest in range"}.get(
        result["resolution"], result["resolution"]
    )
    cells = [
        result["python"],
        versions.get("torch", "-"),
        resolution,
        ", ".join(
            [f"{n} {versions[n]}" for n in SHOWN[1:] if n in versions]
            + [f"{n} removed (did not load)" for n in result.get("removed", {})]
        ),
        f"{status}: {brief(result['smoke']['summary'])}",
        f"{result['setup']['seconds']:.0f} s ({result['setup']['installer']})",
        f"{result['smoke']['seconds']:.0f} s",
        result["date"][:10],
    ]
    return "| " + " | ".join(cells) + " |"


def table(results: list[dict]) -> str:
    head = [
        "| Python | torch | resolution | others | smoke subset | set-up | tests | date |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    return "\n".join(head + [row(r) for r in results])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=sys.executable, help="the environment's interpreter")
    parser.add_argument("--torch", help="this torch version (default: the newest in range)")
    parser.add_argument("--lowest", action="store_true", help="lower bounds of every range")
    parser.add_argument(
        "--lock", type=Path, help="the lock's versions (the demo and CI environment) instead"
    )
    parser.add_argument("--installer", choices=("auto", "uv", "pip"), default="auto")
    parser.add_argument("--name", help="environment and result name (default from the versions)")
    parser.add_argument("--table", action="store_true", help="print the saved runs' table")
    opts = parser.parse_args(argv)
    # the interpreter by its name: a path of this machine runs nowhere else
    opts.make_args = [f"PY={Path(opts.python).name}"]
    opts.make_args += [f"TORCH={opts.torch}"] if opts.torch else []
    opts.make_args += ["LOWEST=1"] if opts.lowest else []
    opts.make_args += ["LOCKED=1"] if opts.lock else []
    opts.make_args += [f"INSTALLER={opts.installer}"] if opts.installer != "auto" else []
    return opts


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    if opts.table:
        runs = [json.loads(p.read_text("utf-8")) for p in sorted(RESULTS.glob("*.json"))]
        print(table(runs))
        return 0
    try:
        result = check(opts)
    except setup_env.SetupError as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"{result['name']}.json"
    out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(f"\nwrote {out.relative_to(ROOT)}\n{table([result])}")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
