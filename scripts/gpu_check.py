"""``make gpu-check``: the CUDA tests and the base-size benchmarks on a GPU, as one report.

On a CUDA machine it

1. builds ``.venv-gpu`` on the CUDA torch already installed: a virtual environment of
   ``--python`` (default: this interpreter) that also sees that interpreter's packages (a
   ``.pth`` file; plain ``--system-site-packages`` would miss a torch that lives in another
   virtual environment), so the machine's own torch, torchvision and numpy are kept, whatever
   their versions. Only what is missing is installed, at the versions of
   requirements/lock.txt, from the package index or, with ``--wheels DIR``, from that folder alone
   (GPU machines often reach no index); fairseq's C extensions are compiled against the torch
   found. Where no torch is installed at all, the pinned torch's CUDA wheel comes from the
   index (``--torch-index-url``; PyPI's Linux wheel of torch 2.14.1 is the CUDA 13.0 build);
2. runs ``pytest -m cuda`` (the CUDA half of the device-parametrized tests);
3. runs ``scripts/benchmark_nmt.py`` at base size (H=512, FF=2048, 8 heads, 6 levels) and
   ``scripts/benchmark_vision.py`` at ViT-S/16 (D=384, FF=1536, 6 heads, 12 levels, 224 px),
   each in every ``--dtypes`` (fp16 and bf16);
4. writes one markdown report (``--out``, default ``docs/gpu_check.md``) and the raw figures
   beside it (``.json``): device, Python, torch, CUDA and the other versions, the tests'
   result, and the tables of ratios to fairseq's ``transformer`` and to timm's ViT, each
   ratio next to its target (issue 13): training tokens/s of every weight-shared family
   >= 1.0x the transformer in fp16, generation (beam 4) >= 1.0x, and the cross-attention
   part of the decoder cache at most M/N of the transformer's for M unique cross-attentions
   over N levels (1/N for a fully shared decoder).

Without a CUDA device it stops at once. ``--cpu-smoke`` runs steps 3 and 4 on the CPU at a
tiny size in bf16 (no environment, no pytest), to check the pipeline and the report anywhere.

    make gpu-check                                   # python3's CUDA torch, index for the rest
    make gpu-check PYTHON=/opt/torch/.venv/bin/python3 WHEELS=wheels   # no index
    python scripts/gpu_check.py --cpu-smoke --out /tmp/gpu_check.md
"""

from __future__ import annotations

import argparse
import configparser
import datetime
import functools
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from recurnmt.cli import UserError, entry_point  # noqa: E402  (standard library only)

PROG = "python scripts/gpu_check.py"
DTYPES = ("fp32", "bf16", "fp16")
NMT_BASELINE = "transformer"
VISION_BASELINE = "timm vit"
# scripts/benchmark_*.py flags per size; "base" is the base size
NMT_SIZES = {
    "base": "--embed-dim 512 --ffn-dim 2048 --heads 8 --levels 6 --max-tokens 4096 "
    "--warmup 5 --steps 20 --train-rounds 2 --sentences 256 --gen-batch 64 --gen-rounds 3 "
    "--beam 4 --decode-len 32",
    "smoke": "--embed-dim 32 --ffn-dim 64 --heads 2 --levels 2 --max-tokens 256 --warmup 1 "
    "--steps 1 --train-rounds 1 --sentences 4 --gen-batch 4 --gen-rounds 1 --beam 4 "
    "--decode-len 4 --threads 1",
}
VISION_SIZES = {
    "base": "--embed-dim 384 --ffn-dim 1536 --heads 6 --levels 12 --img-size 224 "
    "--patch-size 16 --batch-size 128 --warmup 5 --steps 20 --rounds 2",
    "smoke": "--embed-dim 32 --ffn-dim 64 --heads 2 --levels 2 --img-size 16 --patch-size 4 "
    "--batch-size 4 --warmup 1 --steps 1 --rounds 1 --threads 1",
}
REPORTED_PACKAGES = ("numpy", "fairseq-fixed", "timm", "torchvision", "triton")


# --- targets and report --------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """A ratio's target: ``>= bound`` (speed) or ``<= bound`` (memory)."""

    bound: float
    at_least: bool

    def met(self, ratio: float) -> bool:
        """Judged on the ratio as the report prints it (two decimals)."""
        shown, bound = round(ratio, 2), round(self.bound, 2)
        return shown >= bound if self.at_least else shown <= bound

    def cell(self, ratio: float) -> str:
        sign = ">=" if self.at_least else "<="
        return f"{sign} {self.bound:.2f} " + ("met" if self.met(ratio) else "**missed**")


NMT_TARGETED = ("train_tokens_per_s", "gen_sentences_per_s", "cross_cache_mb")


def nmt_targets(row: dict, base: dict, dtype: str) -> dict[str, Target | None]:
    """Issue 13's targets of one architecture's row (None: no target for this row).

    Speed, in fp16: weight-shared families (P* below the transformer's) at least as fast
    (the issue sets no speed target in other dtypes). Cache, in every dtype: the
    cross-attention keys and values at most M/N of the transformer's (M unique
    cross-attentions, N levels), which any decoder that projects the memory once per unique
    block meets, fairseq's own at M = N included.
    """
    shared = row["arch"] != base["arch"] and row["p_star"] < base["p_star"]
    speed = Target(1.0, at_least=True) if shared and dtype == "fp16" else None
    cache = Target(row["cross_attentions"] / row["levels"], at_least=False)
    return {"train_tokens_per_s": speed, "gen_sentences_per_s": speed, "cross_cache_mb": cache}


def ratio_rows(
    results: list[dict],
    name_key: str,
    columns: list[tuple[str, str, str]],
    targets=None,
    targeted: tuple[str, ...] = (),
) -> list[str]:
    """Markdown table rows: each column's value, its ratio to the first row and, for the
    ``targeted`` columns, the target ``targets(row, base)`` gives (or -) with met / missed."""
    base = results[0]
    header = [name_key]
    for title, key, _ in columns:
        header += [title, "ratio"] + (["target"] if key in targeted else [])
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for row in results:
        goals = targets(row, base) if targets else {}
        cells = [f"`{row[name_key]}`"]
        for _, key, fmt in columns:
            ratio = row[key] / max(base[key], 1e-12)
            cells += [format(row[key], fmt), f"{ratio:.2f}"]
            if key in targeted:
                goal = goals.get(key)
                cells.append(goal.cell(ratio) if goal else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


NMT_COLUMNS = [
    ("train tok/s", "train_tokens_per_s", ".0f"),
    ("gen sent/s", "gen_sentences_per_s", ".1f"),
    ("peak MB", "peak_mem_mb", ".0f"),
    ("cross-attn cache MB", "cross_cache_mb", ".2f"),
    ("cache MB", "cache_mb", ".2f"),
    # what an update computes per token (SReT's projections: more) and how fast it runs it
    ("train FLOP/token", "train_flops_per_token", ".3g"),
    ("train FLOP/s", "train_flops_per_s", ".3g"),
]
VISION_COLUMNS = [
    ("train img/s", "train_images_per_s", ".1f"),
    ("infer img/s", "infer_images_per_s", ".1f"),
    ("peak MB", "peak_mem_mb", ".0f"),
]


def settings_line(doc: dict) -> str:
    s = doc["settings"]
    if "img_size" in s:
        return (
            f"D={s['embed_dim']}, FF={s['ffn_dim']}, {s['heads']} heads, {s['levels']} levels, "
            f"{s['img_size']} px in {s['patch_size']} px patches, batches of {s['batch_size']}, "
            f"{s['steps']} timed updates"
        )
    return (
        f"H={s['embed_dim']}, FF={s['ffn_dim']}, {s['heads']} heads, {s['levels']} levels, "
        f"{s['max_tokens']} tokens a batch, {s['steps']} timed updates; {s['sentences']} "
        f"sentences decoded in batches of {s['gen_batch']}, beam {s['beam']}, "
        f"{s['decode_len']} tokens each"
    )


def render_report(check: dict) -> str:
    """The markdown report of one run (``check``: what :func:`run_check` gathered)."""
    env = check["environment"]
    lines = [
        "# GPU check",
        "",
        f"Written by `{check['command']}` on {check['date']}"
        + (" (**CPU smoke run at a tiny size: no GPU figure**)." if check["smoke"] else "."),
        "",
        "| | |",
        "| --- | --- |",
        f"| device | {env['device_name']} |",
        f"| Python | {env['python']} |",
        f"| torch | {env['torch']} (CUDA {env['cuda']}, cuDNN {env['cudnn']}) |",
    ]
    for name, version in env["packages"].items():
        lines.append(f"| {name} | {version or 'not installed'} |")
    tests = check["tests"]
    lines.append(f"| tests (`pytest -m cuda`) | {tests['summary']} |")
    sections = [
        ("Translation", "nmt", "arch", NMT_COLUMNS, NMT_BASELINE),
        ("Images", "vision", "model", VISION_COLUMNS, VISION_BASELINE),
    ]
    for title, key, name_key, columns, baseline in sections:
        for dtype, doc in check[key].items():
            targeted, targets = (), None
            if key == "nmt":
                targeted = NMT_TARGETED
                targets = functools.partial(nmt_targets, dtype=dtype)
            lines += ["", f"## {title}, {dtype}", ""]
            if "error" in doc:
                lines += ["The benchmark failed:", "", "```", doc["error"], "```"]
                continue
            lines += [
                f"Ratios to `{baseline}`, measured in the same run; {settings_line(doc)}. "
                f"Memory is the peak `torch.cuda.max_memory_allocated` of one training step"
                + (" (on the CPU: the bytes saved for backward)." if check["smoke"] else "."),
                "",
                *ratio_rows(doc["results"], name_key, columns, targets, targeted),
            ]
            if key == "nmt":
                lines += [
                    "",
                    "The cache is the decoder's incremental state after beam search decoded one "
                    "batch; its cross-attention part is the projected encoder keys and values. "
                    "Speed targets (issue 13) apply to the weight-shared families (P* below "
                    "the transformer's) in fp16; the cache target M/N holds for M unique "
                    "cross-attentions over N levels.",
                ]
    return "\n".join(lines) + "\n"


# --- environment ---------------------------------------------------------------------------

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
    return shutil.which("nvidia-smi") is not None or Path("/proc/driver/nvidia/version").exists()


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pinned_requirements() -> list[str]:
    """``name==version`` of what the GPU environment needs, at requirements/lock.txt's versions:
    setup.cfg's requirements with the vision extra and pytest, fairseq-fixed's exactly pinned
    hydra-core and omegaconf, and the build tools fairseq's C extensions are compiled with."""
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    extras = cfg["options.extras_require"]
    lines = cfg["options"]["install_requires"].splitlines() + extras["vision"].splitlines()
    lines += [r for r in extras["dev"].splitlines() if "pytest" in r]
    names = [re.match(r"[A-Za-z0-9._-]+", r.strip()).group(0) for r in lines if r.strip()]
    names = ["cython", "setuptools", "wheel", *names, "hydra-core", "omegaconf"]
    lock = {}
    for line in (ROOT / "requirements" / "lock.txt").read_text(encoding="utf-8").splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==")
            lock[normalize(name)] = version
    return list(dict.fromkeys(f"{normalize(n)}=={lock[normalize(n)]}" for n in names))


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


def pip(python: Path, args: list[str], wheels: Path | None, index_url: str | None = None):
    """``pip install``: from ``wheels`` alone when given, else from the index."""
    source = ["--no-index", "--find-links", str(wheels)] if wheels else []
    if index_url and not wheels:
        source = ["--index-url", index_url]
    cmd = [str(python), "-m", "pip", "install", "--quiet", *source, *args]
    print("+ " + " ".join(cmd), flush=True)
    if subprocess.run(cmd, cwd=ROOT).returncode:
        where = f"the wheels in {wheels}" if wheels else "the package index"
        raise UserError(f"pip could not install {' '.join(args)} from {where}")


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
        pip(venv_python, pins, opts.wheels, opts.torch_index_url)
        installed = probe(venv_python, names)
    missing = missing_requirements(installed["packages"])
    first = [r for r in missing if r.split("==")[0] in ("numpy", "cython", "setuptools", "wheel")]
    fairseq = [r for r in missing if r.startswith("fairseq-fixed")]
    rest = [r for r in missing if r not in first + fairseq]
    if first:
        pip(venv_python, first, opts.wheels)
    if fairseq:  # its C extensions compile against the torch and numpy now installed
        pip(venv_python, ["--no-build-isolation", *fairseq], opts.wheels)
    if rest:
        pip(venv_python, rest, opts.wheels)
    # recurnmt itself: its requirements are all there now, the machine's torch among them
    pip(venv_python, ["--no-deps", "--no-build-isolation", "-e", str(ROOT)], opts.wheels)
    return venv_python


# --- the run -------------------------------------------------------------------------------


def run_tests(python: Path) -> dict:
    """``pytest -m cuda``: its summary line and exit code."""
    cmd = [str(python), "-m", "pytest", "-m", "cuda", "-q", "-p", "no:cacheprovider"]
    print("+ " + " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=child_env())
    print(proc.stdout[-3000:], proc.stderr[-2000:], sep="\n", flush=True)
    lines = [line.strip("= ") for line in proc.stdout.splitlines() if line.strip()]
    summary = lines[-1] if lines else "(no output)"
    return {"summary": f"{summary} (exit code {proc.returncode})", "returncode": proc.returncode}


def child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}


def run_benchmark(python: Path, script: str, flags: list[str], out: Path) -> dict:
    """One benchmark script's JSON document, or ``{"error": its output's tail}``."""
    cmd = [str(python), str(ROOT / "scripts" / script), *flags, "--json", str(out)]
    print("+ " + " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, cwd=ROOT, env=child_env(), capture_output=True, text=True)
    print(proc.stdout, flush=True)
    if proc.returncode or not out.exists():
        return {"error": (proc.stderr or proc.stdout).strip()[-2000:] or f"exit {proc.returncode}"}
    return json.loads(out.read_text(encoding="utf-8"))


def run_check(opts: argparse.Namespace, python: Path, env: dict) -> dict:
    """Tests and benchmarks; everything the report shows."""
    size = "smoke" if opts.cpu_smoke else "base"
    device = "cpu" if opts.cpu_smoke else "cuda"
    if opts.cpu_smoke or opts.skip_tests:
        why = "CPU smoke run" if opts.cpu_smoke else "--skip-tests"
        tests = {"summary": f"not run ({why})", "returncode": 0}
    else:
        tests = run_tests(python)
    raw = opts.out.with_suffix("")
    raw.mkdir(parents=True, exist_ok=True)
    nmt, vision = {}, {}
    for dtype in opts.dtypes:
        common = ["--device", device, "--dtype", dtype]
        nmt_flags = [*NMT_SIZES[size].split(), *common]
        nmt_flags += ["--archs", *opts.archs] if opts.archs else []
        if opts.data:
            nmt_flags += ["--data", str(opts.data)]
        if "nmt" in opts.parts:
            nmt[dtype] = run_benchmark(
                python, "benchmark_nmt.py", nmt_flags, raw / f"nmt_{dtype}.json"
            )
        vision_flags = [*VISION_SIZES[size].split(), *common]
        vision_flags += ["--models", *opts.models] if opts.models else []
        if "vision" in opts.parts:
            vision[dtype] = run_benchmark(
                python, "benchmark_vision.py", vision_flags, raw / f"vision_{dtype}.json"
            )
    return {
        "command": "make gpu-check" if not opts.cpu_smoke else f"{PROG} --cpu-smoke",
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "smoke": opts.cpu_smoke,
        "environment": env,
        "tests": tests,
        "nmt": nmt,
        "vision": vision,
    }


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "gpu_check.md")
    parser.add_argument(
        "--python", default=sys.executable, help="the interpreter whose CUDA torch is used"
    )
    parser.add_argument("--venv", type=Path, default=ROOT / ".venv-gpu")
    parser.add_argument("--wheels", type=Path, help="install from this folder only (no index)")
    parser.add_argument("--torch-index-url", help="where the CUDA torch wheel comes from")
    parser.add_argument(
        "--no-setup", action="store_true", help="use --python as it is (no .venv-gpu)"
    )
    parser.add_argument("--skip-tests", action="store_true", help="no pytest -m cuda")
    parser.add_argument("--dtypes", nargs="+", default=["fp16", "bf16"], choices=DTYPES)
    parser.add_argument("--archs", nargs="+", default=[], help="NMT families (default: all)")
    parser.add_argument("--models", nargs="+", default=[], help="image models (default: all)")
    parser.add_argument("--data", type=Path, help="the NMT benchmark's data-bin")
    parser.add_argument(
        "--parts",
        nargs="+",
        default=["nmt", "vision"],
        choices=["nmt", "vision"],
        help="which benchmarks run (default: both)",
    )
    parser.add_argument(
        "--list-missing",
        action="store_true",
        help="print the pinned packages that --python lacks (what WHEELS= must hold), then stop",
    )
    parser.add_argument(
        "--cpu-smoke",
        action="store_true",
        help="the benchmarks and the report on the CPU at a tiny size, bf16 (no GPU needed)",
    )
    opts = parser.parse_args(argv)
    if opts.wheels is not None and not opts.wheels.is_dir():
        raise ValueError(f"--wheels {opts.wheels}: not a directory")
    if opts.cpu_smoke and "fp16" in opts.dtypes:
        opts.dtypes = [d for d in opts.dtypes if d != "fp16"] or ["bf16"]
    return opts


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(list(sys.argv[1:] if argv is None else argv))
    if opts.list_missing:
        names = sorted({normalize(r.split("==")[0]) for r in pinned_requirements()})
        print("\n".join(missing_requirements(probe(opts.python, names)["packages"])))
        return 0
    if not opts.cpu_smoke and not has_nvidia_driver():
        raise UserError(
            "no NVIDIA GPU on this machine (no nvidia-smi, no /proc/driver/nvidia): "
            f"gpu-check needs CUDA; `{PROG} --cpu-smoke` runs its pipeline on the CPU"
        )
    if opts.cpu_smoke or opts.no_setup:
        python = Path(opts.python)
    else:
        python = build_environment(opts)
    env = probe(python, list(REPORTED_PACKAGES))
    if not opts.cpu_smoke and not env.get("cuda_available"):
        raise UserError(
            f"torch {env.get('torch')} of {python} sees no CUDA device "
            f"(its CUDA build: {env.get('cuda')})"
        )
    check = run_check(opts, python, env)
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    opts.out.write_text(render_report(check), encoding="utf-8")
    opts.out.with_suffix(".json").write_text(json.dumps(check, indent=2) + "\n")
    print(f"report: {opts.out}")
    failed = check["tests"]["returncode"] != 0 or any(
        "error" in doc for part in ("nmt", "vision") for doc in check[part].values()
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(entry_point(main, PROG)())
