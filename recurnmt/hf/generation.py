"""fairseq-generate's length limit for transformers' ``generate()``, and its self-speculative
greedy decoding and sampling (``generate(..., draft_levels=R, draft_tokens=K)``).

fairseq's ``SequenceGenerator`` decodes at most ``max_len`` tokens and then allows only
``</s>``, keeping that token's own log-probability in the hypothesis score. transformers'
``forced_eos_token_id`` instead gives ``</s>`` probability one, which changes the scores of
hypotheses that reach the limit and so the ranking of the beams. This processor does what
fairseq does.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from transformers import LogitsProcessor

from recurnmt.modules import Memory
from recurnmt.modules.side import DecodingSide
from recurnmt.modules.speculative import SelfSpeculation, TokenRule, check_draft

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


def speculate(model, inputs, config, max_new: int, eos: int, levels, tokens, kwargs) -> Tensor:
    """``generate()`` with drafts from the decoder's first ``levels`` levels: B x L ids
    (the start token, the tokens, padding after eos), greedy or sampled as ``config`` and
    ``kwargs`` say.

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
    check_draft(model.decoder.stack, levels, tokens, ("draft_levels", "draft_tokens"))
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
        early = min(min_new - step, lprobs.size(1))
        if early > 0:
            lprobs.narrow(1, 0, early).select(-1, eos).fill_(-math.inf)
        last = max(max_new - 1 - step, 0)
        if last < lprobs.size(1):
            forced = lprobs.narrow(1, last, lprobs.size(1) - last)
            forced.narrow(-1, 0, eos).fill_(-math.inf)
            forced.narrow(-1, eos + 1, forced.size(-1) - eos - 1).fill_(-math.inf)

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
    decoded = SelfSpeculation(drafting, levels, tokens, rule).run(
        prefix, max_new - 1, eos, kwargs.get("generator")
    )
    model.last_speculation = decoded.stats  # acceptance and timing, for the caller's log
    width = 1 + max(t.numel() for t in decoded.tokens)
    out = ids.new_full((ids.size(0), width), pad)
    out[:, 0] = start
    for row, generated in enumerate(decoded.tokens):
        out[row, 1 : 1 + generated.numel()] = generated
    return out
