"""The dispatch counter and the simulated device (``recurnmt.analysis.dispatch``)."""

from __future__ import annotations

import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from recurnmt.analysis.dispatch import SimulatedDevice, count_dispatch, count_python_calls


@pytest.fixture
def sim() -> SimulatedDevice:
    """A simulated CUDA device, where this torch supports one."""
    sim = SimulatedDevice("cuda")
    if not sim.supported():
        pytest.skip("this torch's Python indexing takes a CUDA device guard, which needs a GPU")
    return sim


def test_counts_every_operation_once():
    a, b = torch.randn(2, 3), torch.randn(3, 4)
    with count_dispatch() as log:
        torch.relu(a @ b)
    assert log.ops == {"aten.mm": 1, "aten.relu": 1}
    assert log.total == 2


def test_host_reads_on_the_cpu():
    x = torch.tensor([0.0, 1.0, 2.0, 3.0])
    with count_dispatch() as log:
        x.sum().item()
        bool(x.any())
        int(x[1])
        x.nonzero()
        x.masked_select(x > 1)
        x[x > 1]
        torch.equal(x, x)
        torch.repeat_interleave(torch.tensor([1, 2]))
    assert [e.op for e in log.reads] == [
        "aten._local_scalar_dense",
        "aten._local_scalar_dense",
        "aten._local_scalar_dense",
        "aten.nonzero",
        "aten.masked_select",
        "aten.index",
        "aten.equal",
        "aten.repeat_interleave",
    ]
    assert "test_dispatch.py" in log.reads[0].where and ".item()" in log.reads[0].where
    assert not log.syncs  # CPU tensors: nothing to wait for


def test_reads_that_need_no_values():
    x, rows = torch.arange(6.0), torch.tensor([2, 0])
    with count_dispatch() as log:
        x[rows]  # integer indices: the output shape is theirs
        x.index_select(0, rows)
        torch.repeat_interleave(torch.tensor([1, 2]), output_size=3)
        x.tolist()  # on the CPU: read from memory, nothing dispatched
    assert not log.reads
    assert log.ops["aten.index"] == 1


def test_simulated_device_reports_the_device_and_computes_the_cpus_values(sim):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.LayerNorm(8))
    model.register_buffer("scale", torch.tensor(2.0))
    x = torch.randn(2, 5, 8)
    with torch.no_grad():
        expected = F.scaled_dot_product_attention(model(x), x, x) * model.scale
        with sim:
            sim.module(model)
            assert {p.device.type for p in [*model.parameters(), *model.buffers()]} == {"cuda"}
            y = sim.tensor(x)
            out = F.scaled_dot_product_attention(model(y), y, y) * model.scale
            assert out.device.type == "cuda" and y.device.type == "cuda"
            got = out.cpu()
    assert got.device.type == "cpu"
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-6)
    with pytest.raises(RuntimeError, match="outside its `with` block"):
        y + 1
    with pytest.raises(ValueError):
        SimulatedDevice("cpu")


def test_simulated_module_keeps_shared_tensors_shared():
    shared = nn.Linear(4, 4)
    model = nn.ModuleList([shared, nn.Sequential(shared)])
    SimulatedDevice().module(model)
    assert model[0].weight is model[1][0].weight


def test_host_reads_of_a_device_are_syncs(sim):
    with sim:
        x = sim.tensor(torch.tensor([0.0, 1.0, 2.0]))
        on_cpu = torch.ones(3)
        with count_dispatch() as log:
            x.sum().item()
            x.tolist()
            x.cpu()
            x.nonzero()
            copied = on_cpu.copy_(x)
            on_cpu.sum().item()  # a CPU tensor: read, but no wait for the device
    assert copied is on_cpu
    assert [(e.op, e.device) for e in log.syncs] == [
        ("aten._local_scalar_dense", "cuda"),
        ("aten._to_copy", "cuda"),
        ("aten._to_copy", "cuda"),
        ("aten.nonzero", "cuda"),
        ("aten.copy_", "cuda"),
    ]
    assert [e.device for e in log.reads] == ["cuda"] * 5 + ["cpu"]


def test_cpu_tensors_moved_to_the_device_are_caught(sim):
    with sim:
        x = sim.tensor(torch.arange(6.0))
        with count_dispatch() as log:
            a = torch.zeros(6).to(x)  # made on the CPU, then copied
            b = torch.tensor([1.0, 2.0], device=x.device)  # Python data: always a copy
            c = x[torch.tensor([0, 2])]  # a CPU index tensor
            d = x.new_zeros(6)
            assert d.copy_(torch.ones(6)) is d
    assert {t.device.type for t in (a, b, c, d)} == {"cuda"}
    assert [e.op for e in log.to_device] == [
        "aten._to_copy",
        "aten._to_copy",
        "aten.index",
        "aten.copy_",
    ]
    assert "torch.zeros(6).to(x)" in log.to_device[0].where


def test_tensors_made_on_the_device_are_not_copies(sim):
    with sim:
        x = sim.tensor(torch.arange(6.0))
        with count_dispatch() as log:
            torch.zeros(6, device=x.device)
            torch.arange(6, device=x.device)
            x.new_ones(2)
            x * torch.tensor(2.0)  # a 0-dim CPU operand is a scalar argument of the kernel
            x[torch.arange(2, device=x.device)]
    assert not log.to_device


def test_python_calls_are_counted_in_the_block_only():
    def leaf(x):
        return x + 1

    outside = sys.getprofile()
    with count_python_calls() as empty:  # leaving the block makes calls of its own
        pass
    with count_python_calls() as counts:
        for _ in (0, 1, 2):
            leaf(torch.zeros(1))  # a call of a Python function and one of a built-in
    assert sys.getprofile() is outside
    assert counts - empty == {"call": 3, "c_call": 3}
    before = counts.copy()
    leaf(torch.zeros(1))
    assert counts == before
