"""A decoding step over fixed buffers, and the three ways it runs: eager, compiled, replayed.

A beam-search step on a GPU is bound by the host's dispatch of small operations (docs/gpu.md);
the cure is to capture a step once (a CUDA graph) and replay it, which needs every tensor of
the step to keep its shape and its storage. :class:`StaticStep` is such a step over a
:class:`~recurnmt.modules.decoding.static_cache.StaticStackCache`; :class:`StepPaths` chooses
how the steps after a batch's first run: compiled by ``torch.compile``
(:class:`CompiledStep`), replayed as a CUDA graph on CUDA (:class:`CapturedStep`), or eagerly,
falling back to eager, once and for good, where compiling or capturing fails. A front end's
search (fairseq's beam search: ``nmt/static_decoding``) drives the steps and keeps the
hypotheses.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from recurnmt.modules.decoding.compiled import compiled_decoding
from recurnmt.modules.decoding.protocol import DecodingSide
from recurnmt.modules.decoding.static_cache import StaticStackCache

WHY = {
    "compiled": "each step after the first compiled by torch.compile (TorchInductor's fused "
    "kernels; a few compilations in the first batches, at new shapes)",
    "cuda graph": "each step after the first replayed as one CUDA graph",
}


class StepPaths:
    """How a decoding's steps after the first run, and what has failed so far.

    Args:
        compiled: compile the steps with ``torch.compile`` (until a compilation fails).
        cuda_graphs: replay them as CUDA graphs where the model is on CUDA (until a capture
            fails).
        failed: called with the path (``"compiled"`` or ``"cuda graph"``) and the error when
            one fails; that path is not tried again.
    """

    def __init__(
        self, compiled: bool, cuda_graphs: bool, failed: Callable[[str, Exception], None]
    ) -> None:
        self.compiled, self.cuda_graphs, self.failed = compiled, cuda_graphs, failed

    def path(self, device: torch.device) -> str:
        """``"compiled"``, ``"cuda graph"`` or ``"eager"``: the path a step on ``device``
        takes now."""
        if self.compiled:
            return "compiled"
        return "cuda graph" if self.cuda_graphs and device.type == "cuda" else "eager"

    def why(self, device: torch.device) -> str:
        """The path of :meth:`path` in words, for the log."""
        path = self.path(device)
        if path != "eager":
            return WHY[path]
        if not self.cuda_graphs:
            return "each step run eagerly (CUDA graphs turned off)"
        return f"each step run eagerly (on {device.type}: CUDA graphs need CUDA)"

    def runner(self, step: StaticStep) -> Callable[[], Tensor]:
        """``step`` as the path of :meth:`path` runs it."""
        path = self.path(step.tokens.device)
        if path == "compiled":
            return CompiledStep(step, self._failed("compiled"))
        return CapturedStep(step, self._failed("cuda graph")) if path == "cuda graph" else step

    def _failed(self, path: str) -> Callable[[Exception], None]:
        def failed(error: Exception) -> None:
            if path == "compiled":
                self.compiled = False
            else:
                self.cuda_graphs = False
            self.failed(path, error)

        return failed


class StaticStep:
    """One decoding step as a function of fixed buffers, what a CUDA graph captures: the
    tokens (``tokens``, rows x 1, written before each call), the position (the cache's
    :class:`~recurnmt.modules.decoding.static_cache.StepPosition`, set before each call), the cache's
    buffers and the projected memory; returns the logits, rows x 1 x V. No Python number in
    it changes from step to step within a length bucket of the cache
    (tests/test_static_decoding.py records its operations)."""

    def __init__(self, decoder: DecodingSide, cache: StaticStackCache, rows: int):
        self.decoder, self.cache, self.rows = decoder, cache, rows
        position = cache.position
        self.tokens = torch.zeros(rows, 1, dtype=torch.long, device=position.index.device)
        self.positions = decoder.position_rows(position.capacity)  # capacity x C, or None

    def __call__(self) -> Tensor:
        positions = None
        if self.positions is not None:
            row = self.positions.index_select(0, self.cache.position.index)  # 1 x C
            positions = row.unsqueeze(0).expand(self.rows, 1, -1)
        x = self.decoder.embedded(self.tokens, positions)
        out = self.decoder.run(x, None, self.cache, self.decoder.hooks(positions))
        return self.decoder.logits(out.output)


def _run_step(step: StaticStep) -> Tensor:
    return step()


class CompiledStep:
    """A :class:`StaticStep` compiled by ``torch.compile`` (TorchInductor, dynamic shapes): on a
    CPU, where a step of a small model costs the host's dispatch of its operations more than
    their arithmetic, the step's elementwise operations, norms and softmaxes run as a few fused
    C++ kernels (docs/compiled_decoding.md). Every step reads the same kinds of tensors, so a
    decoding compiles a few times (the first shapes, then with symbolic sizes, then at the
    first bucket past :data:`~recurnmt.modules.decoding.static_cache.BUCKET`) and reuses the code after.
    A compilation that fails (no C++ compiler, an operation Inductor cannot lower) calls
    ``failed`` with the error and runs the step eagerly from then on (running it again is
    safe: a step writes its position's keys and values, the same ones again)."""

    def __init__(self, step: StaticStep, failed: Callable[[Exception], None]) -> None:
        self.step, self.failed = step, failed
        self.eager = False
        # one compiled function per model and beam (recurnmt/modules/decoding/compiled.py): a batch's
        # steps, and the next batches', reuse its compilations
        beam = step.decoder.memory.group
        self.compiled = compiled_decoding(step.decoder.stack, ("beam", beam), _run_step)

    def __call__(self) -> Tensor:
        if self.eager:
            return self.step()
        try:
            return self.compiled(self.step)
        except Exception as error:  # noqa: BLE001 (any failure to compile: eager, warned)
            self.eager = True
            self.failed(error)
            return self.step()


class CapturedStep:
    """A :class:`StaticStep` captured as a CUDA graph at the first call in each length bucket
    of its cache (:data:`~recurnmt.modules.decoding.static_cache.BUCKET` steps share one: attention's
    key length is the bucket's), after a warm-up run on a side stream, as torch's
    documentation asks (the warm-up writes the step's own position, with the same values the
    replay writes), and replayed at every call in that bucket. A capture that fails calls
    ``failed`` with the error and runs the step eagerly from then on."""

    def __init__(self, step: StaticStep, failed: Callable[[Exception], None]) -> None:
        self.step, self.failed = step, failed
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, Tensor]] = {}
        self.pool = None
        self.eager = False

    def __call__(self) -> Tensor:
        if self.eager:
            return self.step()
        bucket = self.step.cache.position.bucket
        if bucket not in self.graphs:
            try:
                stream = torch.cuda.Stream()
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):
                    self.step()
                torch.cuda.current_stream().wait_stream(stream)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self.pool):
                    logits = self.step()
                self.graphs[bucket] = graph, logits
                # one memory pool for the batch's graphs: they replay in the order they were
                # captured (a bucket's, then the next's), as torch's pool sharing asks
                self.pool = graph.pool()
            except RuntimeError as error:
                self.eager = True
                self.failed(error)
                return self.step()
        graph, logits = self.graphs[bucket]
        graph.replay()
        return logits
