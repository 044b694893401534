"""recurnmt/modules/sdpa.py: which fused attention kernel recurnmt's attention calls may take
(``RECURNMT_SDPA``), and scripts/sdpa_first_call.py, which measures what a new shape costs."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

from recurnmt.analysis.dispatch import count_dispatch
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


def _import_and_read(env: dict[str, str]) -> list[str]:
    """The two torch switches after ``import user_dir`` in a fresh process with ``env``."""
    env = {k: v for k, v in os.environ.items() if k not in sdpa.TORCH_SWITCHES and k != sdpa.ENV}
    code = (
        "import os, user_dir; "
        "print([os.environ.get(k, '-') for k in ('TORCH_CUDNN_SDPA_DEPRIORITIZED', "
        "'TORCH_CUDNN_SDPA_PREFERRED')])"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env={**env, **_env, "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return eval(proc.stdout.strip().splitlines()[-1])


def test_the_default_is_torchs_own_switch_and_the_users_setting_wins():
    """Importing the plugin (``fairseq-train --user-dir user_dir``) puts torch's switch in the
    environment, which torch reads at the first attention call on a GPU for every model of
    the process; a switch the user set is left as it is; ``torch`` sets nothing."""
    global _env
    for _env, expected in [
        ({}, ["1", "0"]),
        ({"RECURNMT_SDPA": "no-cudnn-anywhere"}, ["1", "0"]),
        ({"RECURNMT_SDPA": "torch"}, ["-", "-"]),
        ({"TORCH_CUDNN_SDPA_DEPRIORITIZED": "0"}, ["0", "-"]),
    ]:
        assert _import_and_read(_env) == expected, _env


_env: dict[str, str] = {}


def test_set_policy_puts_and_takes_back_only_its_own_switches(policy, monkeypatch):
    for key in sdpa.TORCH_SWITCHES:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(sdpa, "_ours", set())
    policy("no-cudnn")
    assert os.environ["TORCH_CUDNN_SDPA_DEPRIORITIZED"] == "1"
    policy("torch")
    assert "TORCH_CUDNN_SDPA_DEPRIORITIZED" not in os.environ
    monkeypatch.setenv("TORCH_CUDNN_SDPA_DEPRIORITIZED", "0")  # the user's
    policy("no-cudnn")
    assert os.environ["TORCH_CUDNN_SDPA_DEPRIORITIZED"] == "0"
    assert "TORCH_CUDNN_SDPA_PREFERRED" not in os.environ


def _attention_ops(run) -> tuple[torch.Tensor, set[str]]:
    """``run()`` and the aten operations it dispatched in this thread."""
    with count_dispatch() as log:
        out = run()
    return out, set(log.ops)


FLASH_CPU = "aten._scaled_dot_product_flash_attention_for_cpu"


def _math_ran(ops: set[str]) -> bool:
    """The math kernel ran: a softmax of its own, torch's flash kernel not."""
    return FLASH_CPU not in ops and any("softmax" in op for op in ops)


def _attention_call(seed: int = 0):
    """recurnmt's self-attention over a padded batch, in evaluation."""
    torch.manual_seed(seed)
    attention = SelfAttention(32, 4).eval()
    x = torch.randn(3, 6, 32)
    pad = torch.zeros(3, 6, dtype=torch.bool)
    pad[1, :2] = True
    with torch.no_grad():
        return lambda: attention(x, key_padding_mask=pad)


@pytest.mark.parametrize("name", sdpa.POLICIES)
def test_recurnmt_never_changes_torchs_flags_or_order(name, policy, monkeypatch):
    """No policy and no thread's choice changes a process-wide flag or torch's priority order
    at a call: nothing another thread set can be undone."""
    policy(name)

    def refuse(*args):
        raise AssertionError("a process-wide attention flag was changed")

    for setter in ("enable_cudnn_sdp", "enable_flash_sdp", "enable_mem_efficient_sdp"):
        monkeypatch.setattr(torch.backends.cuda, setter, refuse)
    monkeypatch.setattr(torch._C, "_set_sdp_priority_order", refuse)
    call = _attention_call()
    expected = call()
    for backend in (SDPBackend.MATH, SDPBackend.FLASH_ATTENTION):
        with sdpa.kernel(backend):
            torch.testing.assert_close(call(), expected, atol=1e-5, rtol=1e-5)


def test_a_users_sdpa_kernel_choice_is_honoured():
    """torch's own context decides recurnmt's calls as it decides anyone's: math inside
    ``sdpa_kernel(MATH)``, torch's flash kernel on a CPU outside it."""
    call = _attention_call()
    expected, default = _attention_ops(call)
    assert FLASH_CPU in default
    with sdpa_kernel(SDPBackend.MATH):
        got, ops = _attention_ops(call)
    assert _math_ran(ops)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_two_threads_choosing_different_backends_each_get_theirs():
    """:func:`sdpa.kernel` is the calling thread's: two threads running recurnmt's attention at
    once, one on the math kernel and one on flash attention, each run theirs at every call
    (torch's ``sdpa_kernel`` is process-wide and could not), and a third without a choice
    keeps torch's."""
    call = _attention_call()
    expected = call()
    barrier = threading.Barrier(3)
    seen: dict[str, list[set[str]]] = {}

    def worker(name: str, backend: SDPBackend | None) -> None:
        runs = seen.setdefault(name, [])
        with sdpa.kernel(backend) if backend else contextlib.nullcontext():
            for _ in range(20):
                barrier.wait()
                out, ops = _attention_ops(call)
                torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
                runs.append(ops)

    threads = [
        threading.Thread(target=worker, args=args)
        for args in [("math", SDPBackend.MATH), ("flash", SDPBackend.FLASH_ATTENTION), ("-", None)]
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen["math"]) == len(seen["flash"]) == len(seen["-"]) == 20
    assert all(_math_ran(ops) for ops in seen["math"])
    assert all(FLASH_CPU in ops for ops in seen["flash"] + seen["-"])


def test_kernel_refuses_what_it_cannot_call():
    with pytest.raises(ValueError, match="at least one"):
        with sdpa.kernel():
            pass
    with pytest.raises(ValueError, match="not one of"):
        with sdpa.kernel(SDPBackend.OVERRIDEABLE):
            pass
    q = torch.randn(1, 2, 3, 8)
    with sdpa.kernel(SDPBackend.EFFICIENT_ATTENTION):  # a CUDA kernel, on a CPU tensor
        with pytest.raises(RuntimeError, match="EFFICIENT_ATTENTION.*takes this call"):
            sdpa.scaled_dot_product_attention(q, q, q)


@pytest.mark.parametrize("backend", [SDPBackend.MATH, SDPBackend.FLASH_ATTENTION])
@pytest.mark.parametrize("mask", ["none", "padding", "additive", "causal", "lower-right"])
def test_a_chosen_kernel_gives_torchs_result(backend, mask):
    """Every mask recurnmt passes, on the chosen kernel, equals torch's call, with gradients."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 3, 8, generator=g, requires_grad=True)
    k, v = (torch.randn(2, 4, 5, 8, generator=g) for _ in range(2))
    attn_mask, causal = None, False
    if mask == "padding":
        attn_mask = torch.ones(2, 1, 1, 5, dtype=torch.bool)
        attn_mask[1, ..., :2] = False
    elif mask == "additive":
        attn_mask = torch.randn(2, 1, 1, 5, generator=g)
    elif mask == "causal":
        k, v, causal = k[:, :, :3], v[:, :, :3], True
    elif mask == "lower-right":
        attn_mask = causal_lower_right(3, 5)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=causal)
    with sdpa.kernel(backend):
        got = sdpa.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=causal)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    (want_grad,) = torch.autograd.grad(want.sum(), q)
    (got_grad,) = torch.autograd.grad(got.sum(), q)
    torch.testing.assert_close(got_grad, want_grad, atol=1e-5, rtol=1e-5)


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
    seen_switch = []
    real_measure = script.measure
    monkeypatch.setattr(
        script,
        "measure",
        lambda *a: (
            seen_switch.append(os.environ.get("TORCH_CUDNN_SDPA_DEPRIORITIZED")) or real_measure(*a)
        ),
    )
    try:
        script.main([*argv, "--sdpa", "torch"])
    finally:
        sdpa.set_policy("no-cudnn")
    assert seen == [None, "torch"]
    assert seen_switch == [None]  # the commands run with torch's own order
    assert json.loads(out.read_text())["sdpa"] == "torch"
    with pytest.raises(SystemExit):
        script.main([*argv, "--sdpa", "cudnn"])


@CUDA
@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_on_cuda_a_users_cudnn_choice_is_honoured(dtype):
    """Inside ``sdpa_kernel(CUDNN_ATTENTION)`` (and ``[CUDNN_ATTENTION, MATH]`` with its
    priority) recurnmt's attention runs cuDNN's kernel, as torch's own call does."""
    attention = SelfAttention(64, 4, causal=True).cuda().to(dtype).eval()
    x = torch.randn(2, 7, 64, device="cuda", dtype=dtype)
    with torch.no_grad():
        expected = attention(x)
        for backends, priority in [
            ([SDPBackend.CUDNN_ATTENTION], False),
            ([SDPBackend.CUDNN_ATTENTION, SDPBackend.MATH], True),
        ]:
            with sdpa_kernel(backends, set_priority=priority), count_dispatch() as log:
                got = attention(x)
            assert "aten._scaled_dot_product_cudnn_attention" in log.ops
            torch.testing.assert_close(got, expected, atol=2e-2, rtol=2e-2)


@CUDA
@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize(
    "backend",
    [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION],
)
@pytest.mark.parametrize("mask", ["none", "padding", "lower-right"])
def test_on_cuda_a_chosen_kernel_gives_torchs_result(dtype, backend, mask):
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(2, 4, 3, 64, generator=g, device="cuda", dtype=dtype, requires_grad=True)
    k, v = (torch.randn(2, 4, 21, 64, generator=g, device="cuda", dtype=dtype) for _ in "kv")
    attn_mask = None
    if mask == "padding":
        attn_mask = torch.ones(2, 1, 1, 21, dtype=torch.bool, device="cuda")
        attn_mask[1, ..., :2] = False
    elif mask == "lower-right":
        attn_mask = causal_lower_right(3, 21)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
    with sdpa.kernel(backend, SDPBackend.MATH), count_dispatch() as log:
        got = sdpa.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
    torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
    (want_grad,) = torch.autograd.grad(want.float().sum(), q)
    (got_grad,) = torch.autograd.grad(got.float().sum(), q)
    torch.testing.assert_close(got_grad, want_grad, atol=5e-2, rtol=5e-2)
    names = {
        "FLASH_ATTENTION": "flash",
        "EFFICIENT_ATTENTION": "efficient",
        "CUDNN_ATTENTION": "cudnn",
    }
    if mask == "none" or backend != SDPBackend.FLASH_ATTENTION:
        assert any(names[backend.name] in op for op in log.ops), log.ops


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
