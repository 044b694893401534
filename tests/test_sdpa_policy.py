"""recurnmt/modules/sdpa.py: which fused attention kernel recurnmt's attention calls may take
(``RECURNMT_SDPA``), and scripts/sdpa_first_call.py, which measures what a new shape costs."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from recurnmt.modules import sdpa
from recurnmt.modules.attention import SelfAttention

ROOT = Path(__file__).resolve().parents[1]
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture
def policy():
    previous = sdpa.get_policy()
    yield sdpa.set_policy
    sdpa.set_policy(previous)


def test_the_default_leaves_cudnn_out_and_names_are_checked():
    assert sdpa.parse_policy(None) == "no-cudnn"
    assert sdpa.parse_policy("") == "no-cudnn"
    assert sdpa.parse_policy(" Torch ") == "torch"
    with pytest.raises(ValueError, match="RECURNMT_SDPA='fast': one of no-cudnn, torch"):
        sdpa.parse_policy("fast")


def test_set_policy_returns_the_previous_one_and_refuses_a_bad_name(policy):
    assert policy("torch") in sdpa.POLICIES
    assert policy("no-cudnn") == "torch"
    with pytest.raises(ValueError, match="RECURNMT_SDPA"):
        policy("cudnn-only")
    assert sdpa.get_policy() == "no-cudnn"


def test_a_bad_environment_value_stops_the_import_and_names_the_setting():
    env = {**os.environ, "RECURNMT_SDPA": "fastest", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", "import recurnmt.modules.attention"],
        env=env, capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "RECURNMT_SDPA='fastest': one of no-cudnn, torch" in proc.stderr


@pytest.mark.parametrize("name", sdpa.POLICIES)
def test_on_the_cpu_every_policy_is_torchs_call_and_touches_no_flag(name, policy, monkeypatch):
    def refuse(enabled):
        raise AssertionError("the cuDNN flag was switched on a CPU call")

    policy(name)  # no-cudnn-anywhere switches the process's flag here, once
    monkeypatch.setattr(torch.backends.cuda, "enable_cudnn_sdp", refuse)
    q, k, v = (torch.randn(2, 4, 5, 8) for _ in range(3))
    mask = torch.rand(2, 1, 1, 5) > 0.3
    mask[..., 0] = True
    got = sdpa.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(got, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))


def test_no_cudnn_anywhere_switches_the_process_flag_and_only_its_own(policy):
    """The policy switches cuDNN's attention off for every model in the process and back on
    when another policy is set; a flag somebody else switched off stays off."""
    assert torch.backends.cuda.cudnn_sdp_enabled()
    policy("no-cudnn-anywhere")
    assert not torch.backends.cuda.cudnn_sdp_enabled()
    policy("no-cudnn-anywhere")  # again: nothing more to switch
    policy("torch")
    assert torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(False)  # the user's own choice
    try:
        policy("no-cudnn-anywhere")
        policy("no-cudnn")
        assert not torch.backends.cuda.cudnn_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(True)


def test_no_cudnn_anywhere_from_the_environment_reaches_fairseqs_models():
    """``RECURNMT_SDPA=no-cudnn-anywhere fairseq-train --user-dir user_dir``: importing the
    plugin switches cuDNN's attention off for the process, fairseq's transformer included."""
    env = {**os.environ, "RECURNMT_SDPA": "no-cudnn-anywhere", "PYTHONPATH": str(ROOT)}
    code = "import user_dir, torch; print(torch.backends.cuda.cudnn_sdp_enabled())"
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split()[-1] == "False"


def test_fairseq_speed_runs_its_commands_under_the_sdpa_policy(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location(
        "fairseq_speed", ROOT / "scripts/fairseq_speed.py"
    )
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    seen = []

    def measure(arch, data, args):  # what the commands' environment would be
        seen.append(os.environ.get("RECURNMT_SDPA"))
        return {"arch": arch, **{key: 1.0 for _, key, _ in script.COLUMNS}}

    monkeypatch.setattr(script, "measure", measure)
    monkeypatch.setenv("RECURNMT_SDPA", "torch")  # recorded: the script's setting is undone
    monkeypatch.delenv("RECURNMT_SDPA")
    (tmp_path / "dict.en.txt").write_text("a 1\n")
    out = tmp_path / "speed.json"
    argv = ["--data", str(tmp_path), "--archs", "transformer", "--json", str(out)]
    assert json.loads(json.dumps(script.main(argv)))["sdpa"] == "no-cudnn"
    script.main([*argv, "--sdpa", "no-cudnn-anywhere"])
    assert seen == [None, "no-cudnn-anywhere"]
    assert json.loads(out.read_text())["sdpa"] == "no-cudnn-anywhere"
    with pytest.raises(SystemExit):
        script.main([*argv, "--sdpa", "cudnn"])


@CUDA
@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_on_cuda_cudnn_is_left_out_of_the_call_and_switched_back_on(dtype, policy):
    policy("no-cudnn")
    seen = []
    # what the flag was while the kernel ran, read by a probe in place of torch's function
    real = F.scaled_dot_product_attention

    def probe(*args, **kwargs):
        seen.append(torch.backends.cuda.cudnn_sdp_enabled())
        return real(*args, **kwargs)

    attention = SelfAttention(64, 4, causal=True).cuda().to(dtype).eval()
    x = torch.randn(3, 7, 64, device="cuda", dtype=dtype)
    assert torch.backends.cuda.cudnn_sdp_enabled()
    with torch.no_grad():
        reference = attention(x)  # no probe yet: the real kernels, cuDNN left out
    try:
        F.scaled_dot_product_attention = probe
        with torch.no_grad():
            out = attention(x)
        policy("torch")
        with torch.no_grad():
            attention(x)
    finally:
        F.scaled_dot_product_attention = real
    assert seen == [False, True]
    assert torch.backends.cuda.cudnn_sdp_enabled()
    torch.testing.assert_close(out, reference)
    # torch's own choice (cuDNN first on Hopper) computes the same attention up to rounding
    with torch.no_grad():
        torch.testing.assert_close(attention(x), reference, atol=2e-2, rtol=2e-2)


@CUDA
@pytest.mark.cuda
def test_on_cuda_the_flag_comes_back_after_a_failing_call(policy):
    policy("no-cudnn")
    q = torch.randn(2, 4, 5, 8, device="cuda", dtype=torch.float16)
    with pytest.raises(RuntimeError):
        sdpa.scaled_dot_product_attention(q, q, q[..., :4, :])  # keys and values disagree
    assert torch.backends.cuda.cudnn_sdp_enabled()


def test_sdpa_first_call_measures_every_case_and_backend_on_the_cpu(tmp_path):
    spec = importlib.util.spec_from_file_location(
        "sdpa_first_call", ROOT / "scripts/sdpa_first_call.py"
    )
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out = tmp_path / "sdpa.json"
    argv = ["--device", "cpu", "--dtype", "fp32", "--shapes", "2", "--repeat", "1", "--rows", "4"]
    assert script.main([*argv, "--tokens", "64", "--heads", "2", "--json", str(out)]) is None
    doc = json.loads(out.read_text())
    rows = {(r["case"], r["backend"]): r for r in doc["results"]}
    assert set(rows) == {(c, b) for c in script.CASES for b in script.BACKENDS}
    # on a CPU torch's choice and flash/efficient/math run; cuDNN alone has no kernel there
    for case in script.CASES:
        assert "error" in rows[case, "cudnn"]
        for backend in ("torch", "no-cudnn"):
            row = rows[case, backend]
            assert row["shapes"] == 2 and row["first_ms"] > 0 and row["later_ms"] > 0
            assert row["new_shape_ms"] > -row["later_ms"]  # a difference of two medians
    assert "| decode self | torch |" in script.table(doc["results"])
