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
* the decoder's state in a :class:`~recurnmt.modules.decoding.static_cache.StaticStackCache`: keys and
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

from recurnmt.modules.decoding.rules import TokenRule
from recurnmt.modules.decoding.static_cache import BUCKET, StaticStackCache
from recurnmt.modules.decoding.static_steps import StaticStep, StepPaths
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
        self.paths = StepPaths(compiled, cuda_graphs, self._failed)
        self.path: str | None = None  # how the steps ran: "compiled", "cuda graph" or "eager"

    @property
    def compiled(self) -> bool:
        """Whether the steps are compiled (until a compilation fails)."""
        return self.paths.compiled

    @property
    def cuda_graphs(self) -> bool:
        """Whether the steps are replayed as CUDA graphs on CUDA (until a capture fails)."""
        return self.paths.cuda_graphs

    def _failed(self, path: str, error: Exception) -> None:
        if path == "compiled":
            first = str(error).strip().splitlines()[:1] or [type(error).__name__]
            logger.warning(
                f"{COMPILE_OPTION}: compiling a step failed ({first[0]}); eager from now on"
            )
        else:
            logger.warning(
                f"{WHAT}: capturing a step as a CUDA graph failed ({error}); eager from now on"
            )

    def _runner(self, step: StaticStep) -> Callable[[], Tensor]:
        """How this batch's steps after the first run (:class:`StepPaths`); the log says
        which, once."""
        device = step.tokens.device
        path = self.paths.path(device)
        if path != self.path:
            logger.info(f"{WHAT}: every row kept, caches of fixed shape, {self.paths.why(device)}")
            self.path = path
        return self.paths.runner(step)

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
        if self.paths.compiled:  # a multiple of the length bucket: one batch's shapes as another's
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
