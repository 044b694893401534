"""The encoder and decoder of the ``transformers`` model: recurnmt's own sides.

Each side is the block library's :class:`~recurnmt.modules.side.Side`, built exactly as the
fairseq front end builds its encoder and decoder (``recurnmt.nmt.encoder`` / ``decoder``): the
token front end (scaled token embeddings, fairseq's positions, here computed without fairseq,
the optional embedding layer norm), the :class:`~recurnmt.modules.RecurrentStack` of the side's
``StackConfig`` and the Universal Transformer's positions at every level. Their parameter names
below ``embed`` and ``stack`` are fairseq's. What a pass records for transformers' outputs
(hidden states, attention weights) is :class:`~recurnmt.hf.outputs.SideRecording`'s.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn
from transformers.modeling_outputs import (
    BaseModelOutput,
    BaseModelOutputWithPastAndCrossAttentions,
)

from recurnmt.hf.cache import RecurnmtCache
from recurnmt.hf.configuration import RecurnmtConfig
from recurnmt.hf.outputs import SideRecording
from recurnmt.modules import Memory
from recurnmt.modules.side import Side


class StackSide(Side):
    """One side: the block library's :class:`~recurnmt.modules.side.Side` (its token front end,
    with fairseq's positions computed without fairseq, and the :class:`RecurrentStack` built
    from its ``StackConfig``), at the elastic depth the checkpoint was run at.

    Args:
        config: the model configuration.
        embed_tokens: this side's (possibly shared) token embedding.
        side: ``encoder`` or ``decoder``.
    """

    def __init__(self, config: RecurnmtConfig, embed_tokens: nn.Embedding, side: str) -> None:
        super().__init__()
        max_positions = (
            config.max_source_positions if side == "encoder" else config.max_target_positions
        )
        self.build_side(
            config.stack_config(side),
            config.tokens,
            embed_tokens,
            max_positions,
            depth=getattr(config, f"{side}_levels"),
        )


class RecurnmtEncoder(StackSide):
    """Embeddings and the encoder's :class:`RecurrentStack` (``model.get_encoder()``)."""

    main_input_name = "input_ids"

    def __init__(self, config: RecurnmtConfig, embed_tokens: nn.Embedding) -> None:
        super().__init__(config, embed_tokens, "encoder")

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **unused: Any,
    ) -> BaseModelOutput | tuple[Tensor, ...]:
        """Encodes B x S source ids (ending in ``</s>``, as fairseq's sources do): B x S x C
        states, with every level's states and self-attention weights when asked for."""
        padding_mask = input_ids.eq(self.embed.padding_idx)  # B x S, fairseq's own mask
        if attention_mask is not None:
            padding_mask = padding_mask | ~attention_mask.bool()
        has_pads = bool(padding_mask.any())
        x, _, positions = self.embed(input_ids)
        if has_pads:  # as fairseq's encoder: padding enters the stack as zeros
            x = x * (~padding_mask).unsqueeze(-1).type_as(x)
        record = SideRecording(bool(output_hidden_states), bool(output_attentions))
        hooks = self.level_hooks(positions) + record.hooks()
        out = self.stack(x, padding_mask=padding_mask if has_pads else None, hooks=hooks)
        result = BaseModelOutput(
            last_hidden_state=out.output,  # B x S x C
            hidden_states=record.states(x, out.output),
            attentions=record.self_attentions(),
        )
        return result if return_dict is not False else result.to_tuple()


class RecurnmtDecoder(StackSide):
    """Embeddings and the decoder's causal :class:`RecurrentStack` with cross-attention."""

    def __init__(self, config: RecurnmtConfig, embed_tokens: nn.Embedding) -> None:
        super().__init__(config, embed_tokens, "decoder")

    def forward(
        self,
        input_ids: Tensor,
        memory: Tensor,
        memory_padding_mask: Tensor | None,
        cache: RecurnmtCache | None = None,
        output_attentions: bool = False,
        output_hidden_states: bool = False,
    ) -> BaseModelOutputWithPastAndCrossAttentions:
        """B x T decoder features for B x T target-prefix ids (only the new ones with a
        cache), attending to the B x S x C ``memory``; with every level's states, self- and
        cross-attention weights when asked for."""
        offset = 0 if cache is None else cache.steps
        x, _, positions = self.embed(input_ids, offset)
        record = SideRecording(output_hidden_states, output_attentions, output_attentions)
        hooks = self.level_hooks(positions) + record.hooks()
        padding_mask = None
        if cache is None:  # teacher forcing: padding inside a prefix is masked (fairseq does too)
            pad = input_ids.eq(self.embed.padding_idx)
            padding_mask = pad if bool((pad[:, :-1] & ~pad[:, 1:]).any()) else None
        out = self.stack(
            x,
            padding_mask=padding_mask,
            memory=Memory(memory, memory_padding_mask),
            cache=None if cache is None else cache.stack,
            hooks=hooks,
        )
        if cache is not None:
            cache.steps += input_ids.size(1)
        return BaseModelOutputWithPastAndCrossAttentions(
            last_hidden_state=out.output,  # B x T x C
            past_key_values=cache,
            hidden_states=record.states(x, out.output),
            attentions=record.self_attentions(),
            cross_attentions=record.cross(),
        )


__all__ = ["RecurnmtDecoder", "RecurnmtEncoder", "StackSide"]
