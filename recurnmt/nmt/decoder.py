"""The recurrent decoder as a fairseq incremental decoder.

Incremental decoding state: fairseq keys incremental state by module instance, and one block
object runs at every level, so the attention modules cannot own their state. Instead the
decoder keeps one :class:`~recurnmt.modules.decoding.cache.StackCache` for the whole stack: every
level's self-attention keys and values, and the projected encoder memory of every unique block
(computed at the first step only). Beam search reorders every level's entries.

Beam search hands the decoder ``beam`` consecutive rows per sentence, all with the same encoder
output (the encoder's ``sentence_index`` says so exactly). At the first step the decoder
projects the memory of one row per sentence (``Memory.group``), and every hypothesis attends
to its sentence's keys and values: a quarter of the projections and of the cached memory at
beam 4, the same attention (fairseq enables this "beamable" encoder-decoder attention for its
BART; its transformer projects and reads the memory once per hypothesis).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from fairseq.models import FairseqIncrementalDecoder
from torch import Tensor, nn

from recurnmt.modules import CrossAttentionWeights, LevelOutputs, Memory, StackCache, StackConfig
from recurnmt.modules.side import Side
from recurnmt.nmt.embedding import TokenEmbedding, token_config
from recurnmt.nmt.encoder import SENTENCE

IncrementalState = dict[str, StackCache]
_CACHE = "levels"


class RecurrentDecoder(Side, FairseqIncrementalDecoder):
    """Token embeddings, a causal :class:`RecurrentStack` with cross-attention, output layer
    (a :class:`~recurnmt.modules.side.Side` on fairseq's position modules)."""

    front_end = TokenEmbedding

    def __init__(
        self, args: Any, dictionary, embed_tokens: nn.Embedding, stack_cfg: StackConfig
    ) -> None:
        super().__init__(dictionary)
        self.max_target_positions = args.max_target_positions
        tokens = token_config(args, "decoder")
        self.build_side(stack_cfg, tokens, embed_tokens, args.max_target_positions, args.dropout)
        self._stateful: list[nn.Module] | None = None  # submodules with their own state
        self.share_input_output_embed = args.share_decoder_input_output_embed
        if self.share_input_output_embed:
            self.output_projection = None
        else:
            bias = bool(getattr(args, "output_projection_bias", False))
            self.output_projection = nn.Linear(
                embed_tokens.embedding_dim, len(dictionary), bias=bias
            )
            nn.init.normal_(
                self.output_projection.weight, mean=0, std=embed_tokens.embedding_dim**-0.5
            )
            if bias:
                nn.init.zeros_(self.output_projection.bias)

    def forward(
        self,
        prev_output_tokens: Tensor,
        encoder_out: dict[str, list[Tensor]] | None = None,
        incremental_state: IncrementalState | None = None,
        features_only: bool = False,
        full_context_alignment: bool = False,
        alignment_layer: int | None = None,
        alignment_heads: int | None = None,
        src_lengths: Any = None,
        return_all_hiddens: bool = False,
    ) -> tuple[Tensor, dict[str, Any]]:
        x, extra = self.extract_features(
            prev_output_tokens, encoder_out, incremental_state, return_all_hiddens
        )
        if not features_only:
            x = self.output_layer(x)
        return x, extra

    def extract_features(
        self,
        prev_output_tokens: Tensor,
        encoder_out: dict[str, list[Tensor]] | None = None,
        incremental_state: IncrementalState | None = None,
        return_all_hiddens: bool = False,
        **unused: Any,
    ) -> tuple[Tensor, dict[str, Any]]:
        """Decoder features B x T x C (B x 1 x C in incremental mode), at the stack's depth or
        its shallow branch (:func:`~recurnmt.modules.shallow_branch`)."""
        if encoder_out is None or not encoder_out["encoder_out"]:
            raise ValueError("the recurrent decoder needs the encoder output")
        cache = None
        if incremental_state is not None:
            cache = self.get_incremental_state(incremental_state, _CACHE) or StackCache()
            self_padding_mask = None  # generated prefixes hold no padding
        else:
            self_padding_mask = _interior_padding(prev_output_tokens, self.padding_idx)
        memory = encoder_out["encoder_out"][0].transpose(0, 1)  # B x S x C
        memory_padding_mask = None
        group = 1
        first_step = cache is not None and not cache.memory
        if encoder_out.get("encoder_padding_mask") and (cache is None or first_step):
            # read once per sentence: later steps take the projected memory (and its mask)
            # from the cache, so no step waits on a device-to-host check
            memory_padding_mask = encoder_out["encoder_padding_mask"][0]
            if not memory_padding_mask.any():
                memory_padding_mask = None
        if first_step:
            group = rows_per_sentence(encoder_out)
            if group > 1:  # one memory row per sentence (see the module docstring)
                memory = memory[::group]
                if memory_padding_mask is not None:
                    memory_padding_mask = memory_padding_mask[::group]

        offset = 0
        if incremental_state is not None:  # only the last position is embedded
            offset = prev_output_tokens.size(1) - 1
            prev_output_tokens = prev_output_tokens[:, -1:]
        x, _, positions = self.embed(prev_output_tokens, offset)  # B x T x C
        hooks = self.level_hooks(positions)  # UT: the positions at every level
        # like fairseq's transformer: alignment weights of the last level in evaluation
        alignment = None
        # exited rows (and halted ones under ACT's paper rule) skip the last level
        if not self.training and self.stack.exits is None and not self.stack.skips_halted:
            alignment = CrossAttentionWeights(self.stack.active_levels[-1])
            hooks.append(alignment)
        states = LevelOutputs()
        if return_all_hiddens:
            hooks.append(states)
        out = self.stack(
            x,
            padding_mask=self_padding_mask,
            memory=Memory(memory, memory_padding_mask, group),
            cache=cache,
            hooks=hooks,
        )
        if incremental_state is not None:
            self.set_incremental_state(incremental_state, _CACHE, cache)
        inner = [s.transpose(0, 1) for s in states.outputs]  # List[T x B x C]
        extra: dict[str, Any] = {
            "attn": [alignment.weights if alignment is not None else None],
            "inner_states": inner,
        }
        if out.ponder is not None:
            extra["ponder"] = out.ponder  # B x T, ACT only
        return out.output, extra

    def output_layer(self, features: Tensor) -> Tensor:
        """Projects features to vocabulary logits."""
        if self.output_projection is None:
            return F.linear(features, self.embed_tokens.weight)
        return self.output_projection(features)

    def max_positions(self) -> int:
        return self.embed.max_positions(self.max_target_positions)

    def reorder_incremental_state(
        self, incremental_state: IncrementalState, new_order: Tensor
    ) -> None:
        """Reorders every level's cached keys/values and the projected memory (beam search)."""
        cache = self.get_incremental_state(incremental_state, _CACHE)
        if cache is None:
            return
        self.set_incremental_state(incremental_state, _CACHE, cache.reorder(new_order))

    def reorder_incremental_state_scripting(
        self, incremental_state: IncrementalState, new_order: Tensor
    ) -> None:
        """Beam search's entry point (``SequenceGenerator`` calls it at every step).

        fairseq's walks every submodule and reorders each that has a
        ``reorder_incremental_state``, as its attention modules own their states. Here the
        decoder holds the whole stack's state (the module docstring), and the walk, 0.1-0.5
        ms a step at six levels on a CPU (host time, which a beam-search step on a GPU is
        bound by), runs once per mode switch: the submodules with a state of their own (none
        of recurnmt's; a subclass may add some) are found then and reordered at every step.
        """
        self.reorder_incremental_state(incremental_state, new_order)
        if self._stateful is None:
            self._stateful = [
                m
                for m in self.modules()
                if m is not self and hasattr(m, "reorder_incremental_state")
            ]
        for module in self._stateful:
            result = module.reorder_incremental_state(incremental_state, new_order)
            if result is not None:  # fairseq's protocol: a module may return a new state
                incremental_state = result

    def train(self, mode: bool = True) -> RecurrentDecoder:
        self._stateful = None  # modules may have been added: found again at the next reorder
        return super().train(mode)


def rows_per_sentence(encoder_out: dict[str, list[Tensor]]) -> int:
    """g where the rows of ``encoder_out`` are g consecutive copies of each sentence (beam
    search's expansion), else 1; read from the encoder's ``sentence_index``."""
    sentence = encoder_out.get(SENTENCE)
    if not sentence or sentence[0].numel() < 2:
        return 1
    _, counts = torch.unique_consecutive(sentence[0], return_counts=True)
    g = int(counts[0])
    return g if g > 1 and bool((counts == g).all()) else 1


def _interior_padding(tokens: Tensor, padding_idx: int) -> Tensor | None:
    """Target padding mask, or None when padding only trails the sequences.

    With right padding the causal mask already keeps real tokens off the padding, and leaving
    the mask out lets attention use its fused causal kernel.
    """
    pad = tokens.eq(padding_idx)
    if not bool(pad.any()):
        return None
    real_after_pad = pad[:, :-1] & ~pad[:, 1:]
    return pad if bool(real_after_pad.any()) else None


__all__ = ["RecurrentDecoder"]
