"""What one side's pass records for ``output_hidden_states`` / ``output_attentions``.

transformers' encoder-decoder models return, per side, ``num_layers + 1`` hidden states: the
embedding output (the first layer's input), then every layer's output, the last of which is
``last_hidden_state`` itself (transformers 5's ``capture_outputs`` ties it, so a final norm is
applied to it, as in mBART); and one attention map per layer, B x H x T x S, after the softmax.
A recurrent stack's layers are its levels: the hidden states are the stack's input, the output
of every level run but the last, and the stack's output (after its final norm; with ACT the
halting units' mixture of the levels, Universal Transformer sec. 2.2). With ACT a pass whose
positions have all halted stops early, and has fewer levels to show.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from recurnmt.modules import AttentionWeights, LevelHook, LevelOutputs


@dataclass
class SideRecording:
    """The hooks that record one pass of a side, and the tuples transformers returns.

    Args:
        hidden_states: record every level's output.
        attentions: record every level's self-attention probabilities.
        cross_attentions: record the cross-attention probabilities too (decoders).
    """

    hidden_states: bool = False
    attentions: bool = False
    cross_attentions: bool = False

    def __post_init__(self) -> None:
        self.outputs = LevelOutputs() if self.hidden_states else None
        self.weights = None
        if self.attentions:
            self.weights = AttentionWeights(cross=self.cross_attentions)

    def hooks(self) -> list[LevelHook]:
        """The recording hooks to pass to the stack (none when nothing is asked for)."""
        return [hook for hook in (self.outputs, self.weights) if hook is not None]

    def states(self, stack_input: Tensor, last: Tensor) -> tuple[Tensor, ...] | None:
        """The embedding output, the levels' outputs but the last, then ``last`` (B x T x C)."""
        if self.outputs is None:
            return None
        return (stack_input, *self.outputs.outputs[:-1], last)

    def self_attentions(self) -> tuple[Tensor, ...] | None:
        """Every level's self-attention probabilities, B x H x T x S each."""
        return None if self.weights is None else tuple(self.weights.self_weights)

    def cross(self) -> tuple[Tensor, ...] | None:
        """Every level's cross-attention probabilities, B x H x T x S each."""
        if self.weights is None or not self.cross_attentions:
            return None
        return tuple(self.weights.cross_weights)


__all__ = ["SideRecording"]
