"""The ``transformers`` configuration of an exported recurnmt translation model.

It holds what :mod:`recurnmt.modules` needs to rebuild the two stacks (each side's
:class:`~recurnmt.modules.StackConfig` as a dictionary), and what fairseq's embedding front end
and output layer did around them (``recurnmt.nmt.embedding.TokenEmbedding``, the decoder's
output projection): scaling, positions, the embedding layout and fairseq's special symbols.
"""

from __future__ import annotations

from typing import Any

from transformers import PretrainedConfig

from recurnmt.modules import StackConfig
from recurnmt.modules.tokens import TokenConfig

MODEL_TYPE = "recurnmt"


def stack_config_to_dict(cfg: StackConfig) -> dict[str, Any]:
    """A JSON-able dictionary of ``cfg``: its options by name, ``signal.*`` under
    ``signal`` (tuples become lists). The layout of every export since the first: the options
    kept their names when the configuration was grouped into parts."""
    return cfg.to_dict()


def stack_config_from_dict(values: dict[str, Any]) -> StackConfig:
    """The :class:`StackConfig` of :func:`stack_config_to_dict`'s output (any export's)."""
    return StackConfig.from_dict(values)


class RecurnmtConfig(PretrainedConfig):
    """Configuration of :class:`~recurnmt.hf.modeling.RecurnmtForConditionalGeneration`.

    Attributes:
        vocab_size: entries of the (joined) fairseq dictionary.
        d_model: model width H.
        encoder_stack: the encoder's StackConfig (:func:`stack_config_to_dict`).
        decoder_stack: the decoder's StackConfig.
        encoder_levels: elastic depth of the encoder (None: as built).
        decoder_levels: elastic depth of the decoder.
        max_source_positions: longest source (fairseq's ``--max-source-positions``).
        max_target_positions: longest target.
        scale_embedding, positions, layernorm_embedding: both sides' token front end, the
            fields of :class:`~recurnmt.modules.tokens.TokenConfig` (:attr:`tokens`). The
            biases of the attention and FFN projections (--block-bias) and the level signals'
            initialisation are in the stacks' ``StackConfig`` (``bias``, ``signal.down_init``).
        share_input_embeddings: one token embedding for the encoder and decoder inputs.
        tie_output_projection: the output projection is the decoder's input embedding.
        output_projection_bias: the output projection has a bias (RingFormer A.1).
        fairseq_arch: the fairseq architecture the model was trained as.
    """

    model_type = MODEL_TYPE
    attribute_map = {"hidden_size": "d_model"}

    vocab_size: int = 8
    d_model: int = 512
    encoder_stack: dict | None = None
    decoder_stack: dict | None = None
    encoder_levels: int | None = None
    decoder_levels: int | None = None
    max_source_positions: int = 1024
    max_target_positions: int = 1024
    scale_embedding: bool = True
    positions: str = "sinusoidal"
    layernorm_embedding: bool = False
    share_input_embeddings: bool = False
    tie_output_projection: bool = False
    output_projection_bias: bool = False
    fairseq_arch: str | None = None
    is_encoder_decoder: bool = True
    # shared modules (embeddings, One Wide FFN's FFN) are declared tied by the model itself
    tie_word_embeddings: bool = True
    use_cache: bool = True
    # fairseq's Dictionary: <s>=0, <pad>=1, </s>=2, <unk>=3; decoding starts from </s>
    bos_token_id: int | None = 0
    pad_token_id: int | None = 1
    eos_token_id: int | list[int] | None = 2
    unk_token_id: int | None = 3
    decoder_start_token_id: int | None = 2

    @property
    def tokens(self) -> TokenConfig:
        """Both sides' token front end."""
        return TokenConfig.from_dict(self.to_dict())

    def stack_config(self, side: str) -> StackConfig:
        """The :class:`StackConfig` of ``side`` (``encoder`` or ``decoder``)."""
        values = getattr(self, f"{side}_stack")
        if values is None:
            raise ValueError(f"the configuration has no {side}_stack")
        return stack_config_from_dict(values)


__all__ = ["MODEL_TYPE", "RecurnmtConfig", "stack_config_from_dict", "stack_config_to_dict"]
