"""fairseq-generate's length limit for transformers' ``generate()``.

fairseq's ``SequenceGenerator`` decodes at most ``max_len`` tokens and then allows only
``</s>``, keeping that token's own log-probability in the hypothesis score. transformers'
``forced_eos_token_id`` instead gives ``</s>`` probability one, which changes the scores of
hypotheses that reach the limit and so the ranking of the beams. This processor does what
fairseq does.
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformers import LogitsProcessor


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
