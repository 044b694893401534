"""scripts/profile_decoding.py: where a beam-search step spends its time, per family.

The GPU half (kernels, synchronisations, copies, attention kernels) is read from the
profiler's Chrome trace; its parser is checked here on a trace written by hand, and the whole
script on the CPU (CPU activities only) on a tiny corpus.
"""

from __future__ import annotations

import json

import pytest

from tests.nmt_fixtures import data  # noqa: F401
from tests.script_modules import load_script


def _script():
    return load_script("profile_decoding")


def _event(cat: str, name: str, ts: float, dur: float) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}


def test_trace_summary_counts_per_step_what_the_device_did():
    script = _script()
    events = [
        _event("user_annotation", "recurnmt::generate", 0, 1000),
        _event("user_annotation", "recurnmt::decoder", 10, 300),
        _event("user_annotation", "recurnmt::decoder", 400, 300),
        _event("cpu_op", "aten::addmm", 20, 5),
        _event("cpu_op", "aten::addmm", 420, 5),
        _event("cpu_op", "aten::_local_scalar_dense", 30, 5),
        _event("cuda_runtime", "cudaLaunchKernel", 21, 2),
        _event("cuda_runtime", "cudaLaunchKernel", 421, 2),
        _event("cuda_runtime", "cudaMemcpyAsync", 31, 2),
        _event("cuda_runtime", "cudaStreamSynchronize", 33, 2),
        _event("kernel", "nvjet_sm90_hsh_gemm", 100, 50),
        _event("kernel", "cudnn_generated_fort_native_sdpa_sm90_flash_fprop", 120, 50),
        _event("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", 200, 1),
    ]
    summary = script.summarize_trace(events, steps=2)
    assert summary["kernels"] == 1.0 and summary["launches"] == 1.0
    assert summary["syncs"] == {"cudaStreamSynchronize": 0.5}
    assert summary["copies"] == {"DtoH": 0.5}
    assert summary["aten_ops"] == 1.5 and summary["op_counts"]["aten::addmm"] == 1.0
    # the two kernels overlap from 120 to 150: busy 100 - 30 = 70 us of 1000
    assert summary["gpu_busy"] == pytest.approx(0.07)
    assert list(summary["attention_kernels"]) == [
        "cudnn_generated_fort_native_sdpa_sm90_flash_fprop"
    ]
    assert summary["regions"]["decoder"] == {"calls": 2, "host_ms": 0.6}


def test_families_are_profiled_against_fairseqs_transformer_on_the_cpu(data, tmp_path):  # noqa: F811
    out = tmp_path / "profile.json"
    flags = ["--data", str(data), "--archs", "ringformer", "universal_transformer_act"]
    flags += ["--device", "cpu", "--dtype", "fp32", "--embed-dim", "32", "--ffn-dim", "64"]
    flags += ["--heads", "2", "--levels", "2", "--sentences", "2", "--decode-len", "3"]
    assert _script().main([*flags, "--rounds", "2", "--json", str(out)]) is None
    doc = json.loads(out.read_text())
    results = {r["arch"]: r for r in doc["results"]}
    assert list(results) == ["transformer", "ringformer", "universal_transformer_act"]
    for r in results.values():
        assert r["steps"] == 4  # three tokens and the end of sentence
        assert r["regions"]["decoder"]["calls"] == r["steps"]
        assert r["syncs"] == {} and r["kernels"] == 0  # the CPU: no device activity
        assert r["aten_ops"] > 0 and r["median_ms_per_step"] >= r["wall_ms_per_step"] > 0
    assert results["transformer"]["wall_ratio"] == 1.0
    # its signals folded into the weights, a RingFormer step dispatches fewer operations
    # than fairseq's transformer (85 a level before, 84 for a fairseq layer)
    assert results["ringformer"]["aten_ops"] < results["transformer"]["aten_ops"]


def test_static_decoding_rows_follow_their_family(data, tmp_path):  # noqa: F811
    """``--static-decoding``: after each family, the same model through the static-shape beam
    search, its path and its best hypotheses compared with the plain beam search's."""
    out = tmp_path / "profile.json"
    flags = ["--data", str(data), "--archs", "ringformer", "--device", "cpu", "--dtype", "fp32"]
    flags += ["--embed-dim", "32", "--ffn-dim", "64", "--heads", "2", "--levels", "2"]
    flags += ["--sentences", "3", "--decode-len", "3", "--rounds", "1", "--no-profile"]
    assert _script().main([*flags, "--static-decoding", "--json", str(out)]) is None
    rows = json.loads(out.read_text())["results"]
    assert [r["arch"] for r in rows] == ["transformer", "ringformer", "ringformer static"]
    assert rows[2]["steps"] == rows[1]["steps"] == 4
    assert rows[2]["path"] == "eager" and rows[2]["identical"] == "3/3"


def test_rounds_must_be_positive(capsys):
    with pytest.raises(SystemExit):
        _script().main(["--rounds", "0"])
    assert "--rounds 0: at least one round" in capsys.readouterr().err
