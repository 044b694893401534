"""Beam search over fixed shapes: ``fairseq-generate --task speculative_translation
--static-decoding``.

A beam-search step on a GPU is bound by the host's dispatch of small operations (docs/gpu.md);
the cure is to capture a step once (a CUDA graph) and replay it, which needs every tensor of
the step to keep its shape and its storage. fairseq's ``SequenceGenerator`` changes both: it
drops a sentence's rows from the batch when its beam has finished, and its caches grow and
move at every step. :class:`StaticSequenceGenerator` is its beam search with

* every row kept: the batch stays ``sentences x beam`` rows from the first step to the last; a
  finished sentence's rows go on being decoded and are ignored (their end-of-sentence
  candidates finalize nothing), where fairseq removes them;
* the decoder's state in a :class:`~recurnmt.modules.static_cache.StaticStackCache`: keys and
  values in buffers of the longest output's length, written at a position held on the
  device, read under a key mask, reordered in place; the encoder memory projected once per
  sentence (beam search's hypotheses read it as a group) and never selected again.

Its bookkeeping is fairseq's, line for line where rows are not dropped (the candidates, the
end-of-sentence rule, ``finalize_hypos``' scores and length penalty, the final sort), so its
hypotheses are fairseq's: the same tokens, scores equal to float rounding
(tests/test_static_decoding.py, every family). Every step after the first (which projects the
memory and folds the levels' weights) is one call of :class:`StaticStep`, a function of fixed
buffers; on CUDA it is captured as a CUDA graph once per batch and length bucket (32 steps)
and replayed (:class:`CapturedStep`), elsewhere it runs eagerly, and the log says which path
ran. (The capture has not run on a GPU yet: docs/gpu.md.) Eager on a CPU, the path costs more
than fairseq's (attention reads the masked positions of a length bucket, a finished sentence's
rows are still computed).

``--compile-decoding`` (which implies ``--static-decoding``) compiles the step with
``torch.compile`` instead (:class:`CompiledStep`): a function of fixed buffers is what
TorchInductor compiles once and reuses, and on a CPU, where a step of a small model at a small
batch costs the host's dispatch more than its arithmetic, its fused kernels decode sentence by
sentence faster than fairseq's own search (docs/compiled_decoding.md).

Settings fairseq's beam search has and this one does not (sampling, diverse beam search,
constraints, prefixes, n-gram blocking, a language model, alignment) are refused at once,
naming the flag.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import torch
from fairseq import search
from fairseq.sequence_generator import SequenceGenerator
from torch import Tensor

from recurnmt.modules.compile import compiled_decoding
from recurnmt.modules.side import DecodingSide
from recurnmt.modules.speculative import TokenRule
from recurnmt.modules.static_cache import BUCKET, StaticStackCache
from recurnmt.nmt.generation import (
    check_batch,
    check_generator,
    decoding_side,
    hypothesis,
    lprobs_adjustment,
    max_length,
)

logger = logging.getLogger(__name__)
WHAT, OPTION = "static-shape decoding", "--static-decoding"
COMPILE_OPTION = "--compile-decoding"
OTHER_SEARCHES = (
    "--sampling, --diverse-beam-groups, --diversity-rate, --constraints, --prefix-allowed-tokens"
)

Hypotheses = list[list[dict[str, Tensor]]]


class StaticSequenceGenerator(SequenceGenerator):
    """fairseq's ``SequenceGenerator`` (its constructor, its options, its hypotheses) whose beam
    search keeps every row and decodes with a static-shape cache (the module docstring).

    Raises:
        ValueError: a setting it cannot honour, naming its flag.
    """

    def __init__(
        self, models, tgt_dict, cuda_graphs: bool = True, compiled: bool = False, **kwargs
    ) -> None:
        super().__init__(models, tgt_dict, **kwargs)
        check_generator(self, models, WHAT, OPTION, (search.BeamSearch,), OTHER_SEARCHES)
        self.cuda_graphs, self.compiled = cuda_graphs, compiled
        self.path: str | None = None  # how the steps ran: "compiled", "cuda graph" or "eager"

    def _runner(self, step: StaticStep) -> Callable[[], Tensor]:
        """How this batch's steps after the first run: compiled by ``torch.compile`` where
        ``compiled`` (unless a compilation failed once), else replayed as a CUDA graph where
        the model is on CUDA (unless ``cuda_graphs`` is off or a capture failed once), else
        eagerly; the log says which, once."""
        device = step.tokens.device
        path = "cuda graph" if self.cuda_graphs and device.type == "cuda" else "eager"
        path = "compiled" if self.compiled else path
        if path != self.path:
            why = {
                "compiled": "each step after the first compiled by torch.compile (TorchInductor"
                "'s fused kernels; a few compilations in the first batches, at new shapes)",
                "cuda graph": "each step after the first replayed as one CUDA graph",
                "eager": f"each step run eagerly (on {device.type}: CUDA graphs need CUDA)",
            }
            if not self.cuda_graphs:
                why["eager"] = "each step run eagerly (CUDA graphs turned off)"
            logger.info(f"{WHAT}: every row kept, caches of fixed shape, {why[path]}")  # fmt: skip
            self.path = path
        if path == "compiled":
            return CompiledStep(step, self._compile_failed)
        return CapturedStep(step, self._capture_failed) if path == "cuda graph" else step

    def _capture_failed(self, error: Exception) -> None:
        logger.warning(
            f"{WHAT}: capturing a step as a CUDA graph failed ({error}); eager from now on"
        )
        self.cuda_graphs = False

    def _compile_failed(self, error: Exception) -> None:
        first = str(error).strip().splitlines()[:1] or [type(error).__name__]
        logger.warning(f"{COMPILE_OPTION}: compiling a step failed ({first[0]}); eager from now on")
        self.compiled = False

    @torch.no_grad()
    def _generate(
        self,
        sample: dict[str, dict[str, Tensor]],
        prefix_tokens: Tensor | None = None,
        constraints: Tensor | None = None,
        bos_token: int | None = None,
    ) -> Hypotheses:
        check_batch(WHAT, OPTION, prefix_tokens, constraints)
        net_input = sample["net_input"]
        src_tokens = net_input["src_tokens"]
        bsz, src_len = src_tokens.shape[:2]
        beam, device = self.beam_size, src_tokens.device
        max_len = max_length(self, src_len)
        (encoder_out,) = self.model.forward_encoder(net_input)
        # the encoder's rows, one per sentence: the beam's hypotheses read them as a group
        decoder = decoding_side(self.model.models[0].decoder, encoder_out, group=beam)
        capacity = max_len + 1
        if self.compiled:  # a multiple of the length bucket: one batch's shapes as another's
            capacity = -(-capacity // BUCKET) * BUCKET
        cache = StaticStackCache(capacity, device)
        step_fn = StaticStep(decoder, cache, bsz * beam)
        run = self._runner(step_fn)
        rule = TokenRule(adjust=lprobs_adjustment(self, max_len), temperature=self.temperature)
        state = _Beams(self, bsz, max_len, src_tokens, bos_token)
        ids = sample.get("id")
        original = ids if isinstance(ids, Tensor) else torch.arange(bsz, device=device)
        for step in range(max_len + 1):  # one step more for the end of sentence
            cache.set_position(step)
            step_fn.tokens.copy_(state.tokens[:, step : step + 1])
            # the first step projects the memory and folds the levels' weights: never captured
            logits = step_fn() if step == 0 else run()
            lprobs = rule.lprobs(logits, step)  # rows x 1 x V
            candidates = self.search.step(
                step,
                lprobs.view(bsz, beam, -1),
                state.scores.view(bsz, beam, -1)[:, :, :step],
                state.tokens[:, : step + 1],
                original,
            )
            order = state.advance(step, *candidates)
            if order is None:
                break
            cache.reorder(order)
        return state.sorted()


class StaticStep:
    """One decoding step as a function of fixed buffers, what a CUDA graph captures: the
    tokens (``tokens``, rows x 1, written before each call), the position (the cache's
    :class:`~recurnmt.modules.static_cache.StepPosition`, set before each call), the cache's
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
    first bucket past :data:`~recurnmt.modules.static_cache.BUCKET`) and reuses the code after.
    A compilation that fails (no C++ compiler, an operation Inductor cannot lower) calls
    ``failed`` with the error and runs the step eagerly from then on (running it again is
    safe: a step writes its position's keys and values, the same ones again)."""

    def __init__(self, step: StaticStep, failed: Callable[[Exception], None]) -> None:
        self.step, self.failed = step, failed
        self.eager = False
        # one compiled function per model and beam (recurnmt/modules/compile.py): a batch's
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
    of its cache (:data:`~recurnmt.modules.static_cache.BUCKET` steps share one: attention's
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


class _Beams:
    """The hypotheses of one batch at fixed shape: fairseq's ``SequenceGenerator`` bookkeeping
    (``_generate`` and ``finalize_hypos``, fairseq 0.12) with no row ever removed."""

    def __init__(self, generator: SequenceGenerator, bsz: int, max_len: int, src_tokens, bos):
        self.g, self.bsz, self.beam, self.max_len = generator, bsz, generator.beam_size, max_len
        rows, device = bsz * self.beam, src_tokens.device
        self.tokens = src_tokens.new_full((rows, max_len + 2), generator.pad)
        self.tokens[:, 0] = generator.eos if bos is None else bos
        self.scores = torch.zeros(rows, max_len + 1, device=device)
        self.ignore = torch.zeros(bsz, self.beam, dtype=torch.bool, device=device)
        self.done = torch.zeros(bsz, 1, dtype=torch.bool, device=device)  # finished sentences
        self.finished = [False] * bsz
        self.remaining = bsz
        self.finalized: Hypotheses = [[] for _ in range(bsz)]
        self.offsets = torch.arange(bsz, device=device).unsqueeze(1) * self.beam
        self.cand_offsets = torch.arange(2 * self.beam, device=device)

    def advance(
        self, step: int, cand_scores: Tensor, cand_indices: Tensor, cand_beams: Tensor
    ) -> Tensor | None:
        """Finalizes the hypotheses that end at ``step`` and keeps ``beam`` active ones per
        sentence; returns the rows the next step continues (None: every sentence finished)."""
        beam, eos, cand_size = self.beam, self.g.eos, 2 * self.beam
        cand_bbsz = cand_beams + self.offsets
        eos_mask = cand_indices.eq(eos) & cand_scores.ne(-math.inf)
        eos_mask[:, :beam].masked_fill_(self.ignore, False)
        # a finished sentence's rows go on and finish nothing (fairseq's finalize would
        # ignore them too: this spares the host its work)
        eos_mask &= ~self.done
        eos_bbsz = torch.masked_select(cand_bbsz[:, :beam], mask=eos_mask[:, :beam])
        if eos_bbsz.numel() > 0:
            eos_scores = torch.masked_select(cand_scores[:, :beam], mask=eos_mask[:, :beam])
            newly = self._finalize(step, eos_bbsz, eos_scores)
            self.remaining -= len(newly)
            for s in newly:  # a view each: no index tensor made on the host
                self.done[s].fill_(True)
        if self.remaining == 0:
            return None
        if step >= self.max_len:
            raise AssertionError(f"{step} < {self.max_len}")  # fairseq's own check
        eos_mask[:, :beam] = ~((~self.ignore) & (~eos_mask[:, :beam]))
        active_mask = eos_mask.to(self.cand_offsets.dtype) * cand_size + self.cand_offsets
        new_ignore, active = torch.topk(active_mask, k=beam, dim=1, largest=False)
        self.ignore = new_ignore.ge(cand_size)[:, :beam]
        order = torch.gather(cand_bbsz, 1, active).view(-1)
        tokens, scores = self.tokens, self.scores
        tokens[:, : step + 1] = tokens[:, : step + 1].index_select(0, order)
        tokens.view(self.bsz, beam, -1)[:, :, step + 1] = torch.gather(cand_indices, 1, active)
        if step > 0:
            scores[:, :step] = scores[:, :step].index_select(0, order)
        scores.view(self.bsz, beam, -1)[:, :, step] = torch.gather(cand_scores, 1, active)
        return order

    def _finalize(self, step: int, bbsz: Tensor, eos_scores: Tensor) -> list[int]:
        """fairseq's ``finalize_hypos`` where row r is always sentence r // beam."""
        g, beam = self.g, self.beam
        tokens = self.tokens.index_select(0, bbsz)[:, 1 : step + 2]
        tokens[:, step] = g.eos
        pos_scores = self.scores.index_select(0, bbsz)[:, : step + 1]
        pos_scores[:, step] = eos_scores
        pos_scores[:, 1:] = pos_scores[:, 1:] - pos_scores[:, :-1]
        if g.normalize_scores:
            eos_scores /= (step + 1) ** g.len_penalty
        sentences = torch.div(bbsz, beam, rounding_mode="trunc").tolist()
        for i, s in enumerate(sentences):
            if len(self.finalized[s]) < beam:
                self.finalized[s].append(hypothesis(tokens[i], eos_scores[i], pos_scores[i]))
        newly = []
        for s in sorted(set(sentences)):
            if not self.finished[s] and g.is_finished(
                step, s, self.max_len, len(self.finalized[s]), beam
            ):
                self.finished[s] = True
                newly.append(s)
        return newly

    def sorted(self) -> Hypotheses:
        """Each sentence's hypotheses, best first (fairseq's sort)."""
        for s, hypos in enumerate(self.finalized):
            scores = torch.tensor([float(h["score"].item()) for h in hypos])
            _, order = torch.sort(scores, descending=True)
            self.finalized[s] = [hypos[i] for i in order]
        return self.finalized


__all__ = ["StaticSequenceGenerator"]
