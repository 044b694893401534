"""A run that stops while fairseq's prefetch thread is busy exits 0, not SIGABRT."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from recurnmt.nmt.shutdown import stop_prefetch_threads

ROOT = Path(__file__).resolve().parent.parent

BUSY_BATCHES = """
import torch
from torch.nn.utils.rnn import pad_sequence


class BusyBatches:
    '''An endless epoch whose batches take a while to collate in PyTorch's C++ code.'''

    def __init__(self, work=20):
        self.rows = [torch.randint(0, 100, (30,)) for _ in range(64)]
        self.work = work

    def __len__(self):
        return 10**9

    def __iter__(self):
        while True:
            for _ in range(self.work):
                batch = pad_sequence(self.rows, batch_first=True)
            yield batch
"""

# fairseq-train's shape: batches are read ahead in a BackgroundConsumer thread, the loop stops
# after one update (--max-update 1) and the interpreter exits while the thread collates.
STOPS_EARLY = (
    BUSY_BATCHES
    + """
import recurnmt.nmt  # the plugin, as --user-dir imports it
from fairseq.data.iterators import BufferedIterator

batches = BufferedIterator(10**6, BusyBatches())  # a queue that never fills: always collating
next(batches)
print("done training")
"""
)


def _busy_batches():
    namespace: dict = {}
    exec(BUSY_BATCHES, namespace)
    return namespace["BusyBatches"]


def _run(script: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def test_the_plugin_lets_a_run_exit_while_its_prefetch_thread_collates():
    out = _run(STOPS_EARLY)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "done training"


def test_without_the_plugin_the_same_run_aborts():
    # the reproduction is real: fairseq alone, CPython 3.11, PyTorch -> SIGABRT at exit
    out = _run(STOPS_EARLY.replace("import recurnmt.nmt", "import fairseq.models"))
    assert out.stdout.strip() == "done training"
    assert out.returncode == -6 and "terminate called" in out.stderr, out.stderr[-2000:]


@pytest.mark.parametrize("queue_size", [1, 10**6], ids=["blocked-on-a-full-queue", "collating"])
def test_prefetch_threads_stop_on_request(queue_size):
    from fairseq.data.iterators import BackgroundConsumer, BufferedIterator

    batches = BufferedIterator(queue_size, _busy_batches()(work=2))
    assert isinstance(next(batches), torch.Tensor)
    consumer = batches._consumer
    assert isinstance(consumer, BackgroundConsumer) and consumer.is_alive()
    assert stop_prefetch_threads(timeout=30) == []
    assert not consumer.is_alive()
    assert consumer not in threading.enumerate()


def test_nothing_to_stop_is_a_no_op():
    assert stop_prefetch_threads(timeout=1) == []
