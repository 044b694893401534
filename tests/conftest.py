"""Shared test settings: deterministic, single-threaded, quiet fairseq logging."""

from __future__ import annotations

import logging

import pytest
import torch

torch.set_num_threads(1)
logging.getLogger("fairseq").setLevel(logging.WARNING)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
