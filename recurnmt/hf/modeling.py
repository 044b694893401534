"""recurnmt translation models as ``transformers`` models (``AutoModelForSeq2SeqLM``).

The blocks are recurnmt's own: each side is the block library's
:class:`~recurnmt.modules.side.Side`, built exactly as the fairseq front end builds its encoder
and decoder (``recurnmt.nmt.encoder`` / ``decoder``): the token front end (scaled token
embeddings, fairseq's positions, here computed without fairseq, the optional embedding layer
norm), the :class:`~recurnmt.modules.RecurrentStack` of the side's ``StackConfig`` and the
Universal Transformer's positions at every level. The parameter names below ``encoder.embed``,
``encoder.stack``, ``decoder.embed`` and ``decoder.stack`` are fairseq's, and the weights load
unchanged; only the output projection is this model's own.

Parameters that one module holds for several places (shared embeddings, a tied output
projection, One Wide FFN's FFN in every encoder block) are found by identity when the model is
built and declared as tied weights, so ``save_pretrained`` stores each once in safetensors and
``from_pretrained`` ties them again.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from transformers import GenerationMixin, LogitsProcessorList, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutput, Seq2SeqLMOutput

from recurnmt.hf.cache import RecurnmtCache
from recurnmt.hf.configuration import RecurnmtConfig
from recurnmt.hf.generation import EndAtMaxLength, decoding_options, speculate
from recurnmt.modules import LevelParts, Memory
from recurnmt.modules.builders import build_level_embedding
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
        self, input_ids: Tensor, attention_mask: Tensor | None = None, **unused: Any
    ) -> BaseModelOutput:
        """Encodes B x S source ids (ending in ``</s>``, as fairseq's sources do)."""
        padding_mask = input_ids.eq(self.embed.padding_idx)  # B x S, fairseq's own mask
        if attention_mask is not None:
            padding_mask = padding_mask | ~attention_mask.bool()
        has_pads = bool(padding_mask.any())
        x, _, positions = self.embed(input_ids)
        if has_pads:  # as fairseq's encoder: padding enters the stack as zeros
            x = x * (~padding_mask).unsqueeze(-1).type_as(x)
        hooks = self.level_hooks(positions)
        out = self.stack(x, padding_mask=padding_mask if has_pads else None, hooks=hooks)
        return BaseModelOutput(last_hidden_state=out.output)  # B x S x C


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
    ) -> Tensor:
        """B x T decoder features for B x T target-prefix ids (only the new ones with a cache)."""
        offset = 0 if cache is None else cache.steps
        x, _, positions = self.embed(input_ids, offset)
        hooks = self.level_hooks(positions)
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
        return out.output


class RecurnmtPreTrainedModel(PreTrainedModel):
    """Shared settings of the recurnmt ``transformers`` models."""

    config_class = RecurnmtConfig
    base_model_prefix = "recurnmt"
    main_input_name = "input_ids"
    _supports_cache_class = False

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        """Recomputes what a checkpoint does not hold: the Universal Transformer's sinusoidal
        level embeddings (a non-persistent buffer, UT sec. 2.1; ``from_pretrained`` builds the
        model without memory first). Parameters are recurnmt's own initialisation or the
        exported weights."""
        if not isinstance(module, LevelParts) or module.level_embedding is None:
            return
        for side in (self.encoder, self.decoder):
            if any(parts is module for parts in side.stack.levels):
                embedding = build_level_embedding(side.stack_cfg, module.index)
                module.level_embedding.copy_(embedding.to(module.level_embedding))

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        # the decoder keeps a RecurnmtCache of its own (per level, see recurnmt.hf.cache)
        return False


class RecurnmtForConditionalGeneration(RecurnmtPreTrainedModel, GenerationMixin):
    """A recurnmt encoder-decoder that ``generate()`` runs greedy and with beam search.

    Args:
        config: the model configuration (see :class:`RecurnmtConfig`).
    """

    def __init__(self, config: RecurnmtConfig) -> None:
        super().__init__(config)
        vocab, dim, pad = config.vocab_size, config.d_model, config.pad_token_id
        encoder_embed = nn.Embedding(vocab, dim, padding_idx=pad)
        decoder_embed = encoder_embed
        if not config.share_input_embeddings:
            decoder_embed = nn.Embedding(vocab, dim, padding_idx=pad)
        self.encoder = RecurnmtEncoder(config, encoder_embed)
        self.decoder = RecurnmtDecoder(config, decoder_embed)
        self.lm_head = nn.Linear(dim, vocab, bias=config.output_projection_bias)
        if config.tie_output_projection:
            self.lm_head.weight = decoder_embed.weight
        self._tied_weights_keys = self._shared_parameters()
        self.post_init()

    def _shared_parameters(self) -> dict[str, str]:
        """``{name: first name}`` of every parameter reachable under several names."""
        first: dict[int, str] = {}
        tied: dict[str, str] = {}
        for name, param in self.named_parameters(remove_duplicate=False):
            if id(param) in first:
                tied[name] = first[id(param)]
            else:
                first[id(param)] = name
        return tied

    def get_encoder(self) -> RecurnmtEncoder:
        return self.encoder

    def get_decoder(self) -> RecurnmtDecoder:
        return self.decoder

    def get_input_embeddings(self) -> nn.Embedding:
        return self.encoder.embed.embed_tokens

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        decoder_input_ids: Tensor | None = None,
        encoder_outputs: BaseModelOutput | tuple | None = None,
        past_key_values: RecurnmtCache | None = None,
        labels: Tensor | None = None,
        use_cache: bool | None = None,
        return_dict: bool | None = None,
        **unused: Any,
    ) -> Seq2SeqLMOutput:
        """Logits B x T x V of the next token after every decoder input.

        Args:
            input_ids: B x S source ids, ending in ``</s>``.
            attention_mask: B x S, 1 on tokens (padding is also recognised by its id).
            decoder_input_ids: B x T target prefix starting with ``</s>`` (fairseq's
                convention); built from ``labels`` when missing. With ``past_key_values`` only
                the new positions.
            encoder_outputs: the encoder's output, when computed already (``generate``).
            past_key_values: the decoder state of earlier steps.
            labels: B x T target ids for a cross-entropy loss (padding ignored).
            use_cache: return the decoder state for the next step.
        """
        if encoder_outputs is None:
            encoder_outputs = self.encoder(input_ids, attention_mask)
        elif isinstance(encoder_outputs, tuple):
            encoder_outputs = BaseModelOutput(last_hidden_state=encoder_outputs[0])
        memory = encoder_outputs.last_hidden_state
        memory_padding_mask = None
        if attention_mask is not None and not bool(attention_mask.all()):
            memory_padding_mask = ~attention_mask.bool()
        elif input_ids is not None and bool(input_ids.eq(self.config.pad_token_id).any()):
            memory_padding_mask = input_ids.eq(self.config.pad_token_id)
        if decoder_input_ids is None:
            if labels is None:
                raise ValueError("forward needs decoder_input_ids or labels")
            decoder_input_ids = self.shift_labels(labels)
        use_cache = self.config.use_cache if use_cache is None else use_cache
        if use_cache and past_key_values is None:
            past_key_values = RecurnmtCache()
        cache = past_key_values if use_cache else None
        features = self.decoder(decoder_input_ids, memory, memory_padding_mask, cache)
        logits = self.lm_head(features)  # B x T x V
        loss = None
        if labels is not None:
            loss = nn.functional.cross_entropy(
                logits.flatten(0, 1).float(),
                labels.flatten(),
                ignore_index=self.config.pad_token_id,
            )
        return Seq2SeqLMOutput(
            loss=loss,
            logits=logits,
            past_key_values=cache,
            encoder_last_hidden_state=memory,
        )

    def shift_labels(self, labels: Tensor) -> Tensor:
        """Decoder inputs for ``labels``: ``</s>`` then the labels but the last (fairseq's
        ``prev_output_tokens``); -100 (transformers' ignored label) reads as padding."""
        labels = labels.masked_fill(labels.eq(-100), self.config.pad_token_id)
        start = labels.new_full((labels.size(0), 1), self.config.decoder_start_token_id)
        return torch.cat([start, labels[:, :-1]], dim=1)

    def prepare_inputs_for_generation(
        self,
        decoder_input_ids: Tensor,
        past_key_values: RecurnmtCache | None = None,
        attention_mask: Tensor | None = None,
        encoder_outputs: BaseModelOutput | None = None,
        use_cache: bool | None = None,
        **unused: Any,
    ) -> dict[str, Any]:
        """With a cache, only the positions not decoded yet enter the decoder."""
        if past_key_values is not None and past_key_values.steps:
            decoder_input_ids = decoder_input_ids[:, past_key_values.steps :]
        return {
            "decoder_input_ids": decoder_input_ids,
            "past_key_values": past_key_values,
            "attention_mask": attention_mask,
            "encoder_outputs": encoder_outputs,
            "use_cache": use_cache,
        }

    @torch.no_grad()
    def generate(self, inputs: Tensor | None = None, generation_config: Any = None, **kwargs: Any):
        """transformers' ``generate()``, ending every hypothesis as fairseq does at the length
        limit (:class:`~recurnmt.hf.generation.EndAtMaxLength`). recurnmt's decoding options
        (:class:`~recurnmt.modules.decoding.options.DecodingOptions`) are keywords too: with
        ``draft_levels=R``, greedy decoding and sampling draft ``draft_tokens`` tokens at a
        time with the decoder's first R levels (:func:`~recurnmt.hf.generation.speculate`):
        the same output, faster."""
        options = decoding_options(kwargs)  # recurnmt's keywords, taken out of kwargs
        config = generation_config or self.generation_config
        max_new = kwargs.get("max_new_tokens", config.max_new_tokens)
        if max_new is None:
            max_new = kwargs.get("max_length", config.max_length) - 1
        eos = config.eos_token_id if config.eos_token_id is not None else self.config.eos_token_id
        if options.speculative:
            return speculate(self, inputs, config, max_new, eos, options, kwargs)
        processors = LogitsProcessorList(kwargs.pop("logits_processor", None) or [])
        processors.append(EndAtMaxLength(eos, last_length=max_new))  # start token + max_new - 1
        return super().generate(
            inputs, generation_config=generation_config, logits_processor=processors, **kwargs
        )

    def _reorder_cache(self, past_key_values: RecurnmtCache, beam_idx: Tensor) -> RecurnmtCache:
        """Every level's keys/values follow their beams (transformers' beam search hook)."""
        return past_key_values.reordered(beam_idx)


__all__ = [
    "RecurnmtDecoder",
    "RecurnmtEncoder",
    "RecurnmtForConditionalGeneration",
    "RecurnmtPreTrainedModel",
]
