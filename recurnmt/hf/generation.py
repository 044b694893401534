"""fairseq-generate's length limit for transformers' ``generate()``, and its self-speculative
greedy decoding and sampling (``generate(..., draft_levels=R, draft_tokens=K)``).

fairseq's ``SequenceGenerator`` decodes at most ``max_len`` tokens and then allows only
``</s>``, keeping that token's own log-probability in the hypothesis score. transformers'
``forced_eos_token_id`` instead gives ``</s>`` probability one, which changes the scores of
hypotheses that reach the limit and so the ranking of the beams. This processor does what
fairseq does.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor
from transformers import LogitsProcessor

from recurnmt.modules import ConfigError, Memory
from recurnmt.modules.decoding.exits import exits_of
from recurnmt.modules.decoding.options import AUTO, DecodingOptions
from recurnmt.modules.decoding.protocol import DecodingSide
from recurnmt.modules.decoding.rules import TokenRule, limit_lengths
from recurnmt.modules.decoding.speculative import SelfSpeculation, check_draft

logger = logging.getLogger(__name__)

# generation settings speculation honours; any other set away from its default is refused
SPECULATION_KEEPS = {
    "max_new_tokens", "max_length", "min_new_tokens", "do_sample", "temperature", "top_k",
    "top_p", "num_beams", "eos_token_id", "pad_token_id", "decoder_start_token_id",
    "attention_mask", "use_cache", "input_ids", "generator",
}  # fmt: skip


class EndAtMaxLength(LogitsProcessor):
    """At the last allowed step every token but ``</s>`` gets -inf; ``</s>`` keeps its score.

    Args:
        eos_token_id: ``</s>``.
        last_length: length of the decoder input (start token included) at which the last
            token is chosen.
    """

    def __init__(self, eos_token_id: int, last_length: int) -> None:
        self.eos = eos_token_id
        self.last_length = last_length

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        if input_ids.size(-1) < self.last_length:
            return scores
        keep = scores[:, self.eos].clone()
        scores = torch.full_like(scores, -float("inf"))
        scores[:, self.eos] = keep
        return scores


def decoding_options(
    kwargs: dict[str, Any], declared: type[DecodingOptions] = DecodingOptions
) -> DecodingOptions:
    """recurnmt's decoding options (``declared``' declarations) among ``generate()``'s
    keywords ``kwargs`` (taken out of it: transformers refuses keywords it does not know),
    named by their keywords (the options' names) in errors.

    Raises:
        ConfigError: impossible options, or an option ``generate()`` does not run.
    """
    names = [o.name for o in declared.declarations()]
    options = declared.from_texts({name: kwargs.pop(name) for name in names if name in kwargs})
    if options.static_decoding:
        raise ConfigError(
            "static_decoding", True, "not in generate() (transformers' beam search keeps its "
            "own shapes); fairseq-generate runs it",
        )  # fmt: skip
    if options.compile_decoding and not options.speculative:
        raise ConfigError(
            "compile_decoding", True, "generate() compiles speculation's passes: with {draft_levels}",
            {"draft_levels": options.draft_levels},
        )  # fmt: skip
    if options.draft_levels == AUTO:
        raise ConfigError("draft_levels", AUTO, "generate() takes a number of levels")
    return options


@contextmanager
def exiting(stack, options: DecodingOptions, head) -> Iterator[None]:
    """The decoder ``stack``'s rows exit early within, as ``options`` say (nothing without
    ``exit_test``); the log says how many levels they ran."""
    if options.exit_test is None:
        yield
        return
    levels = len(stack.active_levels)
    options.check_stack(levels, stack.halting is not None)
    exits = exits_of(options, levels, head)
    stack.set_exits(exits)
    try:
        yield
    finally:
        stack.set_exits(None)
    logger.info(exits.summary(levels))


def speculate(model, inputs, config, max_new: int, eos: int, options, kwargs) -> Tensor:
    """``generate()`` with drafts from the decoder's first ``options.draft_levels`` levels
    (:class:`~recurnmt.modules.decoding.options.DecodingOptions`): B x L ids (the start
    token, the tokens, padding after eos), greedy or sampled as ``config`` and ``kwargs``
    say.

    Raises:
        ValueError: a generation setting speculation does not honour, named.
    """
    settings = {**config.to_dict(), **kwargs}
    default = type(config)().to_dict()
    for name, value in kwargs.items():
        if name not in SPECULATION_KEEPS and value != default.get(name, None):
            raise ValueError(f"generate(draft_levels=...): {name}={value!r} is not supported")
    if kwargs.get("logits_processor"):
        raise ValueError("generate(draft_levels=...): logits_processor is not supported")
    levels, tokens = options.draft_levels, options.draft_tokens
    check_draft(model.decoder.stack, levels, tokens)
    beams = settings.get("num_beams") or 1
    if beams != 1:
        raise ValueError(f"generate(draft_levels=...): num_beams={beams}; greedy or do_sample")
    ids = inputs if inputs is not None else kwargs["input_ids"]
    mask = kwargs.get("attention_mask")
    memory = model.encoder(ids, mask).last_hidden_state
    pad_mask = ids.eq(model.config.pad_token_id)
    if mask is not None:
        pad_mask = pad_mask | ~mask.bool()
    min_new = settings.get("min_new_tokens") or 0
    pad = model.config.pad_token_id

    def adjust(lprobs: Tensor, step: int) -> None:  # as EndAtMaxLength, and min_new_tokens
        limit_lengths(lprobs, step, min_new, max_new - 1, eos)

    sampling = bool(settings.get("do_sample"))
    rule = TokenRule(
        adjust=adjust,
        sampling=sampling,
        temperature=float(settings.get("temperature") or 1.0) if sampling else 1.0,
        topk=int(settings.get("top_k") or 0) if sampling else 0,
        topp=float(settings.get("top_p") or 0.0)
        if sampling and settings.get("top_p", 1.0) < 1
        else 0.0,
    )
    memory = Memory(memory, pad_mask if bool(pad_mask.any()) else None)
    drafting = DecodingSide(model.decoder, memory, model.lm_head)
    start = settings.get("decoder_start_token_id")
    start = model.config.decoder_start_token_id if start is None else start
    prefix = ids.new_full((ids.size(0), 1), start)
    compiled = _compile_failed if options.compile_decoding else None
    decoded = SelfSpeculation(drafting, levels, tokens, rule, compiled).run(
        prefix, max_new - 1, eos, kwargs.get("generator")
    )
    model.last_speculation = decoded.stats  # acceptance and timing, for the caller's log
    width = 1 + max(t.numel() for t in decoded.tokens)
    out = ids.new_full((ids.size(0), width), pad)
    out[:, 0] = start
    for row, generated in enumerate(decoded.tokens):
        out[row, 1 : 1 + generated.numel()] = generated
    return out


def _compile_failed(error: Exception) -> None:
    first = str(error).strip().splitlines()[:1] or [type(error).__name__]
    logger.warning(f"compile_decoding: compiling a pass failed ({first[0]}); eager from now on")
