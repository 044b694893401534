"""recurnmt translation models as ``transformers`` models (``AutoModelForSeq2SeqLM``).

As BART and Marian are: :class:`RecurnmtModel`, the base model (the shared or per-side token
embeddings, the encoder and decoder of :mod:`recurnmt.hf.sides`, recurnmt's own sides built as
the fairseq front end builds them), returns a ``Seq2SeqModelOutput``;
:class:`RecurnmtForConditionalGeneration` holds it as ``model`` (``base_model_prefix``) and adds
the output projection ``lm_head``. Below ``model.encoder.embed``, ``model.encoder.stack``,
``model.decoder.embed`` and ``model.decoder.stack`` the parameter names are fairseq's. Exports
written before the base model existed name them without ``model.``; transformers' loader adds
the base model prefix to a checkpoint key that the model holds only under it, so they load
unchanged (``tests/test_hf_contract.py`` loads such an export).

Parameters that one module holds for several places (shared embeddings, a tied output
projection, One Wide FFN's FFN in every encoder block) are found by identity when the model is
built and declared as tied weights, so ``save_pretrained`` stores each once in safetensors and
``from_pretrained`` ties them again; ``resize_token_embeddings`` resizes them in place, so they
stay one tensor.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from transformers import GenerationMixin, LogitsProcessorList, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutput, Seq2SeqLMOutput, Seq2SeqModelOutput

from recurnmt.hf.cache import RecurnmtCache
from recurnmt.hf.configuration import RecurnmtConfig
from recurnmt.hf.generation import EndAtMaxLength, decoding_options, exiting, speculate
from recurnmt.hf.sides import RecurnmtDecoder, RecurnmtEncoder
from recurnmt.modules import LevelParts
from recurnmt.modules.builders import build_level_embedding


def shared_parameters(model: nn.Module) -> dict[str, str]:
    """``{name: first name}`` of every parameter of ``model`` reachable under several names
    (transformers' ``_tied_weights_keys``)."""
    first: dict[int, str] = {}
    tied: dict[str, str] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in first:
            tied[name] = first[id(param)]
        else:
            first[id(param)] = name
    return tied


class RecurnmtPreTrainedModel(PreTrainedModel):
    """Shared settings of the recurnmt ``transformers`` models."""

    config_class = RecurnmtConfig
    base_model_prefix = "model"
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
        for side in (self.base_model.encoder, self.base_model.decoder):
            if any(parts is module for parts in side.stack.levels):
                embedding = build_level_embedding(side.stack_cfg, module.index)
                module.level_embedding.copy_(embedding.to(module.level_embedding))

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        # the decoder keeps a RecurnmtCache of its own (per level, see recurnmt.hf.cache)
        return False

    def _resize_token_embeddings(
        self, new_num_tokens: int | None, pad_to_multiple_of: int | None = None, mean_resizing=True
    ) -> nn.Embedding:
        """transformers' resizing (the encoder's embedding, then the output projection), with
        the decoder's own embedding where it has one: one joined dictionary for both sides.
        transformers resizes an embedding in place, so every tie is kept."""
        base = self.base_model
        decoder = base.decoder.embed.embed_tokens
        if new_num_tokens is not None and decoder is not base.encoder.embed.embed_tokens:
            self._get_resized_embeddings(decoder, new_num_tokens, pad_to_multiple_of, mean_resizing)
        return super()._resize_token_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)

    def get_input_embeddings(self) -> nn.Embedding:
        """The encoder's token embedding (the decoder's too where they are shared)."""
        return self.base_model.encoder.embed.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        """``value`` becomes the encoder's token embedding, and the decoder's and the output
        projection's where the model shares them with it."""
        base = self.base_model
        old = base.encoder.embed.embed_tokens
        base.encoder.embed.embed_tokens = value
        if base.decoder.embed.embed_tokens is old:
            base.decoder.embed.embed_tokens = value
            head = self.get_output_embeddings()
            if head is not None and head.weight is old.weight:
                head.weight = value.weight
                head.out_features = value.num_embeddings


class RecurnmtModel(RecurnmtPreTrainedModel):
    """The bare encoder-decoder: decoder states B x T x C, no output projection.

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
        self._tied_weights_keys = shared_parameters(self)
        self.post_init()

    def get_encoder(self) -> RecurnmtEncoder:
        return self.encoder

    def get_decoder(self) -> RecurnmtDecoder:
        return self.decoder

    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        decoder_input_ids: Tensor | None = None,
        encoder_outputs: BaseModelOutput | tuple | None = None,
        past_key_values: RecurnmtCache | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **unused: Any,
    ) -> Seq2SeqModelOutput | tuple[Tensor, ...]:
        """The decoder's last states B x T x C after every decoder input.

        Args:
            input_ids: B x S source ids, ending in ``</s>``.
            attention_mask: B x S, 1 on tokens (padding is also recognised by its id).
            decoder_input_ids: B x T target prefix starting with ``</s>`` (fairseq's
                convention); with ``past_key_values`` only the new positions.
            encoder_outputs: the encoder's output, when computed already (``generate``).
            past_key_values: the decoder state of earlier steps.
            use_cache: return the decoder state for the next step.
            output_attentions: every level's self-attention weights per side and the
                decoder's cross-attention weights, B x H x T x S each (computed explicitly:
                the fused attention kernels serve only passes that do not ask for them).
            output_hidden_states: per side, the embedding output and every level's output
                (:mod:`recurnmt.hf.outputs`): levels + 1 states.
            return_dict: False returns ``to_tuple()`` of the output (transformers' order).
        """
        config = self.config
        output_attentions = _flag(output_attentions, config.output_attentions)
        output_hidden_states = _flag(output_hidden_states, config.output_hidden_states)
        if decoder_input_ids is None:
            raise ValueError("forward needs decoder_input_ids")
        if encoder_outputs is None:
            encoder_outputs = self.encoder(
                input_ids, attention_mask, output_attentions, output_hidden_states
            )
        elif isinstance(encoder_outputs, tuple):  # as BART reads a tuple
            encoder_outputs = BaseModelOutput(
                last_hidden_state=encoder_outputs[0],
                hidden_states=encoder_outputs[1] if len(encoder_outputs) > 1 else None,
                attentions=encoder_outputs[2] if len(encoder_outputs) > 2 else None,
            )
        memory = encoder_outputs.last_hidden_state
        memory_padding_mask = None
        if attention_mask is not None and not bool(attention_mask.all()):
            memory_padding_mask = ~attention_mask.bool()
        elif input_ids is not None and bool(input_ids.eq(config.pad_token_id).any()):
            memory_padding_mask = input_ids.eq(config.pad_token_id)
        use_cache = config.use_cache if use_cache is None else use_cache
        if use_cache and past_key_values is None:
            past_key_values = RecurnmtCache()
        cache = past_key_values if use_cache else None
        decoded = self.decoder(
            decoder_input_ids,
            memory,
            memory_padding_mask,
            cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
        )
        out = Seq2SeqModelOutput(
            last_hidden_state=decoded.last_hidden_state,
            past_key_values=cache,
            decoder_hidden_states=decoded.hidden_states,
            decoder_attentions=decoded.attentions,
            cross_attentions=decoded.cross_attentions,
            encoder_last_hidden_state=memory,
            encoder_hidden_states=encoder_outputs.hidden_states,
            encoder_attentions=encoder_outputs.attentions,
        )
        return out if _flag(return_dict, config.return_dict) else out.to_tuple()


def _flag(value: bool | None, default: bool | None) -> bool:
    # a call's output_* / return_dict argument, else the configuration's
    return bool(default if value is None else value)


class RecurnmtForConditionalGeneration(RecurnmtPreTrainedModel, GenerationMixin):
    """A recurnmt encoder-decoder that ``generate()`` runs greedy and with beam search.

    Args:
        config: the model configuration (see :class:`RecurnmtConfig`).
    """

    def __init__(self, config: RecurnmtConfig) -> None:
        super().__init__(config)
        self.model = RecurnmtModel(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, config.output_projection_bias)
        if config.tie_output_projection:
            self.lm_head.weight = self.model.decoder.embed.embed_tokens.weight
        self._tied_weights_keys = shared_parameters(self)
        self.post_init()

    @property
    def encoder(self) -> RecurnmtEncoder:
        """The base model's encoder (``model.encoder``)."""
        return self.model.encoder

    @property
    def decoder(self) -> RecurnmtDecoder:
        """The base model's decoder (``model.decoder``)."""
        return self.model.decoder

    def get_encoder(self) -> RecurnmtEncoder:
        return self.model.encoder

    def get_decoder(self) -> RecurnmtDecoder:
        return self.model.decoder

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, new_embeddings: nn.Linear) -> None:
        self.lm_head = new_embeddings

    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        decoder_input_ids: Tensor | None = None,
        encoder_outputs: BaseModelOutput | tuple | None = None,
        past_key_values: RecurnmtCache | None = None,
        labels: Tensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **unused: Any,
    ) -> Seq2SeqLMOutput | tuple[Tensor, ...]:
        """Logits B x T x V of the next token after every decoder input.

        The arguments are :meth:`RecurnmtModel.forward`'s, and ``labels``: B x T target ids
        for a cross-entropy loss (padding and -100 ignored); without ``decoder_input_ids`` the
        decoder reads the shifted labels (:meth:`shift_labels`).
        """
        if decoder_input_ids is None:
            if labels is None:
                raise ValueError("forward needs decoder_input_ids or labels")
            decoder_input_ids = self.shift_labels(labels)
        outputs = self.model(
            input_ids,
            attention_mask,
            decoder_input_ids,
            encoder_outputs,
            past_key_values,
            use_cache,
            output_attentions,
            output_hidden_states,
            return_dict=True,
        )
        logits = self.lm_head(outputs.last_hidden_state)  # B x T x V
        loss = None
        if labels is not None:
            loss = nn.functional.cross_entropy(
                logits.flatten(0, 1).float(),
                labels.flatten(),
                ignore_index=self.config.pad_token_id,
            )
        out = Seq2SeqLMOutput(
            loss=loss,
            logits=logits,
            past_key_values=outputs.past_key_values,
            decoder_hidden_states=outputs.decoder_hidden_states,
            decoder_attentions=outputs.decoder_attentions,
            cross_attentions=outputs.cross_attentions,
            encoder_last_hidden_state=outputs.encoder_last_hidden_state,
            encoder_hidden_states=outputs.encoder_hidden_states,
            encoder_attentions=outputs.encoder_attentions,
        )
        return out if _flag(return_dict, self.config.return_dict) else out.to_tuple()

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
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
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
            "output_attentions": output_attentions,
            "output_hidden_states": output_hidden_states,
        }

    @torch.no_grad()
    def generate(self, inputs: Tensor | None = None, generation_config: Any = None, **kwargs: Any):
        """transformers' ``generate()``, ending every hypothesis as fairseq does at the length
        limit (:class:`~recurnmt.hf.generation.EndAtMaxLength`). recurnmt's decoding options
        (:class:`~recurnmt.modules.decoding.options.DecodingOptions`) are keywords too: with
        ``draft_levels=R``, greedy decoding and sampling draft ``draft_tokens`` tokens at a
        time with the decoder's first R levels (:func:`~recurnmt.hf.generation.speculate`):
        the same output, faster. With ``exit_test=...`` (``exit_threshold``,
        ``min_exit_level``, ``exit_classifier``), rows leave each step's level loop early
        (:mod:`~recurnmt.modules.decoding.exits`), in any search."""
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
        with exiting(self.decoder.stack, options, self.lm_head):
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
    "RecurnmtModel",
    "RecurnmtPreTrainedModel",
]
