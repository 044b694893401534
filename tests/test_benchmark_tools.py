"""recurnmt.experiments.benchmark: the table and worker plumbing of the benchmark scripts."""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path

import pytest

from recurnmt.experiments.benchmark import (
    Column,
    WorkerError,
    forward_flags,
    ratio_table,
    run_workers,
)
from tests.nmt_fixtures import data  # noqa: F401


def test_ratio_table_divides_by_the_first_row():
    rows = [
        {"arch": "base", "speed": 100.0, "params": 2e6},
        {"arch": "ours", "speed": 150.0, "params": 1e6},
    ]
    table = ratio_table(
        rows,
        "arch",
        [
            Column("speed", "speed", ".0f"),
            Column("params", "params", ".1f", ratio=False, scale=1e6, suffix="M"),
        ],
    )
    header, rule, base, ours = table.splitlines()
    assert header.split() == ["arch", "speed", "ratio", "params"]
    assert len(rule) == len(header)
    assert base.split() == ["base", "100", "1.00", "2.0M"]
    assert ours.split() == ["ours", "150", "1.50", "1.0M"]


def test_workers_run_in_their_own_processes(tmp_path: Path):
    script = tmp_path / "worker.py"
    script.write_text(
        textwrap.dedent(
            """
            import os, sys
            from recurnmt.experiments.benchmark import emit
            name = sys.argv[2]
            if name == "bad":
                sys.exit("no such model")
            emit({"name": name, "pid": os.getpid(), "flag": sys.argv[3]})
            """
        )
    )
    flags = forward_flags(argparse.Namespace(embed_dim=8), ["embed_dim"])
    assert flags == ["--embed-dim=8"]
    cwd = Path(__file__).resolve().parents[1]
    a, b = run_workers(script, "--model", ["a", "b"], flags, cwd)
    assert (a["name"], b["name"], a["flag"]) == ("a", "b", "--embed-dim=8")
    assert a["pid"] != b["pid"]
    with pytest.raises(WorkerError, match="worker bad failed.*\n.*no such model"):
        run_workers(script, "--model", ["bad"], flags, cwd)


TURN_WORKER = """
import os, sys, time
from pathlib import Path
import torch
from recurnmt.experiments.benchmark import Turns, emit, fastest_round
turns = Turns()
name, log = sys.argv[2], Path(sys.argv[3])
Path(log.parent / f"{name}.pid").write_text(str(os.getpid()))
if name == "bad":
    turns.wait()
    sys.exit("bad broke in its second turn")
def run():
    with log.open("a") as f:
        f.write(f"{name}+ ")
    time.sleep(0.05)  # another worker running now would interleave its lines here
    with log.open("a") as f:
        f.write(f"{name}- ")
emit({"name": name, "seconds": fastest_round(turns, 2, run, torch.device("cpu"))})
"""


def test_workers_take_turns_one_timed_round_at_a_time(tmp_path: Path):
    script = tmp_path / "worker.py"
    script.write_text(TURN_WORKER)
    log = tmp_path / "log"
    cwd = Path(__file__).resolve().parents[1]
    results = run_workers(script, "--model", ["a", "b", "c"], [str(log)], cwd)
    assert [r["name"] for r in results] == ["a", "b", "c"]
    assert all(r["seconds"] >= 0.05 for r in results)
    # round 1 of every model, then round 2 of every model; never two at once
    assert log.read_text().split() == ["a+", "a-", "b+", "b-", "c+", "c-"] * 2
    log.unlink()
    run_workers(script, "--model", ["a", "b"], [str(log)], cwd, sequential=True)
    assert log.read_text().split() == ["a+", "a-", "a+", "a-", "b+", "b-", "b+", "b-"]


def test_a_failing_worker_stops_the_others(tmp_path: Path):
    import os

    script = tmp_path / "worker.py"
    script.write_text(TURN_WORKER)
    log = tmp_path / "log"
    cwd = Path(__file__).resolve().parents[1]
    with pytest.raises(WorkerError, match="worker bad failed \\(exit 1\\):\n.*second turn"):
        run_workers(script, "--model", ["a", "bad", "c"], [str(log)], cwd)
    assert log.read_text().split() == ["a+", "a-"]  # a's first round; then bad failed
    for name in ("a", "c"):
        pid = int((tmp_path / f"{name}.pid").read_text())
        with pytest.raises(ProcessLookupError):  # killed and reaped, not left waiting
            os.kill(pid, 0)


def test_device_auto_resolves_and_cuda_is_refused_where_absent(monkeypatch):
    import torch

    from recurnmt.device import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match="--device cuda: no CUDA device"):
        resolve_device("cuda")
    with pytest.raises(ValueError, match="--device 'tpu': expected auto, cpu or cuda"):
        resolve_device("tpu")
    with pytest.raises(ValueError, match="--device 'meta': expected auto, cpu or cuda"):
        resolve_device("meta")  # a torch device, but not one to compute on
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert resolve_device("auto") == torch.device("cuda")
    assert resolve_device("cuda:0") == torch.device("cuda", 0)
    with pytest.raises(ValueError, match="--device cuda:1: only 1 CUDA device"):
        resolve_device("cuda:1")


def test_fp16_is_refused_on_the_cpu_and_bf16_autocasts():
    import torch

    from recurnmt.experiments.benchmark import MixedPrecision

    cpu = torch.device("cpu")
    with pytest.raises(ValueError, match="--dtype fp16 needs CUDA"):
        MixedPrecision.build("fp16", cpu)
    bf16 = MixedPrecision.build("bf16", cpu)
    assert bf16.scaler() is None
    with bf16.autocast():
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
    with MixedPrecision.build("fp32", cpu).autocast():
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32


def test_storage_bytes_counts_a_shared_buffer_once():
    import torch

    from recurnmt.experiments.benchmark import storage_bytes

    class Holder:
        def __init__(self, t):
            self.t = t

    buffer = torch.zeros(4, 8)  # 128 bytes
    state = {"a": buffer[:2], "b": [buffer[2:], Holder(buffer)], "c": (torch.zeros(3),)}
    assert storage_bytes(state) == 128 + 12


@pytest.mark.parametrize("flag", ["--gen-rounds", "--train-rounds"])
def test_timing_rounds_must_be_positive(capsys, flag):
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "scripts" / "benchmark_nmt.py"
    spec = importlib.util.spec_from_file_location("benchmark_nmt", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    with pytest.raises(SystemExit):
        script.main([flag, "0"])
    assert f"{flag} 0: at least one round" in capsys.readouterr().err


def test_training_flops_counts_linear_layers_and_cpu_flash_attention():
    import torch

    from recurnmt.experiments.benchmark import training_flops

    torch.manual_seed(0)
    n, c = 6, 8
    layer = torch.nn.Linear(c, 4, bias=False)
    x = torch.randn(n, c)
    # forward 2*n*c*4; backward: the weight's gradient only (x needs none), 2*n*c*4
    assert training_flops(lambda: layer(x).sum()) == 2 * (2 * n * c * 4)

    q, k, v = (torch.randn(2, 3, 5, 4, requires_grad=True) for _ in range(3))

    def attention():
        return torch.nn.functional.scaled_dot_product_attention(q, k, v).sum()

    # Q K^T and P V forward; backward five products (torch's formula, which recomputes Q K^T
    # as the fused kernels do): 2 * B*H*S*S*D FLOPs each
    product = 2 * 2 * 3 * 5 * 5 * 4
    assert training_flops(attention) == 7 * product


@pytest.mark.parametrize("left_pad", [True, False])
def test_generation_batches_are_padded_as_fairseq_pads_a_batch(left_pad):
    import torch

    from recurnmt.experiments.benchmark import generation_batches

    pad = 1
    lengths = torch.tensor([5, 2, 3, 1, 4])
    tokens = torch.full((5, 7), pad)  # one large batch, padded to 7 (its longest was cut)
    for row, n in enumerate(lengths.tolist()):
        words = torch.arange(10, 10 + n)
        if left_pad:
            tokens[row, 7 - n :] = words
        else:
            tokens[row, :n] = words
    sample = {"net_input": {"src_tokens": tokens, "src_lengths": lengths}}
    first, second = generation_batches(sample, 4, 2, pad, left_pad)
    assert first["src_tokens"].shape == (2, 5) and second["src_tokens"].shape == (2, 3)
    assert first["src_lengths"].tolist() == [5, 2] and second["src_lengths"].tolist() == [3, 1]
    for batch in (first, second):
        for row, n in zip(batch["src_tokens"], batch["src_lengths"].tolist(), strict=True):
            words = row[-n:] if left_pad else row[:n]
            assert words.tolist() == list(range(10, 10 + n))
            assert row.ne(pad).sum() == n
    with pytest.raises(ValueError, match="padding is not on the side"):
        generation_batches(sample, 4, 2, pad, not left_pad)


def test_generation_decodes_a_typical_batch_of_the_test_set(data):  # noqa: F811
    """The sentences around the median source length, as fairseq-generate batches its middle,
    not the longest; all of them, sorted, where more are asked than the test set holds."""
    import torch

    from recurnmt.experiments.benchmark import load_generation_batches, translation_task

    task = translation_task(data, "test")
    sizes = sorted(int(n) for n in task.dataset("test").src_sizes)
    middle = sizes[(len(sizes) - 4) // 2 :][:4]
    (batch,) = load_generation_batches(data, 4, 4)
    assert sorted(batch["src_lengths"].tolist()) == middle
    assert batch["src_tokens"].size(1) == max(middle)  # padded to its own longest only
    batches = load_generation_batches(data, 10 * len(sizes), 2)
    lengths = torch.cat([b["src_lengths"] for b in batches])
    assert sorted(lengths.tolist()) == sizes
