"""Two processes (gloo on CPU, NCCL on two GPUs) train as one process on their combined batch.

Design: one SGD update with learning rate 1, dropout 0 and a fixed seed, so that the saved
parameters are ``initial - gradient``. fairseq gives rank r the batches r, r + W, ... of one
shuffled batch list, sums the ranks' gradients (all-reduce) and divides by the summed sample
size (target tokens). One process with ``--update-freq 2`` accumulates batches 0 and 1 and
divides by the same total, so its first update is the reference; a third run with
``--lr 0`` gives the initial parameters, to compare gradients rather than updated weights,
and a fourth with batch 0 alone shows that the comparison would notice a missing rank.

Marked ``dist`` and ``e2e``: about a minute on two cores. The CUDA half needs two GPUs (one
process per GPU, NCCL, fairseq's default DDP) and is skipped with the reason otherwise.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import recurnmt.nmt.checkpoint_safety  # noqa: F401  (fairseq checkpoints load weights-only)
from recurnmt.experiments.commands import fairseq_tool, user_dir
from recurnmt.experiments.launch import free_port
from tests import nmt_fixtures

pytestmark = [pytest.mark.dist, pytest.mark.e2e]

data = nmt_fixtures.data  # the shared fixture, found by pytest under this name
ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
LAUNCH = [sys.executable, "-m", "recurnmt.experiments.launch"]  # the launcher, as a user runs it


def one_update(data: Path, save_dir: Path, *extra: str) -> list[str]:
    """fairseq-train arguments of one deterministic SGD update (no device flags)."""
    return [
        str(data),
        "--user-dir",
        str(user_dir()),
        "--arch",
        "ringformer_tiny",
        "--optimizer",
        "sgd",
        "--lr",
        "1",
        "--max-tokens",
        "512",
        "--max-update",
        "1",
        "--criterion",
        "recurrent_label_smoothed_cross_entropy",
        "--label-smoothing",
        "0.1",
        "--dropout",
        "0",
        "--share-all-embeddings",
        "--seed",
        "7",
        "--num-workers",
        "0",
        "--disable-validation",
        "--no-epoch-checkpoints",
        "--log-format",
        "json",
        "--save-dir",
        str(save_dir),
        *extra,
    ]


def params(save_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(save_dir / "checkpoint_last.pt", map_location="cpu")["model"]


def run(argv: list[str], timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        argv, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=timeout, check=False
    )


_REFERENCES: dict[str, dict[str, dict[str, torch.Tensor]]] = {}


@pytest.fixture
def two_devices(device) -> str:
    """The device type, where two processes can each have one (gloo: any number on CPU)."""
    if device.type == "cuda" and torch.cuda.device_count() < 2:
        pytest.skip(f"NCCL training needs 2 GPUs; {torch.cuda.device_count()} visible")
    return device.type


@pytest.fixture
def reference(data, tmp_path_factory, two_devices) -> dict[str, dict[str, torch.Tensor]]:
    """Single-process runs on the device (once per device and session): initial weights,
    batches 0+1 in one update, batch 0 alone."""
    if two_devices not in _REFERENCES:
        _REFERENCES[two_devices] = _single_process_runs(data, tmp_path_factory, two_devices)
    return _REFERENCES[two_devices]


def _single_process_runs(data, tmp_path_factory, on: str) -> dict[str, dict[str, torch.Tensor]]:
    root = tmp_path_factory.mktemp(f"single_{on}")
    cpu = ["--cpu"] if on == "cpu" else []
    runs = {
        "init": ["--lr", "0"],
        "combined": ["--update-freq", "2"],
        "first_batch_only": [],
    }
    procs = {
        name: subprocess.Popen(
            [*fairseq_tool("train"), *one_update(data, root / name), *extra, *cpu],
            cwd=ROOT,
            env=ENV,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for name, extra in runs.items()
    }
    for name, proc in procs.items():
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"{name} failed:\n{out[-3000:]}"
    return {name: params(root / name) for name in runs}


def gradients(before, after) -> dict[str, torch.Tensor]:
    return {k: before[k] - after[k] for k in before}  # SGD with lr 1: p' = p - g


def assert_same_first_update(dist_params, reference, atol: float = 1e-6) -> None:
    init = reference["init"]
    want = gradients(init, reference["combined"])
    got = gradients(init, dist_params)
    assert want.keys() == got.keys()
    assert sum(g.abs().sum().item() for g in want.values()) > 1.0  # a real update
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-5, atol=atol, msg=k)
    # the comparison is sensitive: batch 0 alone gives a clearly different gradient
    alone = gradients(init, reference["first_batch_only"])
    assert max((alone[k] - want[k]).abs().max().item() for k in want) > 1e-3


@pytest.mark.parametrize("launcher", ["fairseq", "torchrun"])
def test_two_processes_match_one_process_on_the_combined_batch(
    data, tmp_path, reference, launcher, two_devices
):
    save = tmp_path / "dist"
    cmd = [*LAUNCH, "--nproc", "2", "--device", two_devices]
    cmd += ["--launcher", launcher, "--", *one_update(data, save)]
    proc = run(cmd)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert "distributed init (rank 1)" in log or "rank 1" in log
    assert '"train_bsz": "20"' in log or '"bsz": "20"' in log  # both ranks' sentences
    # NCCL's all-reduce adds the two ranks' gradients in another order than one process's
    # accumulation: a rounding difference of a few fp32 ulps of the larger gradients
    assert_same_first_update(params(save), reference, atol=1e-6 if two_devices == "cpu" else 1e-5)


def test_torchrun_without_world_size_is_refused_before_training(data, tmp_path):
    """The silent failure: two independent jobs into one --save-dir. build_model refuses."""
    save = tmp_path / "twojobs"
    port = str(free_port())
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    cmd += ["--master-addr", "127.0.0.1", "--master-port", port]
    cmd += ["-m", "fairseq_cli.train", *one_update(data, save), "--cpu"]
    proc = run(cmd)
    assert proc.returncode != 0
    assert "torchrun started 2 processes (WORLD_SIZE=2)" in proc.stdout + proc.stderr
    assert not (save / "checkpoint_last.pt").exists()


def test_two_processes_resume_from_their_checkpoint(data, tmp_path):
    """Every rank reads the checkpoint itself (the launcher's --load-checkpoint-on-all-dp-ranks):
    fairseq's default, rank 0 reading it and sending the state to the others, fails in their
    weights-only torch.load (the omegaconf configuration in it)."""
    save = tmp_path / "dist"
    cmd = [*LAUNCH, "--nproc", "2", "--device", "cpu", "--"]
    first = run([*cmd, *one_update(data, save)])
    assert first.returncode == 0, (first.stdout + first.stderr)[-4000:]
    second = run([*cmd, *one_update(data, save), "--max-update", "2"])
    log = second.stdout + second.stderr
    assert second.returncode == 0, log[-4000:]
    assert "Loaded checkpoint" in log and "@ 1 updates" in log
    assert torch.load(save / "checkpoint_last.pt")["optimizer_history"][-1]["num_updates"] == 2
