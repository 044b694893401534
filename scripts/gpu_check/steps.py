"""The check's steps (item 2 of the package's docstring): what each one runs
(``scripts/profile_decoding.py``, ``scripts/fairseq_speed.py``,
``scripts/benchmark_{nmt,vision}.py``, ``pytest -m cuda``) at the check's size, its step counts
scaled to the budget; their order and each one's share of the budget left; and the raw JSON
document each script writes beside the report (``docs/gpu_check/``: ``--out`` without its
suffix), which becomes its part of the report."""

from __future__ import annotations

import argparse
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from recurnmt.experiments.timed import run_streamed  # standard library only
from scripts.gpu_check.environment import ROOT, child_env, probe

if TYPE_CHECKING:
    from scripts.gpu_check.report import Report

DTYPES = ("fp32", "bf16", "fp16")
PARTS = ("decode", "fairseq", "nmt", "tests", "vision")
# scripts/benchmark_*.py flags per size: "base" is issue 13's base size with the rounds of
# docs/benchmarks.md; "check" the same models with the step counts of the default budget (scaled with
# --budget: see scaled()); "smoke" a tiny CPU run
NMT_SIZES = {
    "base": "--embed-dim 512 --ffn-dim 2048 --heads 8 --levels 6 --max-tokens 4096 "
    "--warmup 5 --steps 20 --train-rounds 2 --sentences 256 --gen-batch 64 --gen-rounds 3 "
    "--beam 4 --decode-len 32",
    "check": "--embed-dim 512 --ffn-dim 2048 --heads 8 --levels 6 --max-tokens 4096 "
    "--warmup 3 --steps 10 --train-rounds 2 --sentences 128 --gen-batch 64 --gen-rounds 2 "
    "--beam 4 --decode-len 32",
    "smoke": "--embed-dim 32 --ffn-dim 64 --heads 2 --levels 2 --max-tokens 256 --warmup 1 "
    "--steps 1 --train-rounds 1 --sentences 4 --gen-batch 4 --gen-rounds 1 --beam 4 "
    "--decode-len 4 --threads 1",
}
VISION_SIZES = {
    "base": "--embed-dim 384 --ffn-dim 1536 --heads 6 --levels 12 --img-size 224 "
    "--patch-size 16 --batch-size 128 --warmup 5 --steps 20 --rounds 2",
    "check": "--embed-dim 384 --ffn-dim 1536 --heads 6 --levels 12 --img-size 224 "
    "--patch-size 16 --batch-size 128 --warmup 3 --steps 10 --rounds 1",
    "smoke": "--embed-dim 32 --ffn-dim 64 --heads 2 --levels 2 --img-size 16 --patch-size 4 "
    "--batch-size 4 --warmup 1 --steps 1 --rounds 1 --threads 1",
}
# scripts/profile_decoding.py: the typical batch of 64 sentences, 32 tokens each, five
# alternating rounds (scaled with --budget); the model's size and the beam come from --decode
DECODE_SIZES = {
    "check": "--sentences 64 --decode-len 32 --rounds 5",
    "smoke": "--embed-dim 32 --ffn-dim 64 --heads 2 --levels 2 --sentences 2 --decode-len 3 "
    "--rounds 2",
}
# --decode SIZE-bBEAM: the model sizes generation is measured at (fairseq's
# transformer_wmt_en_de and transformer_iwslt_de_en; a smoke run keeps its tiny model) and
# the beam; issue 25 asks for both sizes at beam 4 and beam 1
DECODE_MODELS = {
    "base": "--embed-dim 512 --ffn-dim 2048 --heads 8 --levels 6",
    "iwslt": "--embed-dim 512 --ffn-dim 1024 --heads 4 --levels 6",
}
DEFAULT_DECODE = "base-b4"


def decode_setting(text: str) -> tuple[str, int]:
    """``SIZE-bBEAM`` (``base-b4``, ``iwslt-b1``) as (size, beam)."""
    size, _, beam = text.partition("-b")
    if size not in DECODE_MODELS or not beam.isdigit() or int(beam) < 1:
        raise ValueError(
            f"--decode {text}: not SIZE-bBEAM with SIZE one of {', '.join(DECODE_MODELS)} "
            "and a beam of at least 1 (e.g. base-b4, iwslt-b1)"
        )
    return size, int(beam)


# scripts/fairseq_speed.py: the real command lines, base size, two epochs (the second timed)
# on 2,000 training pairs, every other batch of the test set translated, each hypothesis to 32
# tokens (scaled with --budget)
FAIRSEQ_SIZES = {
    "check": "--archs transformer ringformer --embed-dim 512 --ffn-dim 2048 --heads 8 "
    "--levels 6 --max-tokens 8192 --epochs 2 --max-train 2000 --workers 8",
    "smoke": "--archs transformer ringformer --embed-dim 32 --ffn-dim 64 --heads 2 --levels 2 "
    "--max-tokens 1024 --epochs 2 --max-train 100 --gen-shards 100 --gen-len 4 --workers 1",
}

# the default budget: 8 minutes of wall time on one H100/H200, installation included
DEFAULT_BUDGET = 480.0
# a step given less than this is not started (said in the report)
MIN_STEP_SECONDS = 20.0


@dataclass(frozen=True)
class Step:
    """One measurement of the check: ``part`` in ``dtype``, and its share of the budget."""

    part: str  # decode, fairseq, nmt, tests, vision
    dtype: str | None
    weight: float
    setting: str = DEFAULT_DECODE  # decode's SIZE-bBEAM

    @property
    def key(self) -> str | None:
        """Its entry in the report's part: the dtype, and a generation setting other than
        the default."""
        return self.dtype if self.setting == DEFAULT_DECODE else f"{self.dtype} {self.setting}"

    @property
    def name(self) -> str:
        """How the report and the terminal name it: its part, and its key where it has one."""
        return f"{self.part} {self.key}" if self.dtype else self.part


def plan_steps(opts: argparse.Namespace) -> list[Step]:
    """The steps in their order (issue 25): generation of every family, the real command
    lines, the NMT benchmark, ``pytest -m cuda``, the vision benchmark; a dtype after the
    first weighs less."""
    steps = []
    if "decode" in opts.parts:
        settings = [(d, g) for d in opts.dtypes for g in opts.decode]
        steps += [Step("decode", d, 1.5 if i == 0 else 1.0, g) for i, (d, g) in enumerate(settings)]
    if "fairseq" in opts.parts:
        # fairseq's half precision on a GPU is fp16 (its --bf16 means a TPU); a CPU: fp32
        steps.append(Step("fairseq", "fp32" if opts.cpu_smoke else "fp16", 3.0))
    if "nmt" in opts.parts:
        steps += [Step("nmt", d, 2.5 if i == 0 else 1.0) for i, d in enumerate(opts.dtypes)]
    if "tests" in opts.parts and not opts.cpu_smoke:
        steps.append(Step("tests", None, 2.5))
    if "vision" in opts.parts:
        steps += [Step("vision", d, 1.0 if i == 0 else 0.5) for i, d in enumerate(opts.dtypes)]
    return steps


def scaled(flags: str, factor: float, keys: tuple[str, ...]) -> list[str]:
    """``flags`` with the integer values of ``keys`` multiplied by ``factor`` (at least 1)."""
    tokens = flags.split()
    for i, token in enumerate(tokens[:-1]):
        if token in keys:
            tokens[i + 1] = str(max(1, round(int(tokens[i + 1]) * factor)))
    return tokens


def failure(run, what: str) -> dict:
    """The report's entry of a step that did not give its figures."""
    why = (
        f"stopped at its time limit after {run.seconds:.0f} s"
        if run.timed_out
        else f"{what} failed (exit {run.returncode})"
    )
    # progress bars' carriage-return lines say nothing here
    tail = [line.rsplit("\r", 1)[-1] for line in run.tail.splitlines()]
    tail = "\n".join(line for line in tail if line.strip())[-2000:]
    return {"error": f"{why}:\n{tail}", "timed_out": run.timed_out}


def run_json_command(cmd: list[str], out: Path, log: Path, limit: float) -> dict:
    """A script that writes ``--json out``: its document (one written before the script
    stopped, marked ``"incomplete"``), or ``{"error": ...}``."""
    out.unlink(missing_ok=True)
    run = run_streamed([*cmd, "--json", str(out)], log, limit, cwd=ROOT, env=child_env())
    if not out.exists():
        return failure(run, Path(cmd[1]).name)
    doc = json.loads(out.read_text(encoding="utf-8"))
    doc["seconds"] = run.seconds
    if run.returncode or not doc.get("complete", True):
        doc["incomplete"] = failure(run, Path(cmd[1]).name)["error"]
    return doc


def run_fairseq(python: Path, opts: argparse.Namespace, step: Step, limit: float) -> dict:
    """``scripts/fairseq_speed.py``: the real fairseq-train and fairseq-generate."""
    if opts.cpu_smoke:
        flags = FAIRSEQ_SIZES["smoke"].split() + ["--device", "cpu", "--dtype", "fp32"]
    else:
        flags = scaled(FAIRSEQ_SIZES["check"], opts.scale, ("--max-train",))
        flags += ["--gen-shards", str(max(1, round(2 / opts.scale)))]
        flags += ["--device", "cuda", "--dtype", step.dtype]
    flags += ["--out", str(ROOT / "work" / "gpu_check" / "fairseq")]
    script = [str(python), str(ROOT / "scripts" / "fairseq_speed.py"), *flags]
    return run_json_command(script, opts.raw / f"fairseq_{step.dtype}.json", opts.log, limit)


def run_decode(python: Path, opts: argparse.Namespace, step: Step, limit: float) -> dict:
    """``scripts/profile_decoding.py --no-profile``: generation of every family, timed."""
    size, beam = decode_setting(step.setting)
    if opts.cpu_smoke:
        flags = DECODE_SIZES["smoke"].split() + ["--device", "cpu"]
    else:
        flags = DECODE_MODELS[size].split() + scaled(
            DECODE_SIZES["check"], opts.scale, ("--rounds",)
        )
        flags += ["--device", "cuda"]
    flags += ["--beam", str(beam), "--dtype", step.dtype, "--no-profile", "--static-decoding"]
    flags += ["--archs", *opts.archs] if opts.archs else []
    flags += ["--data", str(opts.data)] if opts.data else []
    cmd = [str(python), str(ROOT / "scripts" / "profile_decoding.py"), *flags]
    raw = opts.raw / f"decode_{step.key.replace(' ', '_')}.json"
    return run_json_command(cmd, raw, opts.log, limit)


def run_benchmark(python: Path, opts: argparse.Namespace, step: Step, limit: float) -> dict:
    """``scripts/benchmark_{nmt,vision}.py`` at the check's size, scaled to the budget."""
    nmt = step.part == "nmt"
    sizes = NMT_SIZES if nmt else VISION_SIZES
    if opts.cpu_smoke:
        flags = sizes["smoke"].split()
    else:
        keys = ("--steps", "--sentences", "--gen-rounds") if nmt else ("--steps",)
        flags = scaled(sizes["check"], opts.scale, keys)
    device = "cpu" if opts.cpu_smoke else "cuda"
    flags += ["--device", device, "--dtype", step.dtype]
    if nmt:
        flags += ["--archs", *opts.archs] if opts.archs else []
        flags += ["--data", str(opts.data)] if opts.data else []
    else:
        flags += ["--models", *opts.models] if opts.models else []
    script = "benchmark_nmt.py" if nmt else "benchmark_vision.py"
    cmd = [str(python), str(ROOT / "scripts" / script), *flags]
    return run_json_command(cmd, opts.raw / f"{step.part}_{step.dtype}.json", opts.log, limit)


def run_tests(python: Path, opts: argparse.Namespace, step: Step, limit: float) -> dict:
    """``pytest -m cuda`` (in parallel where pytest-xdist is installed); stopped at its
    limit, it reports the tests that ran."""
    cmd = [str(python), "-m", "pytest", "-m", "cuda", "-v", "-p", "no:cacheprovider"]
    if probe(python, ["pytest-xdist"])["packages"].get("pytest-xdist"):
        cmd += ["-n", str(min(16, os.cpu_count() or 1))]
    start = opts.log.stat().st_size if opts.log.exists() else 0
    run = run_streamed(cmd, opts.log, limit, cwd=ROOT, env=child_env())
    with opts.log.open(encoding="utf-8", errors="replace") as f:
        f.seek(start)
        output = f.read()
    counts = {k: len(re.findall(rf"(?m) {k.upper()}(?: |$)", output)) for k in TEST_OUTCOMES}
    failed = sorted(set(re.findall(r"(?m)^FAILED (\S+)", output)))
    lines = [line.strip("= ") for line in run.tail.splitlines() if line.strip()]
    if run.timed_out:
        so_far = ", ".join(f"{n} {k}" for k, n in counts.items() if n)
        summary = f"stopped at its time limit after {run.seconds:.0f} s: {so_far or 'none'} so far"
    else:
        summary = f"{lines[-1] if lines else '(no output)'} (exit code {run.returncode})"
    return {
        "summary": summary,
        "returncode": run.returncode,
        "timed_out": run.timed_out,
        "counts": counts,
        "failed": failed,
        "seconds": run.seconds,
    }


TEST_OUTCOMES = ("passed", "failed", "error", "skipped")
RUNNERS = {
    "decode": run_decode,
    "fairseq": run_fairseq,
    "nmt": run_benchmark,
    "vision": run_benchmark,
}


def run_steps(python: Path, opts: argparse.Namespace, report: Report, steps: list[Step]) -> None:
    """Every step in order, each with its share of the budget left (:class:`Budget`)."""
    for i, step in enumerate(steps):
        limit = report.budget.share(step.weight, sum(s.weight for s in steps[i + 1 :]))
        if limit < MIN_STEP_SECONDS:
            left = report.budget.left()
            report.check["skipped"][step.name] = f"not run: {left:.0f} s of the budget were left"
            report.write()
            continue
        print(
            f"== {step.name}: at most {limit:.0f} s ({report.budget.left():.0f} s left)", flush=True
        )
        runner = run_tests if step.part == "tests" else RUNNERS[step.part]
        report.record(step, runner(python, opts, step, limit))
