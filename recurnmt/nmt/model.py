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

from recurnmt.modules import ConfigError
from recurnmt.nmt.decoder import RecurrentDecoder
from recurnmt.nmt.distributed_checks import check_distributed
from recurnmt.nmt.encoder import RecurrentEncoder
from recurnmt.nmt.options import add_recurrent_args, stack_configs
from recurnmt.nmt.registry import register_model_once

MODEL_NAME = "recurrent_transformer"
RECURRENT_CRITERION = "recurrent_label_smoothed_cross_entropy"


@register_model_once(MODEL_NAME)
class RecurrentTransformerModel(TransformerModel):
    """Encoder-decoder whose stacks run shared blocks over levels (see ``RecurrentStack``)."""

    @classmethod
    def add_args(cls, parser) -> None:
        super().add_args(parser)
        add_recurrent_args(parser)

    @classmethod
    def build_model(cls, args: Any, task) -> RecurrentTransformerModel:
        check_distributed(args)  # refuse fairseq's silent multi-process failure modes
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
        model = cls(args, encoder, decoder)
        criterion = getattr(args, "criterion", None)
        if (args.act == "on" or args.mixed_depth == "on") and criterion not in (
            None,
            RECURRENT_CRITERION,
        ):
            raise ConfigError(
                f"--act/--mixed-depth need --criterion {RECURRENT_CRITERION} "
                f"(got --criterion {criterion}), which adds the ponder cost and the shallow "
                "branch loss"
            )
        return model

    @property
    def mixed_depth(self) -> bool:
        """SReT mixed-depth training is on (appendix B)."""
        return getattr(self.args, "mixed_depth", "off") == "on"

    def forward(
        self,
        src_tokens,
        src_lengths,
        prev_output_tokens,
        return_all_hiddens: bool = True,
        features_only: bool = False,
        alignment_layer: int | None = None,
        alignment_heads: int | None = None,
        shallow: bool = False,
    ):
        """fairseq's encoder-decoder forward; ``shallow`` runs SReT's shallow branch."""
        encoder_out = self.encoder(
            src_tokens, src_lengths, return_all_hiddens=return_all_hiddens, shallow=shallow
        )
        x, extra = self.decoder(
            prev_output_tokens,
            encoder_out=encoder_out,
            features_only=features_only,
            src_lengths=src_lengths,
            return_all_hiddens=return_all_hiddens,
            shallow=shallow,
        )
        if encoder_out["ponder"]:
            extra["encoder_ponder"] = encoder_out["ponder"]  # for the ACT criterion
        return x, extra


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
    args.encoder_ffn_sharing = getattr(args, "encoder_ffn_sharing", None) or "block"
    args.decoder_ffn_sharing = getattr(args, "decoder_ffn_sharing", None) or "block"
    args.positions = getattr(args, "positions", None) or "input"
    args.act = getattr(args, "act", None) or "off"
    args.act_threshold = _default(args, "act_threshold", 0.99)
    args.act_bias_init = _default(args, "act_bias_init", 1.0)
    args.lrc = getattr(args, "lrc", None) or "none"
    args.nll_ratio = _default(args, "nll_ratio", 0.0)
    args.encoder_attn_groups = getattr(args, "encoder_attn_groups", None) or ()
    args.mixed_depth = getattr(args, "mixed_depth", None) or "off"
    base_architecture(args)


def _default(args: Any, name: str, value: float) -> float:
    current = getattr(args, name, None)
    return value if current is None else current
