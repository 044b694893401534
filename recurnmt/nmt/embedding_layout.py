"""Which embedding matrices a translation model has: fairseq's layouts and RingFormer A.1's.

fairseq offers two kinds of tying: ``--share-decoder-input-output-embed`` (the decoder's input
embedding is its output projection) and ``--share-all-embeddings`` (one matrix for the encoder
input, the decoder input and the output projection). RingFormer appendix A.1 counts a third
layout, which fairseq cannot express: the encoder and decoder share one input embedding (26.62M
parameters at H=512 with the 52K BiBERT vocabulary, RingFormer Table 1) and the vocabulary head
is a separate linear layer with a bias (26.67M = 52,000 x 512 + 52,000).

``--share-encoder-decoder-embeddings`` selects that layout (one input embedding, joined
dictionary, untied head) and ``--output-projection-bias`` gives the head its bias; the A.1
recipes set both. :func:`check_embedding_layout` refuses the combinations that contradict
each other, naming the flag.
"""

from __future__ import annotations

import argparse
from typing import Any

from recurnmt.modules.config import ConfigError

SHARE_FLAG = "--share-encoder-decoder-embeddings"
BIAS_FLAG = "--output-projection-bias"


def add_embedding_layout_args(parser: argparse.ArgumentParser) -> None:
    """Adds the A.1 layout flags (both off by default: fairseq's layouts are unchanged)."""
    parser.add_argument(
        SHARE_FLAG,
        action="store_true",
        default=None,
        help="one token embedding for the encoder and decoder inputs (joined dictionary) "
        "and a separate, untied output projection (RingFormer appendix A.1)",
    )
    parser.add_argument(
        BIAS_FLAG,
        action="store_true",
        default=None,
        help="a bias on the output projection (the vocabulary head of RingFormer Table 1)",
    )


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
