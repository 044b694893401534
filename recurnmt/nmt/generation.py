"""What recurnmt's generators take from fairseq's ``SequenceGenerator``, said once.

Two generators decode recurnmt models in ``fairseq-generate`` beside fairseq's own: the
self-speculative one (:mod:`recurnmt.nmt.speculative`) and the static-shape beam search
(:mod:`recurnmt.nmt.static_decoding`). Both subclass ``SequenceGenerator`` (its constructor,
its options, its hypotheses' format) and must give its output; this module holds what they
share: its changes to a step's log-probabilities, the settings neither honours, the
hypothesis it returns, and the decoder as both step it (:func:`decoding_side`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from fairseq.sequence_generator import SequenceGenerator
from torch import Tensor

from recurnmt.modules import Memory
from recurnmt.modules.decoding.protocol import DecodingSide
from recurnmt.modules.decoding.rules import limit_lengths
from recurnmt.nmt.decoder import RecurrentDecoder


def lprobs_adjustment(generator: SequenceGenerator, max_len: int) -> Callable[[Tensor, int], None]:
    """fairseq's changes to the log-probabilities at a step (``SequenceGenerator._generate``):
    no pad, the unk penalty, the suppressed tokens, eos forbidden before ``--min-len`` and
    forced at the maximum length. The function takes B x T x V log-probabilities for the steps
    ``step`` .. ``step + T - 1`` and changes them in place."""
    pad, unk, eos, min_len = generator.pad, generator.unk, generator.eos, generator.min_len
    unk_penalty, suppressed = generator.unk_penalty, generator.token_indices_to_suppress

    def adjust(lprobs: Tensor, step: int) -> None:
        # views and fill_, not indexing with a Python number (which makes a host tensor)
        lprobs.masked_fill_(lprobs.isnan(), -math.inf)
        lprobs.select(-1, pad).fill_(-math.inf)
        lprobs.select(-1, unk).sub_(unk_penalty)
        if suppressed is not None:  # --tokens-to-suppress
            lprobs.index_fill_(-1, suppressed.to(lprobs.device), -math.inf)
        limit_lengths(lprobs, step, min_len, max_len, eos)

    return adjust


def check_generator(
    generator: SequenceGenerator,
    models,
    what: str,
    option: str,
    searches: tuple[type, ...],
    other_searches: str,
) -> RecurrentDecoder:
    """Refuses, naming the flag, what ``what`` (a recurnmt generator, asked for by ``option``)
    cannot honour: more than one model, a decoder that is not recurnmt's, a search outside
    ``searches`` (the search classes it runs; ``other_searches``: the flags that ask for others),
    and the options of fairseq's search it does not implement. Returns the model's decoder."""
    if len(models) != 1:
        raise ValueError(f"--path: {what} runs one model, not {len(models)}")
    decoder = models[0].decoder
    if not isinstance(decoder, RecurrentDecoder):
        raise ValueError(
            f"{option}: {what} decodes recurnmt's decoders; this model's decoder is a "
            f"{type(decoder).__name__}"
        )
    refused = {
        other_searches: type(generator.search) not in searches,
        "--no-repeat-ngram-size": generator.repeat_ngram_blocker is not None,
        "--match-source-len": generator.match_source_len,
        "--lm-path": generator.lm_model is not None,
    }
    for flag, bad in refused.items():
        if bad:
            raise ValueError(f"{flag}: not with {what} ({option})")
    return decoder


def check_batch(what: str, option: str, prefix_tokens, constraints) -> None:
    """Refuses what ``SequenceGenerator.generate`` may hand a batch and ``what`` does not
    implement: forced prefixes and constraints."""
    if prefix_tokens is not None:
        raise ValueError(f"--prefix-size: not with {what} ({option})")
    if constraints is not None:
        raise ValueError(f"--constraints: not with {what} ({option})")


def max_length(generator: SequenceGenerator, src_len: int) -> int:
    """The longest output ``SequenceGenerator`` decodes for sources of ``src_len`` tokens
    (``--max-len-a/b``, the model's positions), checked against ``--min-len``."""
    max_len = min(int(generator.max_len_a * src_len + generator.max_len_b), generator.max_len - 1)
    if generator.min_len > max_len:
        raise ValueError(f"--min-len {generator.min_len} exceeds the maximum length {max_len}")
    return max_len


def hypothesis(tokens: Tensor, score: Tensor, positional_scores: Tensor) -> dict[str, Tensor]:
    """One hypothesis as ``SequenceGenerator`` returns it (no attention, no alignment)."""
    return {
        "tokens": tokens,
        "score": score,
        "attention": torch.empty(0),
        "alignment": torch.empty(0),
        "positional_scores": positional_scores,
    }


def decoding_side(
    decoder: RecurrentDecoder, encoder_out: dict[str, list[Tensor]], group: int = 1
) -> DecodingSide:
    """A :class:`RecurrentDecoder` and one batch's encoder output as the decoding loops ask
    them (:class:`~recurnmt.modules.decoding.protocol.DecodingSide`); ``group``: decoder rows per row of
    the encoder output (beam search's hypotheses of one sentence,
    :class:`~recurnmt.modules.memory.Memory`)."""
    pad = None
    if encoder_out.get("encoder_padding_mask"):
        pad = encoder_out["encoder_padding_mask"][0]
        pad = pad if bool(pad.any()) else None
    memory = Memory(encoder_out["encoder_out"][0].transpose(0, 1), pad, group)  # B x S x C
    return DecodingSide(decoder, memory, decoder.output_layer)
