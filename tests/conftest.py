"""Shared test settings: deterministic, single-threaded, quiet fairseq logging, devices.

Tests that matter on a GPU take the ``device`` fixture: they run on the CPU always and once more
on CUDA, marked ``cuda`` (``pytest -m cuda`` selects that half; where no CUDA device is present
it is reported skipped with the reason).
"""

from __future__ import annotations

import logging

import pytest
import torch

torch.set_num_threads(1)
logging.getLogger("fairseq").setLevel(logging.WARNING)

NO_CUDA = "no CUDA device on this machine (the CPU half of this test ran)"
DEVICES = [
    pytest.param("cpu", id="cpu"),
    pytest.param(
        "cuda",
        id="cuda",
        marks=[pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)],
    ),
]


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> torch.device:
    """The device a test runs on: ``cpu``, and ``cuda`` where one is present."""
    return torch.device(request.param)
