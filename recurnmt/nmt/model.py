"""The recurnmt encoder-decoder model, registered with fairseq.

It subclasses fairseq's legacy (argparse) ``TransformerModel``, so every fairseq transformer
option, the embedding sharing logic and the generation interface stay as users know them;
only the encoder and decoder are ours. Architectures (``ringformer_wmt_en_de``, ...) live in
:mod:`recurnmt.nmt.architectures`.
"""

from __future__ import annotations

from typing import Any

from fairseq.models.transformer import TransformerModel
from fairseq.models.transformer.transformer_legacy import base_architecture

from recurnmt.nmt.decoder import RecurrentDecoder
from recurnmt.nmt.encoder import RecurrentEncoder
from recurnmt.nmt.options import add_recurrent_args, stack_configs
from recurnmt.nmt.registry import register_model_once

MODEL_NAME = "recurrent_transformer"


@register_model_once(MODEL_NAME)
class RecurrentTransformerModel(TransformerModel):
    """Encoder-decoder whose stacks run shared blocks over levels (see ``RecurrentStack``)."""

    @classmethod
    def add_args(cls, parser) -> None:
        super().add_args(parser)
        add_recurrent_args(parser)

    @classmethod
    def build_model(cls, args: Any, task) -> RecurrentTransformerModel:
        recurrent_base_architecture(args)
        encoder_cfg, decoder_cfg = stack_configs(args)  # fails fast, naming the setting
        for name in ("max_source_positions", "max_target_positions"):
            if getattr(args, name, None) is None:
                setattr(args, name, 1024)
        src_dict, tgt_dict = task.source_dictionary, task.target_dictionary
        if args.share_all_embeddings:
            if src_dict != tgt_dict:
                raise ValueError("--share-all-embeddings requires a joined dictionary")
            encoder_embed = cls.build_embedding(
                args, src_dict, args.encoder_embed_dim, args.encoder_embed_path
            )
            decoder_embed = encoder_embed
            args.share_decoder_input_output_embed = True
        else:
            encoder_embed = cls.build_embedding(
                args, src_dict, args.encoder_embed_dim, args.encoder_embed_path
            )
            decoder_embed = cls.build_embedding(
                args, tgt_dict, args.decoder_embed_dim, args.decoder_embed_path
            )
        encoder = RecurrentEncoder(args, src_dict, encoder_embed, encoder_cfg)
        decoder = RecurrentDecoder(args, tgt_dict, decoder_embed, decoder_cfg)
        return cls(args, encoder, decoder)


def recurrent_base_architecture(args: Any) -> None:
    """Defaults of every recurnmt option: a vanilla Transformer built from our blocks."""
    args.encoder_unique_layers = getattr(args, "encoder_unique_layers", None)
    args.decoder_unique_layers = getattr(args, "decoder_unique_layers", None)
    args.sharing_scheme = getattr(args, "sharing_scheme", None) or "cycle"
    args.layer_norms = getattr(args, "layer_norms", None) or "per-block"
    args.level_signal = getattr(args, "level_signal", None) or "none"
    args.level_signal_rank = getattr(args, "level_signal_rank", None)
    args.attn_signal = getattr(args, "attn_signal", None) or "after"
    args.ffn_signal = getattr(args, "ffn_signal", None) or "input"
    base_architecture(args)
