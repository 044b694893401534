"""``python -m scripts.gpu_check``: the check's command line (the package's docstring says what
it runs)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from recurnmt.cli import UserError, entry_point  # standard library only
from recurnmt.experiments.timed import Budget  # standard library only
from scripts import gpu_check
from scripts.gpu_check.environment import (
    REPORTED_PACKAGES,
    ROOT,
    build_environment,
    has_nvidia_driver,
    missing_requirements,
    normalize,
    pinned_requirements,
    probe,
)
from scripts.gpu_check.report import PROG, Report
from scripts.gpu_check.steps import (
    DECODE_MODELS,
    DEFAULT_BUDGET,
    DEFAULT_DECODE,
    DTYPES,
    MIN_STEP_SECONDS,
    PARTS,
    decode_setting,
    plan_steps,
    run_steps,
)


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The check's options, with what follows from them: the log's and the raw documents'
    paths, and the factor the steps' counts are scaled by (the budget over the default)."""
    parser = argparse.ArgumentParser(prog=PROG, description=gpu_check.__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "gpu_check.md")
    parser.add_argument(
        "--budget",
        type=float,
        default=DEFAULT_BUDGET,
        help="seconds of wall time for the whole check, installation included "
        "(default %(default)g: 8 minutes); the runs are sized to it",
    )
    parser.add_argument("--log", type=Path, help="every command's output (default: OUT's .log)")
    parser.add_argument(
        "--python", default=sys.executable, help="the interpreter whose CUDA torch is used"
    )
    parser.add_argument("--venv", type=Path, default=ROOT / ".venv-gpu")
    parser.add_argument("--wheels", type=Path, help="install from this folder only (no index)")
    parser.add_argument("--torch-index-url", help="where the CUDA torch wheel comes from")
    parser.add_argument(
        "--no-setup", action="store_true", help="use --python as it is (no .venv-gpu)"
    )
    parser.add_argument(
        "--setup-only", action="store_true", help="build .venv-gpu, then stop (no GPU needed)"
    )
    parser.add_argument("--skip-tests", action="store_true", help="no pytest -m cuda")
    parser.add_argument(
        "--dtypes",
        nargs="+",
        default=["fp16"],
        choices=DTYPES,
        help="half precisions measured (default fp16, what the targets are set in; "
        "add bf16 with a larger --budget)",
    )
    parser.add_argument(
        "--decode",
        nargs="+",
        default=[DEFAULT_DECODE],
        metavar="SIZE-bBEAM",
        help=f"the generation settings measured, in every --dtypes: SIZE {' or '.join(DECODE_MODELS)} "
        "(fairseq's transformer_wmt_en_de, transformer_iwslt_de_en), BEAM the beam "
        "(default %(default)s; e.g. --decode base-b4 iwslt-b4 base-b1 with a larger --budget)",
    )
    parser.add_argument("--archs", nargs="+", default=[], help="NMT families (default: all)")
    parser.add_argument("--models", nargs="+", default=[], help="image models (default: all)")
    parser.add_argument("--data", type=Path, help="the NMT benchmark's data-bin")
    parser.add_argument(
        "--parts",
        nargs="+",
        default=list(PARTS),
        choices=PARTS,
        help="which steps run, in this order (default: all)",
    )
    parser.add_argument(
        "--list-missing",
        action="store_true",
        help="print the pinned packages that --python lacks (what WHEELS= must hold), then stop",
    )
    parser.add_argument(
        "--cpu-smoke",
        action="store_true",
        help="the steps and the report on the CPU at a tiny size (fp32 and bf16, no "
        "environment, no pytest): the pipeline, without a GPU",
    )
    opts = parser.parse_args(argv)
    if opts.wheels is not None and not opts.wheels.is_dir():
        raise ValueError(f"--wheels {opts.wheels}: not a directory")
    if opts.budget <= MIN_STEP_SECONDS:
        raise ValueError(f"--budget {opts.budget:g}: at least {MIN_STEP_SECONDS:g} seconds")
    for setting in opts.decode:
        decode_setting(setting)
    if opts.cpu_smoke and "fp16" in opts.dtypes:
        opts.dtypes = [d for d in opts.dtypes if d != "fp16"] or ["bf16"]
    if opts.skip_tests:
        opts.parts = [p for p in opts.parts if p != "tests"]
    opts.log = opts.log or opts.out.with_suffix(".log")
    opts.raw = opts.out.with_suffix("")  # the steps' own JSON documents
    opts.scale = min(4.0, max(0.25, opts.budget / DEFAULT_BUDGET))
    return opts


def main(argv: list[str] | None = None) -> int:
    """The check: the environment, then every step within the budget, the report written
    after each; 1 where a test or a measurement failed."""
    opts = parse_args(list(sys.argv[1:] if argv is None else argv))
    if opts.list_missing:
        names = sorted({normalize(r.split("==")[0]) for r in pinned_requirements()})
        print("\n".join(missing_requirements(probe(opts.python, names)["packages"])))
        return 0
    if opts.setup_only:
        start = time.monotonic()
        opts.log.parent.mkdir(parents=True, exist_ok=True)
        python = build_environment(opts)
        print(f"{opts.venv} ready in {time.monotonic() - start:.0f} s ({python})")
        return 0
    if not opts.cpu_smoke and not has_nvidia_driver():
        raise UserError(
            "no NVIDIA GPU on this machine (no nvidia-smi, no /proc/driver/nvidia): "
            f"gpu-check needs CUDA; `{PROG} --cpu-smoke` runs its pipeline on the CPU"
        )
    budget = Budget(opts.budget)
    steps = plan_steps(opts)
    report = Report(opts, steps, budget)
    opts.log.parent.mkdir(parents=True, exist_ok=True)
    opts.log.write_text("", encoding="utf-8")
    opts.raw.mkdir(parents=True, exist_ok=True)
    if opts.cpu_smoke or opts.no_setup:
        python = Path(opts.python)
    else:
        python = build_environment(opts)
        report.check["setup"] = {"seconds": round(budget.elapsed(), 1), "wheels": opts.wheels}
    env = probe(python, list(REPORTED_PACKAGES))
    if not opts.cpu_smoke and not env.get("cuda_available"):
        raise UserError(
            f"torch {env.get('torch')} of {python} sees no CUDA device "
            f"(its CUDA build: {env.get('cuda')})"
        )
    report.check["environment"] = env
    report.write()
    run_steps(python, opts, report, steps)
    report.check["status"] = "complete"
    report.write()
    print(f"report: {opts.out} (log: {opts.log}; {budget.elapsed():.0f} s of {opts.budget:g})")
    check = report.check
    failed = (check["tests"] or {}).get("returncode", 0) != 0 or any(
        "error" in doc for part in ("fairseq", "nmt", "vision") for doc in check[part].values()
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(entry_point(main, PROG)())
