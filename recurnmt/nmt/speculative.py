"""Self-speculative decoding in ``fairseq-generate`` and ``fairseq-interactive``.

``--task speculative_translation --draft-levels R --draft-tokens K`` (with ``--beam 1``, greedy
or ``--sampling``) decodes a recurnmt model with drafts from its own first R decoder levels
(:mod:`recurnmt.modules.speculative`): greedy output token for token the plain decoding's,
samples distributed as the plain sampler's. ``--draft-levels 0`` runs the same loop without
drafts (the full model one token at a time: fairseq's greedy search and sampler without their
beam bookkeeping); ``--draft-levels auto`` times every R from 0 on the first batch and keeps the
fastest. The task is fairseq's ``translation`` with those two options; every
other option of ``fairseq-generate`` keeps its meaning (``--max-len-a/b``, ``--min-len``,
``--unkpen``, ``--lenpen``, ``--temperature``, ``--sampling-topk/-topp``), and a setting
speculation cannot honour is refused at once, naming its flag. The log says how many drafts each
verification accepted and what drafting and verifying took.

The same task's ``--static-decoding`` runs beam search over fixed shapes instead, and
``--compile-decoding`` the same with each step compiled by ``torch.compile``
(:mod:`recurnmt.nmt.static_decoding`): the plugin's decoding options live in one task.
"""

from __future__ import annotations

import atexit
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from fairseq import search
from fairseq.sequence_generator import SequenceGenerator
from fairseq.tasks import register_task
from fairseq.tasks.translation import TranslationConfig, TranslationTask
from torch import Tensor

from recurnmt.modules.speculative import (
    SelfSpeculation,
    Statistics,
    TokenRule,
    check_draft,
)
from recurnmt.nmt.generation import (
    check_batch,
    check_generator,
    decoding_side,
    hypothesis,
    lprobs_adjustment,
    max_length,
)

logger = logging.getLogger(__name__)
TASK = "speculative_translation"


class SpeculativeSequenceGenerator(SequenceGenerator):
    """fairseq's ``SequenceGenerator`` (its constructor, its hypotheses) whose greedy and
    sampled decoding is self-speculative.

    Args:
        draft_levels: the levels the draft runs (1 .. N-1; 0: no draft), or ``"auto"``.
        draft_tokens: tokens drafted per verification (>= 1).
        compiled: the passes compiled by ``torch.compile`` (``--compile-decoding``; eager,
            with a warning, from a failure to compile on).
        models, tgt_dict, **kwargs: as fairseq's ``SequenceGenerator``.

    Raises:
        ValueError: a setting speculation cannot honour, naming its flag.
    """

    def __init__(
        self, models, tgt_dict, draft_levels, draft_tokens: int = 4, compiled: bool = False,
        **kwargs,
    ) -> None:  # fmt: skip
        super().__init__(models, tgt_dict, **kwargs)
        self.compiled = compiled
        what = "speculative decoding"
        others = "--diverse-beam-groups, --diversity-rate, --constraints, --prefix-allowed-tokens"
        searches = (search.BeamSearch, search.Sampling)
        decoder = check_generator(self, models, what, "--draft-levels", searches, others)
        _check_beam(self.beam_size)
        self.stack = decoder.stack
        self.auto = draft_levels == "auto"
        self.draft_levels = 0 if self.auto else _levels(draft_levels)
        _check_draft(self.stack, draft_levels, draft_tokens)
        self.draft_tokens = draft_tokens
        sampling = isinstance(self.search, search.Sampling)
        self.rule_settings = dict(
            sampling=sampling,
            temperature=self.temperature,
            topk=max(getattr(self.search, "sampling_topk", -1), 0) if sampling else 0,
            topp=max(getattr(self.search, "sampling_topp", -1.0), 0.0) if sampling else 0.0,
        )
        self.stats = Statistics()
        self.batches = 0
        if compiled:
            logger.info(
                "--compile-decoding: the draft passes and verifications compiled by "
                "torch.compile over a static-shape cache, from each batch's second verification"
            )

    def log_summary(self) -> None:
        if self.stats.verifications:
            tokens = self.draft_tokens if self.draft_levels else 0
            passes = "compiled" if self.compiled else "eager"
            logger.info(f"draft levels {self.draft_levels}, tokens {tokens}, {passes} passes: "
                        + self.stats.summary())  # fmt: skip

    @torch.no_grad()
    def _generate(
        self,
        sample: dict[str, dict[str, Tensor]],
        prefix_tokens: Tensor | None = None,
        constraints: Tensor | None = None,
        bos_token: int | None = None,
    ) -> list[list[dict[str, Tensor]]]:
        check_batch("speculative decoding", "--draft-levels", prefix_tokens, constraints)
        net_input = sample["net_input"]
        src_tokens = net_input["src_tokens"]
        bsz, src_len = src_tokens.shape[:2]
        max_len = max_length(self, src_len)
        (encoder_out,) = self.model.forward_encoder(net_input)
        prefix = src_tokens.new_full((bsz, 1), self.eos if bos_token is None else bos_token)
        # fairseq's adjustment is the same at every step from --min-len to the maximum length
        steady = range(self.min_len, max_len)
        rule = TokenRule(
            adjust=lprobs_adjustment(self, max_len), steady=steady, **self.rule_settings
        )
        model = self.model.models[0]
        if self.auto:
            self.draft_levels = self._calibrate(sample, model, encoder_out, rule, prefix, max_len)
            self.auto = False
        decoded = self._speculate(model, encoder_out, rule, prefix, max_len, self.draft_levels)
        self.stats.add(decoded.stats)
        self.batches += 1
        logger.debug(decoded.stats.summary())
        hypos = []
        for tokens, scores in zip(decoded.tokens, decoded.scores, strict=True):
            score = scores.sum()
            if self.normalize_scores:
                score = score / tokens.numel() ** self.len_penalty
            hypos.append([hypothesis(tokens, score, scores)])
        return hypos

    def _speculate(self, model, encoder_out, rule, prefix, max_len, levels):
        drafting = decoding_side(model.decoder, encoder_out)
        failed = self._compile_failed if self.compiled else None
        speculation = SelfSpeculation(drafting, levels, self.draft_tokens, rule, compiled=failed)
        return speculation.run(prefix, max_len, self.eos)

    def _compile_failed(self, error: Exception) -> None:
        first = str(error).strip().splitlines()[:1] or [type(error).__name__]
        logger.warning(
            f"--compile-decoding: compiling a pass failed ({first[0]}); eager from now on"
        )
        self.compiled = False

    def _calibrate(self, sample, model, encoder_out, rule, prefix, max_len) -> int:
        """``--draft-levels auto``: the draft depth that decodes the first batch fastest, or 0
        where decoding without drafts is faster still (then no batch speculates: in a large
        batch, which advances by its rows' smallest acceptance, or where the draft is poor)."""
        times = {}
        for levels in range(self.stack.num_levels):
            start = time.perf_counter()
            self._speculate(model, encoder_out, rule, prefix, max_len, levels)
            times[levels] = time.perf_counter() - start
        best = min(times, key=times.get)
        spent = ", ".join(f"{r or 'no draft'}: {t:.2f} s" for r, t in times.items())
        choice = f"{best} levels" if best else "no draft"
        logger.info(f"--draft-levels auto: {choice} (the first batch with each: {spent})")
        return best


def _levels(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValueError(f"--draft-levels {value!r}: a number of levels, or auto") from None


def _check_beam(beam: int) -> None:
    if beam != 1:
        raise ValueError(
            f"--beam {beam}: speculative decoding decodes greedily or samples "
            "(--beam 1); see docs/speculative.md for beam search"
        )


def _check_draft(stack, draft_levels: Any, draft_tokens: int) -> None:
    """The draft ``--draft-levels`` (a number or ``auto``) asks of the decoder ``stack``."""
    auto = draft_levels == "auto"
    check_draft(stack, 0 if auto else _levels(draft_levels), draft_tokens)
    n = stack.num_levels
    if auto and n < 2:
        raise ValueError(f"--draft-levels auto: the decoder has {n} level, nothing to draft")


def check_decoding_options(
    cfg: Any, beam: int, print_alignment: Any = None, decoder_stacks: Sequence = ()
) -> None:
    """Refuses, naming the flag, what the task's decoding options (``cfg``: the task's
    configuration) cannot do with the generation settings and the models' decoder stacks
    (the stacks that fairseq's commands check before they read data; none: not known yet).

    Raises:
        ValueError: naming the flag.
    """
    levels, compiled = cfg.draft_levels, cfg.compile_decoding
    if cfg.static_decoding and levels is not None:
        raise ValueError("--static-decoding: not with --draft-levels (beam search or drafts)")
    if levels is None and not (cfg.static_decoding or compiled):
        return
    option = "--draft-levels" if levels is not None else (
        "--compile-decoding" if compiled else "--static-decoding")  # fmt: skip
    if print_alignment:
        raise ValueError(f"--print-alignment: not with {option}")
    if levels is None:
        return
    if levels != "auto":
        _levels(levels)
    _check_beam(beam)
    for stack in decoder_stacks:
        _check_draft(stack, levels, cfg.draft_tokens)


@dataclass
class SpeculativeTranslationConfig(TranslationConfig):
    # typing.Optional, not "str | None": fairseq reads these types to build its parser, and the
    # module's postponed annotations would hand it strings (__annotations__ set below)
    draft_levels: Optional[str] = field(  # noqa: UP045
        default=None,
        metadata={
            "help": "decode with drafts from the decoder's first R levels (1 .. N-1; 0: no "
            "draft, recurnmt's own loop; auto: the fastest R on the first batch); greedy "
            "(--beam 1) or --sampling"
        },
    )
    draft_tokens: int = field(default=4, metadata={"help": "tokens drafted per verification"})
    static_decoding: bool = field(
        default=False,
        metadata={
            "help": "beam search over fixed shapes: every row kept, the decoder's keys and "
            "values in buffers of the longest output, reordered in place (what a captured "
            "CUDA graph step needs); outputs equal fairseq's beam search"
        },
    )
    compile_decoding: bool = field(
        default=False,
        metadata={
            "help": "--static-decoding with each step compiled by torch.compile "
            "(TorchInductor's fused kernels; a C++ compiler on a CPU): faster sentence by "
            "sentence on a CPU; eager, with a warning, where compiling fails"
        },
    )


_TYPES = (
    ("draft_levels", Optional[str]),  # noqa: UP045
    ("draft_tokens", int),
    ("static_decoding", bool),
    ("compile_decoding", bool),
)
for _name, _type in _TYPES:
    SpeculativeTranslationConfig.__dataclass_fields__[_name].type = _type


@register_task(TASK, dataclass=SpeculativeTranslationConfig)
class SpeculativeTranslationTask(TranslationTask):
    """fairseq's ``translation`` task whose generator drafts with the model's own first levels
    when ``--draft-levels`` is given (:class:`SpeculativeSequenceGenerator`), or runs beam
    search over fixed shapes with ``--static-decoding``
    (:class:`~recurnmt.nmt.static_decoding.StaticSequenceGenerator`)."""

    def build_generator(self, models, args, seq_gen_cls=None, extra_gen_cls_kwargs=None, **kwargs):
        levels, compiled = self.cfg.draft_levels, self.cfg.compile_decoding
        static = self.cfg.static_decoding or (compiled and levels is None)
        if (levels is None and not static) or getattr(args, "score_reference", False):
            return super().build_generator(
                models, args, seq_gen_cls, extra_gen_cls_kwargs, **kwargs
            )
        check_decoding_options(
            self.cfg, getattr(args, "beam", 1), getattr(args, "print_alignment", False)
        )
        if static:
            from recurnmt.nmt.static_decoding import StaticSequenceGenerator

            extra = {**(extra_gen_cls_kwargs or {}), "compiled": compiled}
            return super().build_generator(models, args, StaticSequenceGenerator, extra, **kwargs)
        extra = {
            **(extra_gen_cls_kwargs or {}),
            "draft_levels": levels,
            "draft_tokens": self.cfg.draft_tokens,
            "compiled": compiled,
        }
        generator = super().build_generator(
            models, args, SpeculativeSequenceGenerator, extra, **kwargs
        )
        atexit.register(generator.log_summary)  # the run's acceptance, when the command ends
        return generator


__all__ = [
    "TASK",
    "SpeculativeSequenceGenerator",
    "SpeculativeTranslationTask",
    "check_decoding_options",
]
