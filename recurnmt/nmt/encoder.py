"""The recurrent encoder as a fairseq encoder."""

from __future__ import annotations

from typing import Any

import torch
from fairseq.models import FairseqEncoder
from torch import Tensor, nn

from recurnmt.modules import LevelOutputs, StackConfig
from recurnmt.modules.side import Side
from recurnmt.nmt.embedding import TokenEmbedding, token_config

EncoderOut = dict[str, list[Tensor]]
SENTENCE = "sentence_index"  # encoder_out key: the source sentence of every row (B)


class RecurrentEncoder(Side, FairseqEncoder):
    """Token embeddings followed by a :class:`RecurrentStack` of levels (a
    :class:`~recurnmt.modules.side.Side` on fairseq's position modules).

    The output follows fairseq's transformer encoder contract (``encoder_out`` is T x B x C),
    so fairseq's generators, scorers and tools work unchanged.
    """

    front_end = TokenEmbedding

    def __init__(
        self, args: Any, dictionary, embed_tokens: nn.Embedding, stack_cfg: StackConfig
    ) -> None:
        super().__init__(dictionary)
        self.max_source_positions = args.max_source_positions
        tokens = token_config(args, "encoder")
        self.build_side(stack_cfg, tokens, embed_tokens, args.max_source_positions, args.dropout)

    def forward(
        self,
        src_tokens: Tensor,
        src_lengths: Tensor | None = None,
        return_all_hiddens: bool = False,
        token_embeddings: Tensor | None = None,
    ) -> EncoderOut:
        """Encodes B x T source tokens (at the stack's depth, or its shallow branch:
        :func:`~recurnmt.modules.shallow_branch`)."""
        if token_embeddings is not None:
            raise NotImplementedError("precomputed token embeddings are not supported")
        padding_mask = src_tokens.eq(self.padding_idx)  # B x T
        has_pads = bool(padding_mask.any())
        x, embedded, positions = self.embed(src_tokens)  # B x T x C
        if has_pads:
            x = x * (~padding_mask).unsqueeze(-1).type_as(x)
        hooks = self.level_hooks(positions)  # UT: the positions at every level
        states = LevelOutputs()
        if return_all_hiddens:
            hooks.append(states)
        out = self.stack(
            x,
            padding_mask=padding_mask if has_pads else None,
            hooks=hooks,
        )
        if src_lengths is None:
            src_lengths = (~padding_mask).sum(dim=1, dtype=src_tokens.dtype)
        return {
            "encoder_out": [out.output.transpose(0, 1)],  # T x B x C
            "encoder_padding_mask": [padding_mask],  # B x T
            "encoder_embedding": [embedded],  # B x T x C
            "encoder_states": [s.transpose(0, 1) for s in states.outputs],  # List[T x B x C]
            "fc_results": [],
            "src_tokens": [],
            "src_lengths": [src_lengths.view(-1, 1)],
            "ponder": [out.ponder] if out.ponder is not None else [],  # B x T, ACT only
            SENTENCE: [torch.arange(src_tokens.size(0), device=src_tokens.device)],  # B
        }

    def reorder_encoder_out(self, encoder_out: EncoderOut, new_order: Tensor) -> EncoderOut:
        """Selects batch entries ``new_order`` (beam search).

        Every row carries the index of the sentence it was encoded from (``SENTENCE``), and
        rows of one sentence hold the same encoder output. A reorder that takes every row from
        a row of its own sentence (beam search reshuffling hypotheses at every step, until a
        sentence finishes) therefore changes nothing, and ``encoder_out`` is returned as is:
        the copy of the whole B x S x C memory per step that fairseq's generator otherwise
        pays is skipped, exactly.
        """
        sentence = encoder_out.get(SENTENCE, [])
        if sentence and new_order.numel() == sentence[0].numel():
            if torch.equal(sentence[0].index_select(0, new_order), sentence[0]):
                return encoder_out
        batch_dim = {"encoder_out": 1, "encoder_states": 1}
        return {
            key: [t.index_select(batch_dim.get(key, 0), new_order) for t in values]
            for key, values in encoder_out.items()
        }

    def max_positions(self) -> int:
        return self.embed.max_positions(self.max_source_positions)
