"""Map a per-item text function over a stream, optionally in worker processes.

The function is built inside each worker by a picklable factory (a module-level function and
its arguments), so heavy objects such as tokenizers or BPE tables are never pickled per item.
Order is preserved, and at most a few chunks per worker are in flight, so input streams of
millions of lines are never held in memory.
"""

from __future__ import annotations

import multiprocessing
import signal
import threading
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from typing import Any

Factory = Callable[..., Callable[[Any], Any]]

_WORKER_FN: Callable[[Any], Any] | None = None


def _init_worker(factory: Factory, args: tuple[Any, ...]) -> None:
    global _WORKER_FN
    # The parent handles interrupts and cleans up; workers just stop when told to.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _WORKER_FN = factory(*args)


def _apply_chunk(chunk: list[Any]) -> list[Any]:
    assert _WORKER_FN is not None, "worker not initialised"
    return [_WORKER_FN(item) for item in chunk]


def _chunks(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    iterator = iter(items)
    while chunk := list(islice(iterator, size)):
        yield chunk


def imap_ordered(
    factory: Factory,
    args: tuple[Any, ...],
    items: Iterable[Any],
    workers: int = 1,
    chunk_size: int = 2000,
) -> Iterator[Any]:
    """Yield ``factory(*args)(item)`` for every item, in order.

    Args:
        factory: Module-level function returning the per-item function.
        args: Picklable arguments of ``factory``.
        items: The input stream (consumed lazily).
        workers: Processes to use; ``1`` runs in this process.
        chunk_size: Items sent to a worker at a time.

    Yields:
        The mapped items.
    """
    if workers <= 1:
        fn = factory(*args)
        for item in items:
            yield fn(item)
        return
    # Pool.imap reads its input as fast as it can; bound the chunks in flight so a corpus of
    # millions of lines is streamed rather than loaded into the task queue.
    in_flight = threading.Semaphore(4 * workers)
    stopped = threading.Event()

    def feed() -> Iterator[list[Any]]:
        for chunk in _chunks(items, chunk_size):
            in_flight.acquire()
            if stopped.is_set():
                return
            yield chunk

    # Not "fork": the parent may run threads (tqdm's monitor, datasets) whose locks a forked
    # child would inherit held, and then hang.
    context = multiprocessing.get_context("forkserver")
    with context.Pool(workers, initializer=_init_worker, initargs=(factory, args)) as pool:
        try:
            for chunk in pool.imap(_apply_chunk, feed()):
                in_flight.release()
                yield from chunk
        finally:
            stopped.set()
            for _ in range(4 * workers):  # unblock the feeder so the pool can shut down
                in_flight.release()
