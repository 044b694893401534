"""Self-speculative decoding in ``fairseq-generate`` and ``fairseq-interactive``.

``--task speculative_translation --draft-levels R --draft-tokens K`` (with ``--beam 1``, greedy
or ``--sampling``) decodes a recurnmt model with drafts from its own first R decoder levels
(:mod:`recurnmt.modules.decoding.speculative`): greedy output token for token the plain decoding's,
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
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from fairseq import search
from fairseq.sequence_generator import SequenceGenerator
from fairseq.tasks import register_task
from fairseq.tasks.translation import TranslationConfig, TranslationTask
from torch import Tensor

from recurnmt.flags import spell
from recurnmt.modules.decoding.exits import exits_of
from recurnmt.modules.decoding.options import AUTO, DecodingOptions
from recurnmt.modules.decoding.rules import TokenRule
from recurnmt.modules.decoding.speculative import (
    SelfSpeculation,
    Statistics,
    check_draft,
    fastest_draft,
)
from recurnmt.modules.errors import ConfigError
from recurnmt.nmt.flags import fairseq_config, flags_of_fields
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
        with flag_names():
            check_draft(self.stack, draft_levels, draft_tokens)
        self.auto = draft_levels == AUTO
        self.draft_levels = 0 if self.auto else int(draft_levels)
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
        best, times = fastest_draft(
            lambda levels: self._speculate(model, encoder_out, rule, prefix, max_len, levels),
            self.stack.num_levels,
        )
        spent = ", ".join(f"{r or 'no draft'}: {t:.2f} s" for r, t in times.items())
        choice = f"{best} levels" if best else "no draft"
        logger.info(f"--draft-levels auto: {choice} (the first batch with each: {spent})")
        return best


def _check_beam(beam: int) -> None:
    if beam != 1:
        raise ValueError(
            f"--beam {beam}: speculative decoding decodes greedily or samples "
            "(--beam 1); see docs/speculative.md for beam search"
        )


def flags(options: type[DecodingOptions] = DecodingOptions) -> dict[str, str]:
    """``{option: flag}``: the decoding options (``options``' declarations) by fairseq's
    spelling. The task's fields are the declarations (:func:`task_config`), and fairseq
    spells a field's flag by the rule (:func:`~recurnmt.flags.spell`)."""
    return {o.name: spell(o) for o in options.declarations()}


FLAGS = flags()


@contextmanager
def flag_names(options: type[DecodingOptions] = DecodingOptions) -> Iterator[None]:
    """A :class:`ConfigError` of the decoding options (or of the decoder's options they name)
    raised within, renamed to fairseq's flags."""
    try:
        yield
    except ConfigError as error:
        raise error.renamed({**flags_of_fields("decoder"), **flags(options)}) from None


def task_options(cfg: Any, options: type[DecodingOptions] = DecodingOptions) -> DecodingOptions:
    """The decoding options (``options``' declarations) of the task's configuration ``cfg``.

    Raises:
        ConfigError: impossible options, named by their flags.
    """
    with flag_names(options):
        return options.from_texts({o.name: getattr(cfg, o.dest) for o in options.declarations()})


def check_decoding_options(
    cfg: Any, beam: int, print_alignment: Any = None, decoder_stacks: Sequence = ()
) -> None:
    """Refuses, naming the flag, what the task's decoding options (``cfg``: the task's
    configuration) cannot do with the generation settings and the models' decoder stacks
    (the stacks that fairseq's commands check before they read data; none: not known yet).

    Raises:
        ValueError: naming the flag.
    """
    options = task_options(cfg)
    if options.asked is None:
        return
    if print_alignment:
        raise ValueError(f"--print-alignment: not with {FLAGS[options.asked]}")
    if options.speculative:
        _check_beam(beam)
    if options.speculative or options.exit_test is not None:
        with flag_names():
            for stack in decoder_stacks:
                options.check_stack(len(stack.active_levels), stack.halting is not None)


def task_config(
    options: type[DecodingOptions] = DecodingOptions, name: str = "SpeculativeTranslationConfig"
) -> type:
    """fairseq's translation task configuration with the decoding options (``options``'
    declarations) as fields: their defaults and help; their flags are fairseq's spelling of
    the fields' names (:func:`flags`)."""
    return fairseq_config(name, options.declarations(), TranslationConfig)


SpeculativeTranslationConfig = task_config()


@register_task(TASK, dataclass=SpeculativeTranslationConfig)
class SpeculativeTranslationTask(TranslationTask):
    """fairseq's ``translation`` task whose generator drafts with the model's own first levels
    when ``--draft-levels`` is given (:class:`SpeculativeSequenceGenerator`), or runs beam
    search over fixed shapes with ``--static-decoding``
    (:class:`~recurnmt.nmt.static_decoding.StaticSequenceGenerator`)."""

    def build_generator(self, models, args, seq_gen_cls=None, extra_gen_cls_kwargs=None, **kwargs):
        options = task_options(self.cfg)
        levels, compiled, static = options.draft_levels, options.compile_decoding, options.static
        if options.asked is None or getattr(args, "score_reference", False):
            return super().build_generator(
                models, args, seq_gen_cls, extra_gen_cls_kwargs, **kwargs
            )
        check_decoding_options(
            self.cfg, getattr(args, "beam", 1), getattr(args, "print_alignment", False)
        )
        if options.exit_test is not None:
            return self._exiting_generator(models, args, options, seq_gen_cls,
                                           extra_gen_cls_kwargs, **kwargs)  # fmt: skip
        if static:
            from recurnmt.nmt.static_decoding import StaticSequenceGenerator

            extra = {**(extra_gen_cls_kwargs or {}), "compiled": compiled}
            return super().build_generator(models, args, StaticSequenceGenerator, extra, **kwargs)
        extra = {
            **(extra_gen_cls_kwargs or {}),
            "draft_levels": levels,
            "draft_tokens": options.draft_tokens,
            "compiled": compiled,
        }
        generator = super().build_generator(
            models, args, SpeculativeSequenceGenerator, extra, **kwargs
        )
        atexit.register(generator.log_summary)  # the run's acceptance, when the command ends
        return generator

    def _exiting_generator(self, models, args, options, seq_gen_cls, extra, **kwargs):
        """fairseq's own generator over decoders whose rows exit early
        (:mod:`~recurnmt.modules.decoding.exits`): every search fairseq runs (beam, greedy,
        sampling, ``fairseq-interactive``)."""
        for exits, levels in set_exits(models, options):
            atexit.register(_log_exits, exits, levels)
        return super().build_generator(models, args, seq_gen_cls, extra, **kwargs)


def set_exits(models: Sequence, options: DecodingOptions) -> list[tuple[Any, int]]:
    """Every model's decoder exits as ``options`` say from now on; returns each decoder's
    exits and levels (for the log).

    Raises:
        ValueError: a model that cannot exit (fairseq's own, ACT), naming the flag.
    """
    made = []
    with flag_names():
        for model in models:
            stack = getattr(model.decoder, "stack", None)
            if stack is None:
                raise ConfigError(
                    "exit_test", options.exit_test, f"{type(model).__name__} is not a recurnmt "
                    "model (its decoder has no level loop to leave)",
                )  # fmt: skip
            levels = len(stack.active_levels)
            options.check_stack(levels, stack.halting is not None)
            exits = exits_of(options, levels, model.decoder.output_layer)
            stack.set_exits(exits)
            made.append((exits, levels))
    return made


def _log_exits(exits, num_levels: int) -> None:
    if exits.rows:
        logger.info(exits.summary(num_levels))


__all__ = [
    "TASK",
    "SpeculativeSequenceGenerator",
    "SpeculativeTranslationTask",
    "check_decoding_options",
    "set_exits",
]
