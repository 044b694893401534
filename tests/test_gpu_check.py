"""scripts/gpu_check/: the report of a real tiny CPU run, its targets, the refusal without
CUDA, its argument errors and the environment plumbing it can show here (no GPU figure)."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from recurnmt.cli import UserError, entry_point
from recurnmt.experiments.timed import Budget
from scripts.gpu_check import __main__ as gpu_check
from scripts.gpu_check import environment as gpu_env
from scripts.gpu_check import report as gpu_report
from scripts.gpu_check import steps as gpu_steps
from tests import nmt_fixtures
from tests.script_modules import load_script

data = nmt_fixtures.data  # the shared fixture, found by pytest under this name

REPO = Path(__file__).resolve().parents[1]


def worker_opts(flags: str, **extra) -> argparse.Namespace:
    """The options a benchmark worker gets from ``flags`` (``--name value`` pairs)."""
    tokens = flags.split()
    opts = {k[2:].replace("-", "_"): int(v) for k, v in zip(tokens[::2], tokens[1::2], strict=True)}
    return argparse.Namespace(**opts, device="cpu", dtype="bf16", seed=1, **extra)


def document(opts: argparse.Namespace, results: list[dict]) -> dict:
    """What ``--json`` writes (see recurnmt.experiments.benchmark.write_json)."""
    settings = {k: str(v) for k, v in vars(opts).items()}
    return {"device": "cpu", "dtype": opts.dtype, "settings": settings, "results": results}


@pytest.fixture(scope="module")
def tiny_run(data: Path) -> dict:
    """A real tiny CPU measurement, in this process: fairseq's transformer against the
    Universal Transformer, timm's ViT against the RingFormer ViT, bf16, two levels."""
    nmt, vision = load_script("benchmark_nmt"), load_script("benchmark_vision")
    nmt_opts = worker_opts(gpu_steps.NMT_SIZES["smoke"], data=data)
    nmt_rows = [
        nmt.worker(argparse.Namespace(**vars(nmt_opts), arch=arch))
        for arch in ("transformer", "universal_transformer")
    ]
    vision_opts = worker_opts(gpu_steps.VISION_SIZES["smoke"])
    vision_rows = [
        vision.worker(argparse.Namespace(**vars(vision_opts), model=model))
        for model in ("timm vit", "ringformer_vit")
    ]
    import torch

    env = {  # what probe() reads from the interpreter (the e2e test runs the real one)
        "device_name": "CPU",
        "python": "3.x",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": None,
        "packages": {"timm": "1.0", "triton": None},
    }
    return {
        "command": "test",
        "date": "today",
        "smoke": True,
        "budget_s": 480,
        "elapsed_s": 12.0,
        "status": "complete",
        "steps": ["nmt bf16", "tests", "vision bf16"],
        "done": ["nmt bf16", "tests", "vision bf16"],
        "skipped": {},
        "log": "gpu_check.log",
        "environment": env,
        "setup": None,
        "tests": {"summary": "not run (test)", "returncode": 0},
        "fairseq": {},
        "nmt": {"bf16": document(nmt_opts, nmt_rows)},
        "vision": {"bf16": document(vision_opts, vision_rows)},
    }


def test_the_report_of_a_real_tiny_cpu_run(tiny_run):
    transformer, ut = tiny_run["nmt"]["bf16"]["results"]
    # one memory projection for both levels of the shared decoder, one per layer in fairseq's,
    # and once per sentence, not per hypothesis of the beam (4)
    assert (transformer["cross_attentions"], ut["cross_attentions"]) == (2, 1)
    assert ut["cross_cache_mb"] == pytest.approx(transformer["cross_cache_mb"] / 8, rel=0.05)
    assert 0 < ut["cache_mb"] and 0 < transformer["peak_mem_mb"]
    report = gpu_report.render_report(tiny_run)
    assert "CPU smoke run at a tiny size: no GPU figure" in report
    assert f"| torch | {tiny_run['environment']['torch']} " in report
    assert "| timm | 1.0 |" in report and "| triton | not installed |" in report
    assert "| tests (`pytest -m cuda`) | not run (test) |" in report
    # which attention kernels each side may take (the fixture predates the field: the default)
    assert "| attention | `RECURNMT_SDPA=no-cudnn`: cuDNN's attention last" in report
    torch_choice = gpu_report.render_report({**tiny_run, "sdpa": "torch"})
    assert "| attention | `RECURNMT_SDPA=torch`: torch's own order" in torch_choice
    lines = report.splitlines()
    assert "## Translation, bf16" in lines and "## Images, bf16" in lines
    ut_row = next(line for line in lines if line.startswith("| `universal_transformer`"))
    cells = [c.strip() for c in ut_row.strip("|").split("|")]
    # arch, train + ratio + target, gen + ratio + target, peak + ratio, cross + ratio + target
    assert cells[3] == "-" and cells[6] == "-"  # no speed target in bf16
    assert cells[10] in ("0.12", "0.13") and cells[11] == "<= 0.50 met"
    assert float(cells[14]) > 0 and float(cells[16]) > 0  # FLOPs per token, FLOP rate
    assert any(line.startswith("| `ringformer_vit` |") for line in lines)


def test_the_nmt_worker_measures_on_the_device_in_mixed_precision(data, device):
    """bf16 on the CPU, fp16 on CUDA (autocast and loss scaler in training, fp16 weights in
    beam search, the allocator's peak as memory); the shared decoder's one memory projection."""
    nmt = load_script("benchmark_nmt")
    opts = worker_opts(gpu_steps.NMT_SIZES["smoke"], data=data, arch="universal_transformer")
    opts.device, opts.dtype = str(device), "fp16" if device.type == "cuda" else "bf16"
    result = nmt.worker(opts)
    assert result["train_tokens_per_s"] > 0 and result["gen_sentences_per_s"] > 0
    assert result["peak_mem_mb"] > 0 and result["cross_attentions"] == 1
    assert 0 < result["cross_cache_mb"] < result["cache_mb"]


def test_speed_targets_hold_for_shared_families_in_fp16(tiny_run):
    transformer, ut = tiny_run["nmt"]["bf16"]["results"]
    vanilla = {**transformer, "arch": "recurrent_transformer"}  # unshared: no speed target
    fp16 = gpu_report.nmt_targets(ut, transformer, "fp16")
    assert fp16["train_tokens_per_s"].cell(1.004) == ">= 1.00 met"
    assert fp16["gen_sentences_per_s"].cell(0.99) == ">= 1.00 **missed**"
    assert gpu_report.nmt_targets(vanilla, transformer, "fp16")["train_tokens_per_s"] is None
    assert gpu_report.nmt_targets(transformer, transformer, "fp16")["cross_cache_mb"].bound == 1
    assert fp16["cross_cache_mb"].cell(0.51) == "<= 0.50 **missed**"


def test_a_failed_benchmark_is_reported(tiny_run):
    check = {**tiny_run, "vision": {"fp16": {"error": "worker timm vit failed"}}}
    assert "The step did not finish:\n\n```\nworker timm vit failed\n```" in (
        gpu_report.render_report(check)
    )


def test_without_a_gpu_it_stops_at_once(monkeypatch, capsys):
    monkeypatch.setattr(gpu_check, "has_nvidia_driver", lambda: False)
    monkeypatch.setattr(gpu_check, "build_environment", lambda opts: pytest.fail("built"))
    code = entry_point(gpu_check.main, gpu_check.PROG)([])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert err.startswith("python -m scripts.gpu_check: error: no NVIDIA GPU on this machine")
    assert "--cpu-smoke" in err


def test_a_torch_that_sees_no_cuda_is_refused(monkeypatch, tmp_path):
    monkeypatch.setattr(gpu_check, "has_nvidia_driver", lambda: True)
    monkeypatch.setattr(gpu_check, "probe", lambda python, packages=(): {"torch": "2.0+cpu"})
    with pytest.raises(UserError, match=r"torch 2.0\+cpu of .* sees no CUDA device"):
        gpu_check.main(["--no-setup", "--out", str(tmp_path / "r.md")])
    assert not (tmp_path / "r.md").exists()


def test_argument_errors(tmp_path):
    with pytest.raises(ValueError, match="--wheels .*no_wheels: not a directory"):
        gpu_check.parse_args(["--wheels", str(tmp_path / "no_wheels")])
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["--dtypes", "fp8"])
    # fp16 needs CUDA: a CPU smoke run keeps the other dtypes
    assert gpu_check.parse_args(["--cpu-smoke", "--dtypes", "fp16", "bf16"]).dtypes == ["bf16"]
    for setting in ("big-b4", "base-b0", "base-4", "iwslt-bx"):
        with pytest.raises(ValueError, match=f"--decode {setting}: not SIZE-bBEAM"):
            gpu_check.parse_args(["--decode", "base-b4", setting])


def test_generation_settings_each_make_a_step_and_a_report_section(tmp_path, monkeypatch):
    """--decode: the iwslt size and beam 1 beside the default, in every dtype, each run with
    its model's size and beam and reported under its own heading."""
    out = tmp_path / "r.md"
    flags = ["--out", str(out), "--dtypes", "fp16", "bf16", "--parts", "decode", "fairseq"]
    opts = gpu_check.parse_args([*flags, "--decode", "base-b4", "iwslt-b1"])
    steps = gpu_steps.plan_steps(opts)
    assert [s.name for s in steps] == [
        "decode fp16", "decode fp16 iwslt-b1", "decode bf16", "decode bf16 iwslt-b1",
        "fairseq fp16",
    ]  # fmt: skip
    commands = {}

    def run(cmd, out, log, limit):
        commands[out.name] = cmd
        return {"settings": {}, "results": []}

    monkeypatch.setattr(gpu_steps, "run_json_command", run)
    for step in steps[:2]:
        gpu_steps.run_decode(Path(sys.executable), opts, step, 60)
    base, iwslt = commands["decode_fp16.json"], commands["decode_fp16_iwslt-b1.json"]
    flag = lambda cmd, name: cmd[cmd.index(name) + 1]  # noqa: E731
    assert (flag(base, "--ffn-dim"), flag(base, "--heads"), flag(base, "--beam")) == (
        "2048",
        "8",
        "4",
    )
    assert (flag(iwslt, "--ffn-dim"), flag(iwslt, "--heads"), flag(iwslt, "--beam")) == (
        "1024",
        "4",
        "1",
    )
    assert flag(iwslt, "--embed-dim") == "512" and flag(iwslt, "--dtype") == "fp16"

    report = gpu_report.Report(opts, steps, Budget(480))
    rows = [
        {"arch": "transformer", "wall_ms_per_step": 6.0, "median_ms_per_step": 6.5},
        {"arch": "owf", "wall_ms_per_step": 5.0, "median_ms_per_step": 5.5},
    ]
    settings = dict(sentences=64, beam=1, decode_len=32, embed_dim=512, ffn_dim=1024)
    settings.update(heads=4, levels=6, rounds=5)
    report.record(steps[1], {"settings": settings, "results": rows})
    written = json.loads(out.with_suffix(".json").read_text())
    assert written["done"] == ["decode fp16 iwslt-b1"] and list(written["decode"]) == [
        "fp16 iwslt-b1"
    ]
    lines = gpu_report.decode_lines(written)
    assert "## Generation (beam search), fp16 iwslt-b1" in lines
    assert any("beam 1, exactly 32 tokens" in line and "FF=1024, 4 heads" in line for line in lines)
    assert "| `owf` | 5.000 | 5.500 | 1.20 | >= 1.00 met |" in lines  # fp16: the target


def test_only_missing_packages_are_installed_at_their_pins():
    pins = gpu_env.pinned_requirements()
    assert "torch==2.14.1" in pins and "cython==3.3.1" in pins and "pytest==9.2.0" in pins
    assert not any(r.startswith("ruff") for r in pins)
    # the GPU machine's own torch, torchvision and numpy stay, whatever their versions
    installed = {"torch": "2.11.0", "torchvision": "0.26.0", "numpy": "2.5.2", "timm": None}
    missing = gpu_env.missing_requirements(installed)
    assert not any(r.split("==")[0] in ("torch", "torchvision", "numpy") for r in missing)
    assert "timm==1.0.31" in missing and "fairseq-fixed==0.12.3.1" in missing


def test_list_missing_prints_what_the_wheels_folder_must_hold(monkeypatch, capsys):
    installed = {"torch": "2.11.0", "numpy": "2.5.2", "pytest": "8.0"}
    monkeypatch.setattr(gpu_check, "has_nvidia_driver", lambda: pytest.fail("GPU asked for"))
    monkeypatch.setattr(gpu_check, "probe", lambda python, names: {"packages": installed})
    assert gpu_check.main(["--list-missing"]) == 0
    printed = capsys.readouterr().out.split()
    assert "fairseq-fixed==0.12.3.1" in printed and "hydra-core==1.3.2" in printed
    assert not any(r.split("==")[0] in installed for r in printed)


def test_the_venv_sees_the_base_interpreters_packages(tmp_path):
    site = tmp_path / "venv" / "lib" / "python3.12" / "site-packages"
    site.mkdir(parents=True)
    pth = gpu_env.base_site_pth(tmp_path / "venv", ["/opt/torch/site-packages"])
    assert pth.parent == site and pth.read_text() == "/opt/torch/site-packages\n"


# one thread per child, as the tests' own processes (make test runs a worker per CPU)
SMOKE_ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def smoke_command(out: Path, data: Path, *parts: str) -> list[str]:
    """A CPU smoke run of ``parts``, the NMT benchmark on the test corpus."""
    cmd = [sys.executable, "-m", "scripts.gpu_check", "--cpu-smoke"]  # from REPO, as make
    cmd += ["--out", str(out), "--data", str(data), "--archs", "transformer", "ringformer"]
    # a budget no slow machine runs out of: the budget's own rules are the unit test's
    return [*cmd, "--models", "ringformer_vit", "--budget", "3000", "--parts", *parts]


@pytest.mark.e2e
def test_cpu_smoke_writes_the_report_the_raw_figures_and_the_log(data, tmp_path):
    out = tmp_path / "report" / "gpu_check.md"
    cmd = smoke_command(out, data, "decode", "fairseq", "nmt")  # images: test_the_report_...
    cmd += ["--decode", "base-b4", "iwslt-b1"]  # the tiny model; beam 4, then greedy
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900, env=SMOKE_ENV)
    assert proc.returncode == 0, proc.stdout[-3000:]
    report = out.read_text()
    assert "**Complete** after" in report
    assert "Steps done: decode bf16, decode bf16 iwslt-b1, fairseq fp32, nmt bf16." in report
    # generation first: every model in one process, their rounds alternating
    assert "## Generation (beam search), bf16" in report
    decode = json.loads((out.parent / "gpu_check" / "decode_bf16.json").read_text())
    archs = ["transformer", "ringformer", "ringformer static"]  # static: --static-decoding
    assert [r["arch"] for r in decode["results"]] == archs
    assert all(r["wall_ms_per_step"] > 0 and r["steps"] == 4 for r in decode["results"])
    assert decode["results"][2]["path"] == "eager"  # no CUDA here
    greedy = json.loads((out.parent / "gpu_check" / "decode_bf16_iwslt-b1.json").read_text())
    assert greedy["settings"]["beam"] == "1" and len(greedy["results"]) == 3
    assert "## Generation (beam search), bf16 iwslt-b1" in report
    assert "| `ringformer` |" in report and "## Images" not in report
    assert re.search(r"\| `ringformer static` \(eager; identical (\d+)/\1\) \|", report)
    assert "## fairseq-train and fairseq-generate, fp32" in report
    fairseq_part = report[report.index("## fairseq-train") :]
    fairseq_rows = [line for line in fairseq_part.splitlines() if line.startswith("| `")]
    assert fairseq_rows[0].startswith("| `transformer` |") and len(fairseq_rows) >= 4
    check = json.loads(out.with_suffix(".json").read_text())
    assert check["smoke"] and list(check["nmt"]) == ["bf16"] and check["vision"] == {}
    assert check["environment"]["torch"] and check["environment"]["cuda_available"] is False
    rows = check["fairseq"]["fp32"]["results"]
    assert [r["arch"] for r in rows] == ["transformer", "ringformer"]
    assert all(r["train_wps"] > 0 and r["gen_tokens_per_s"] > 0 for r in rows)
    # every 100th batch of the test set (the first of its batches of 8,000 tokens: not all of
    # its 1,555 sentences), each hypothesis 4 tokens and its end of sentence: both models did
    # the same work
    assert 0 < rows[0]["gen_sentences"] == rows[1]["gen_sentences"] < 1555 // 2
    assert all(r["gen_tokens"] == 5 * r["gen_sentences"] for r in rows)
    assert "every 100th batch of the test set, beam 4, every hypothesis decoded to 4" in report
    assert (out.parent / "gpu_check" / "nmt_bf16.json").exists()
    log = out.with_suffix(".log").read_text()  # the children's own output, streamed
    assert "benchmarking transformer, ringformer, taking turns" in log
    assert "[ringformer] training 2 epochs" in log


@pytest.mark.e2e
def test_a_run_stopped_half_way_leaves_a_readable_report(data, tmp_path):
    out = tmp_path / "gpu_check.md"
    proc = subprocess.Popen(
        smoke_command(out, data, "nmt", "vision"),
        cwd=REPO, env=SMOKE_ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and proc.poll() is None:
            written = out.with_suffix(".json")
            if written.exists() and json.loads(written.read_text())["done"]:
                break
            time.sleep(0.5)
        assert proc.poll() is None, "the run ended before it could be stopped half-way"
        children = _descendants(proc.pid)
        assert children, "no step was running"
        proc.send_signal(signal.SIGTERM)  # as a scheduler or `kill` stops it
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert not [pid for pid in children if _alive(pid)], "processes outlived the stopped check"
    report = out.read_text()
    assert "**In progress** when this report was written" in report
    assert "Steps done: nmt bf16." in report and "Not reached yet: vision bf16." in report
    assert "| `ringformer` |" in report and "## Images" not in report
    assert not list(tmp_path.glob("*.part"))  # whole files or none


def _descendants(pid: int) -> list[int]:
    """The processes below ``pid`` (Linux's /proc)."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        kids = [p for p, pp in parents.items() if pp == parent]
        found += kids
        frontier += kids
    return found


def _alive(pid: int, seconds: float = 20) -> bool:
    """``pid`` still runs after ``seconds`` (a zombie has ended)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return False
        if state == "Z":
            return False
        time.sleep(0.2)
    return True


def test_steps_share_the_budget_and_those_left_too_little_are_not_run(tmp_path, monkeypatch):
    opts = gpu_check.parse_args(["--cpu-smoke", "--out", str(tmp_path / "r.md"), "--dtypes",
                                 "fp32", "bf16", "--parts", "nmt", "vision"])  # fmt: skip
    steps = gpu_steps.plan_steps(opts)
    assert [s.name for s in steps] == ["nmt fp32", "nmt bf16", "vision fp32", "vision bf16"]
    budget = Budget(100, reserve=10)
    limits = []

    def runner(python, opts, step, limit):
        limits.append((step.name, round(limit)))
        budget.start -= 36  # each step takes 36 s of the budget
        return {"settings": {}, "results": []}

    monkeypatch.setattr(gpu_steps, "RUNNERS", {"nmt": runner, "vision": runner})
    monkeypatch.setattr(gpu_report, "render_report", lambda check: "report")
    report = gpu_report.Report(opts, steps, budget)
    gpu_steps.run_steps(Path(sys.executable), opts, report, steps)
    # 90 s left at first: 90 x 2.5 / 5 = 45 s; then 54 x 1 / 2.5 = 22 s; then 18 s left:
    # 18 x 1 / 1.5 = 12 s and at most 18 s, less than a step needs
    assert limits == [("nmt fp32", 45), ("nmt bf16", 22)]
    assert report.check["done"] == ["nmt fp32", "nmt bf16"]
    assert report.check["skipped"] == {
        "vision fp32": "not run: 18 s of the budget were left",
        "vision bf16": "not run: 18 s of the budget were left",
    }
    assert json.loads((tmp_path / "r.json").read_text())["skipped"] == report.check["skipped"]


def test_generation_is_measured_first_with_its_target_in_fp16(tmp_path):
    opts = gpu_check.parse_args(["--out", str(tmp_path / "r.md"), "--dtypes", "fp16", "bf16"])
    steps = [s.name for s in gpu_steps.plan_steps(opts)]
    assert steps[:3] == ["decode fp16", "decode bf16", "fairseq fp16"]
    rows = [
        {"arch": "transformer", "wall_ms_per_step": 8.0, "median_ms_per_step": 9.0},
        {"arch": "ringformer", "wall_ms_per_step": 7.5, "median_ms_per_step": 8.0},
        {"arch": "sret", "wall_ms_per_step": 10.0, "median_ms_per_step": 11.0},
    ]
    settings = dict(sentences=64, beam=4, decode_len=32, embed_dim=512, ffn_dim=2048)
    settings.update(heads=8, levels=6, rounds=10)
    doc = {"settings": settings, "results": rows}
    lines = gpu_report.decode_lines({"decode": {"fp16": doc, "bf16": doc}})
    assert "| `ringformer` | 7.500 | 8.000 | 1.07 | >= 1.00 met |" in lines
    assert "| `sret` | 10.000 | 11.000 | 0.80 | >= 1.00 **missed** |" in lines
    assert "| `transformer` | 8.000 | 9.000 | 1.00 | - |" in lines
    assert "| `sret` | 10.000 | 11.000 | 0.80 | - |" in lines  # bf16: no target


def test_step_sizes_follow_the_budget():
    check = gpu_steps.NMT_SIZES["check"]
    keys = ("--steps", "--sentences")
    assert gpu_steps.scaled(check, 1.0, keys) == check.split()
    doubled = gpu_steps.scaled(check, 2.0, keys)
    assert doubled[doubled.index("--steps") + 1] == "20"
    assert doubled[doubled.index("--sentences") + 1] == "256"
    assert doubled[doubled.index("--levels") + 1] == "6"  # the model's size stays
    tiny = gpu_steps.scaled(check, 0.01, keys)
    assert tiny[tiny.index("--steps") + 1] == "1"
    assert gpu_check.parse_args(["--budget", "960"]).scale == 2.0
    with pytest.raises(ValueError, match="--budget 5: at least 20 seconds"):
        gpu_check.parse_args(["--budget", "5"])


@pytest.mark.e2e
@pytest.mark.parametrize("mode", [[], ["--train", "--steps", "1"]])
def test_interleaved_speed_table(data, capsys, mode):
    """scripts/decoding_speed.py: the models take turns, one row per architecture with its
    ratio to fairseq's transformer (which is added when not asked for)."""
    speed = load_script("decoding_speed")
    tiny = "--embed-dim 32 --ffn-dim 64 --heads 2 --levels 2 --sentences 4 --gen-batch 4"
    speed.main(
        [*tiny.split(), "--decode-len", "3", "--rounds", "1", "--max-tokens", "256"]
        + ["--data", str(data), "--archs", "sret", *mode]
    )
    out = capsys.readouterr().out
    assert ("updates" in out) == bool(mode)
    rows = [line for line in out.splitlines() if line.startswith("| `")]
    assert [row.split("`")[1] for row in rows] == ["transformer", "sret"]
    assert rows[0].endswith("| 1.00 |") and float(rows[1].split("|")[-2]) > 0
