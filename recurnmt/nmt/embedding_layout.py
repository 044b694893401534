"""Which embedding matrices a translation model has: fairseq's layouts and RingFormer A.1's.

fairseq offers two kinds of tying: ``--share-decoder-input-output-embed`` (the decoder's input
embedding is its output projection) and ``--share-all-embeddings`` (one matrix for the encoder
input, the decoder input and the output projection). RingFormer Table 1's counts ("encoder/
decoder embeddings have 26.62M parameters", the vocabulary head 26.67M = 52,000 x 512 + 52,000
at H=512) also fit a third layout, which fairseq cannot express: the encoder and decoder share
one input embedding and the vocabulary head is a separate linear layer with a bias.

``--share-encoder-decoder-embeddings`` selects that layout (one input embedding, joined
dictionary, untied head) and ``--output-projection-bias`` gives the head its bias.
:func:`check_embedding_layout` refuses the combinations that contradict each other, naming the
flag.

The RingFormer authors' code (``src_translation/src/models/model_Ring.py``) builds yet another
layout, which fairseq does express: an encoder and a decoder embedding of their own over one
shared (BiBERT) vocabulary, and a separate ``nn.Linear`` head with a bias, i.e. fairseq's
default (no sharing flag) plus ``--output-projection-bias``. Read that way, Table 1's
"encoder/decoder embeddings have 26.62M parameters" counts each side's table; the
``*_bibert_*`` recipes follow the code.

The same code neither scales the token embeddings by sqrt(H) nor shrinks their initialisation:
its ``nn.Embedding`` starts at N(0, 1). fairseq scales by sqrt(H) an embedding initialised
N(0, 1/H), which gives the stack the same input at step 0 but trains the table at another rate
(and, tied to the output projection, starts the logits sqrt(H) times smaller).
``--scale-embedding off`` builds the authors' embeddings (:func:`authors_initialisation`);
``on`` (the default of every architecture) is fairseq's. fairseq's own
``--no-scale-embedding`` keeps fairseq's N(0, 1/H) tables and only drops the factor.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from recurnmt.flags import spell
from recurnmt.modules.config import ConfigError
from recurnmt.modules.declarations import Option

LAYOUT_FLAGS = (
    Option(
        "one token embedding for the encoder and decoder inputs (joined dictionary) and a "
        "separate, untied output projection (RingFormer appendix A.1)",
        name="share_encoder_decoder_embeddings",
        default=False,
        action="store_true",
    ),
    Option(
        "a bias on the output projection (the vocabulary head of RingFormer Table 1)",
        name="output_projection_bias",
        default=False,
        action="store_true",
    ),
    Option(
        "token embeddings initialised N(0, 1/H) and multiplied by sqrt(H), as fairseq's "
        "transformer (on, the default), or initialised N(0, 1) and not scaled, as RingFormer's "
        "code (off)",
        name="scale_embedding",
        default="on",  # fairseq's sqrt(H) on embeddings initialised N(0, 1/H)
        choices=("on", "off"),
    ),
)
"""The layout's flags (off by default: fairseq's layouts are unchanged)."""
SHARE_FLAG, BIAS_FLAG, SCALE_FLAG = (spell(option) for option in LAYOUT_FLAGS)


def scales_embedding(args: Any) -> bool:
    """Whether the token embeddings are scaled by sqrt(width): unless ``--scale-embedding off``
    or fairseq's ``--no-scale-embedding``."""
    return not (
        getattr(args, "no_scale_embedding", False)
        or getattr(args, "scale_embedding", "on") == "off"
    )


def authors_initialisation(args: Any, embedding: nn.Embedding) -> None:
    """Re-initialises a fresh token embedding as RingFormer's code (``--scale-embedding off``):
    N(0, 1), the padding row zero (PyTorch's ``nn.Embedding`` with ``padding_idx``). Does
    nothing with fairseq's scaling. Vectors read from a file go in afterwards
    (``RecurrentTransformerModel.build_embedding``).
    """
    if getattr(args, "scale_embedding", "on") != "off":
        return
    nn.init.normal_(embedding.weight, mean=0.0, std=1.0)
    if embedding.padding_idx is not None:
        nn.init.zeros_(embedding.weight[embedding.padding_idx])


def check_embedding_layout(args: Any, same_dictionary: bool) -> None:
    """Raises :class:`ConfigError` naming the flag when the layout flags contradict.

    Args:
        args: fairseq's arguments.
        same_dictionary: the source and target dictionaries are one (joined) dictionary.
    """
    tied = getattr(args, "share_all_embeddings", False) or getattr(
        args, "share_decoder_input_output_embed", False
    )
    if getattr(args, "output_projection_bias", False) and tied:
        flag = (
            "--share-all-embeddings"
            if args.share_all_embeddings
            else "--share-decoder-input-output-embed"
        )
        raise ConfigError(
            BIAS_FLAG,
            True,
            f"needs an output projection of its own, but {flag} ties it to the embeddings",
        )
    if not getattr(args, "share_encoder_decoder_embeddings", False):
        return
    for other in ("share_all_embeddings", "share_decoder_input_output_embed"):
        if getattr(args, other, False):
            flag = "--" + other.replace("_", "-")
            raise ConfigError(
                SHARE_FLAG,
                True,
                f"keeps the output projection untied, but {flag} ties it to the embeddings; "
                f"use one of the two ({flag} alone for fairseq's tying)",
            )
    if not same_dictionary:
        raise ConfigError(
            SHARE_FLAG,
            True,
            "needs one joined dictionary for both languages (fairseq-preprocess "
            "--joined-dictionary, or data_prep's commands)",
        )
    if getattr(args, "encoder_embed_path", None) != getattr(args, "decoder_embed_path", None):
        raise ConfigError(
            SHARE_FLAG,
            True,
            "shares one embedding, so {--encoder-embed-path} and {--decoder-embed-path} "
            "must be the same file",
            {
                "--encoder-embed-path": args.encoder_embed_path,
                "--decoder-embed-path": args.decoder_embed_path,
            },
        )
