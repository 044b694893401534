"""Stops fairseq's data-prefetch threads before Python shuts down, so a finished run exits 0.

fairseq-fixed 0.12.3.1 reads batches ahead in a daemon thread
(``fairseq.data.iterators.BackgroundConsumer``, ``--data-buffer-size``, 10 by default). When
training stops before the epoch's batches run out (``--max-update``, ``--stop-time-hours``, or
a one-step check), that thread is still collating the next batch when the interpreter
finalizes. CPython 3.11 ends a daemon thread that wants the GIL back during finalization with
``pthread_exit``, and the forced unwind through PyTorch's C++ frames aborts the process::

    done training in 0.0 seconds
    terminate called without an active exception      (exit -6, SIGABRT)

The run itself had finished and saved, but the exit status says it crashed, which fails every
script and scheduler that checks it. It struck about one short ``fairseq-train`` in 20 here.

:func:`stop_prefetch_at_exit` registers an :mod:`atexit` handler (handlers run while daemon
threads still run normally): it tells each live consumer to stop after the item in hand and
drains its queue until the thread has returned.
"""

from __future__ import annotations

import atexit
import queue
import threading
import time


def _consumers() -> list[threading.Thread]:
    try:
        from fairseq.data.iterators import BackgroundConsumer
    except ImportError:  # fairseq never imported: no consumer can exist
        return []
    return [t for t in threading.enumerate() if isinstance(t, BackgroundConsumer) and t.is_alive()]


def stop_prefetch_threads(timeout: float = 60.0) -> list[threading.Thread]:
    """Stops fairseq's live ``BackgroundConsumer`` threads.

    Each consumer breaks out of its loop after the next item it queues (its ``_max_len``
    becomes 0); its queue is drained so that neither that item nor the end sentinel blocks it.

    Args:
        timeout: seconds to wait for all of them (a batch in hand may take a while to collate).

    Returns:
        The threads still alive after ``timeout`` (empty when every one stopped).
    """
    deadline = time.monotonic() + timeout
    consumers = _consumers()
    for consumer in consumers:
        consumer._max_len = 0  # `count >= _max_len` holds after its next put: it breaks
    for consumer in consumers:
        while consumer.is_alive() and time.monotonic() < deadline:
            try:
                consumer._queue.get(timeout=0.01)
            except queue.Empty:
                pass
            consumer.join(timeout=0.01)
    return [c for c in consumers if c.is_alive()]


def stop_prefetch_at_exit() -> None:
    """Registers :func:`stop_prefetch_threads` to run at interpreter exit (once, however often
    the plugin is imported)."""
    atexit.unregister(stop_prefetch_threads)
    atexit.register(stop_prefetch_threads)
