"""A recurrent decoder's state after every level, teacher-forced: what its exits would emit.

One pass of the encoder and of the decoder over a translation batch (the reference prefix as the
decoder's input, every position at once), the decoder's level outputs recorded by its
:class:`~recurnmt.modules.hooks.LevelOutputs` hook (``return_all_hiddens``). Each level's state,
before the final norm as ``StackOutput.hidden`` is, goes through the final norm as the full
depth's does: the features the output layer reads at depth r, and what the decoding exits'
tests see (:mod:`recurnmt.modules.decoding.exits` feeds ``stack.final_norm(state)`` to the
``margin`` test's output layer and to the ``classifier`` test's units).

Shared by :mod:`recurnmt.analysis.depth_map` (each level's argmax) and
:mod:`recurnmt.analysis.exit_training` (the exit units' features and CALM's oracle labels), so
that neither command imports the other.

Refused (:func:`check_decoder`): a decoder that halts with ACT (``--act on``,
:mod:`recurnmt.modules.halting`), whose output mixes every level's output, so the state after r
levels is no prediction of the model and no level is an exit; and a decoder that is no recurnmt
stack (fairseq's own ``transformer``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn


def check_decoder(model: nn.Module, what: str = "the depth map") -> None:
    """Refuses a model whose decoder levels are no predictions of it (module docstring);
    ``what`` names what is then not defined, in the message.

    Raises:
        ValueError: the decoder halts with ACT, or is no recurnmt stack.
    """
    stack = getattr(model.decoder, "stack", None)
    if stack is None:
        raise ValueError(
            f"the decoder is {type(model.decoder).__name__}, not a recurnmt recurrent decoder: "
            f"{what} reads the levels of recurnmt's stacks"
        )
    if stack.halting is not None:
        raise ValueError(
            "the decoder halts with ACT (--act on), whose output mixes the outputs of every "
            "level and whose halting decides each position's depth: the state after r levels "
            f"is no prediction of the model, so no level is an exit and {what} is not defined "
            "for it"
        )


@dataclass
class LevelStates:
    """Every decoder level's final-normed state of one batch's target tokens.

    Attributes:
        features: N x [n x C], level r's state after the final norm (entry r - 1); the last
            entry is the decoder's own features (the full depth's). Tokens in batch-major
            order, padding removed.
        target: n, the reference tokens.
    """

    features: list[Tensor]
    target: Tensor

    @property
    def levels(self) -> int:
        return len(self.features)


@torch.no_grad()
def level_states(model: nn.Module, sample: dict[str, Any], pad: int) -> LevelStates:
    """The final-normed state at every decoder level of one teacher-forced batch.

    Args:
        model: a recurnmt translation model in evaluation mode (:func:`check_decoder`).
        sample: a fairseq translation batch (``net_input`` and ``target``).
        pad: the padding index.
    """
    check_decoder(model)
    net, target = sample["net_input"], sample["target"]
    decoder = model.decoder
    enc = model.encoder(net["src_tokens"], src_lengths=net["src_lengths"])
    features, extra = decoder(
        net["prev_output_tokens"], encoder_out=enc, features_only=True, return_all_hiddens=True
    )
    states = extra["inner_states"]  # N x [T x B x C], each level's output before the final norm
    levels = len(decoder.stack.active_levels)
    if len(states) != levels:
        raise ValueError(f"recorded {len(states)} level outputs for {levels} levels")
    keep = target.ne(pad)  # B x T
    norm = decoder.stack.final_norm
    out = []
    for r, state in enumerate(states, start=1):
        h = state.transpose(0, 1)  # B x T x C
        out.append((features if r == levels else (h if norm is None else norm(h)))[keep])  # n x C
    return LevelStates(out, target[keep])


def level_predictions(model: nn.Module, sample: dict[str, Any], pad: int) -> tuple[Tensor, Tensor]:
    """The argmax at every decoder level of one teacher-forced batch, padding removed: each
    level's features (:func:`level_states`) through the output layer.

    Returns:
        (N x n argmax per level, the last row the full depth's; the n reference tokens).
    """
    states = level_states(model, sample, pad)
    with torch.no_grad():
        out = model.decoder.output_layer
        predictions = torch.stack([out(f).argmax(-1) for f in states.features])
    return predictions, states.target


__all__ = ["LevelStates", "check_decoder", "level_predictions", "level_states"]
