"""The recurnmt encoder-decoder model, registered with fairseq.

It subclasses fairseq's legacy (argparse) ``TransformerModel``, so every fairseq transformer
option, the embedding sharing logic and the generation interface stay as users know them;
only the encoder and decoder are ours. Architectures (``ringformer_wmt_en_de``, ...) live in
:mod:`recurnmt.nmt.architectures`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from fairseq import utils
from fairseq.models.transformer import TransformerModel
from torch import nn

from recurnmt.flags import checkpoint_segment, compile_settings, levels_flag, spell
from recurnmt.modules import ConfigError, RecurrentStack, build_stack, shallow_branch
from recurnmt.modules.mixed_depth import first_levels
from recurnmt.nmt.decoder import RecurrentDecoder
from recurnmt.nmt.defaults import fill_arch_defaults
from recurnmt.nmt.distributed_checks import check_distributed
from recurnmt.nmt.embedding_layout import authors_initialisation, check_embedding_layout
from recurnmt.nmt.encoder import RecurrentEncoder
from recurnmt.nmt.flags import SIDES, add_recurrent_args, flags_in_errors, stack_configs
from recurnmt.nmt.registry import MODEL_NAME, RECURRENT_CRITERION, register_model_once

__all__ = [
    "MODEL_NAME",
    "RECURRENT_CRITERION",
    "RecurrentTransformerModel",
    "check_model_args",
    "check_run_flags",
]


@register_model_once(MODEL_NAME)
class RecurrentTransformerModel(TransformerModel):
    """Encoder-decoder whose stacks run shared blocks over levels (see ``RecurrentStack``)."""

    @classmethod
    def add_args(cls, parser) -> None:
        super().add_args(parser)
        add_recurrent_args(parser)

    @classmethod
    def build_embedding(cls, args: Any, dictionary, embed_dim: int, path=None) -> nn.Embedding:
        """fairseq's token embedding, initialised as RingFormer's code with
        ``--scale-embedding off`` (see :mod:`recurnmt.nmt.embedding_layout`); the vectors of
        ``path`` (fairseq's ``--*-embed-path``) are loaded over either initialisation."""
        embedding = super().build_embedding(args, dictionary, embed_dim, None)
        authors_initialisation(args, embedding)
        if path:
            utils.load_embedding(utils.parse_embedding(path), dictionary, embedding)
        return embedding

    @classmethod
    def build_model(cls, args: Any, task) -> RecurrentTransformerModel:
        check_distributed(args)  # refuse fairseq's silent multi-process failure modes
        # fairseq ran the architecture function already (also on a checkpoint's saved
        # arguments), so this fills nothing then; it serves callers that did not
        fill_arch_defaults(args)
        check_run_flags(args)
        encoder_cfg, decoder_cfg = stack_configs(args)  # fails fast, naming the setting
        compiled = compile_settings(
            getattr(args, "compile", None), getattr(args, "compile_mode", None)
        )
        for name in ("max_source_positions", "max_target_positions"):
            if getattr(args, name, None) is None:  # as fairseq's TransformerModel does
                setattr(args, name, 1024)
        src_dict, tgt_dict = task.source_dictionary, task.target_dictionary
        check_embedding_layout(args, src_dict == tgt_dict)
        if args.share_encoder_decoder_embeddings:  # RingFormer A.1: the head stays untied
            encoder_embed = cls.build_embedding(
                args, src_dict, args.encoder_embed_dim, args.encoder_embed_path
            )
            decoder_embed = encoder_embed
        elif args.share_all_embeddings:
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
        with flags_in_errors("encoder"):
            encoder = RecurrentEncoder(args, src_dict, encoder_embed, encoder_cfg)
        with flags_in_errors("decoder"):
            decoder = RecurrentDecoder(args, tgt_dict, decoder_embed, decoder_cfg)
        model = cls(args, encoder, decoder)
        offload = bool(getattr(args, "offload_activations", False))
        segment = checkpoint_segment(getattr(args, "checkpoint_segment", "0"))
        if offload or getattr(args, "checkpoint_activations", False):
            # fairseq's flags, per level of our stacks (fairseq's --offload-activations
            # implies --checkpoint-activations)
            for side in (encoder, decoder):
                side.stack.set_grad_checkpointing(True, offload=offload, segment=segment)
        for side in (encoder, decoder):
            side.stack.set_compile(compiled)
        for side, name in zip((encoder, decoder), SIDES, strict=True):
            set_depth(side.stack, name, getattr(args, levels_flag(name).dest, None))
        mixed_depth_levels(args, decoder.stack.num_levels)  # checked now, named in the error
        return model

    @property
    def mixed_depth(self) -> bool:
        """SReT mixed-depth training is on (appendix B)."""
        return getattr(self.args, "mixed_depth", "off") == "on"

    @contextmanager
    def shallow_pass(self) -> Iterator[RecurrentTransformerModel]:
        """The mixed-depth loss's shallow pass (``--mixed-depth-levels``): SReT's branch (every
        block once, both sides), or the decoder's first R levels over the full encoder (the
        draft of self-speculative decoding, R fixed or drawn for every batch)."""
        levels = mixed_depth_levels(self.args, self.decoder.stack.num_levels)
        if levels == "first-loop":
            with shallow_branch(self):
                yield self
            return
        if levels == "random":  # fairseq seeds torch's generator for every update
            levels = int(torch.randint(1, len(self.decoder.stack.active_levels), ()))
        with first_levels(self.decoder.stack, levels):
            yield self

    def forward(
        self,
        src_tokens,
        src_lengths,
        prev_output_tokens,
        return_all_hiddens: bool = False,
        features_only: bool = False,
        alignment_layer: int | None = None,
        alignment_heads: int | None = None,
    ):
        """fairseq's encoder-decoder forward (SReT's shallow branch within
        :func:`~recurnmt.modules.shallow_branch`).

        ``return_all_hiddens`` defaults to False where fairseq's transformer says True:
        nothing in training reads every level's output, and keeping them all alive would
        undo activation checkpointing (memory linear in depth whatever is recomputed).
        """
        encoder_out = self.encoder(src_tokens, src_lengths, return_all_hiddens=return_all_hiddens)
        x, extra = self.decoder(
            prev_output_tokens,
            encoder_out=encoder_out,
            features_only=features_only,
            src_lengths=src_lengths,
            return_all_hiddens=return_all_hiddens,
        )
        if encoder_out["ponder"]:
            extra["encoder_ponder"] = encoder_out["ponder"]  # for the ACT criterion
        return x, extra


def set_depth(stack: RecurrentStack, side: str, depth: int | None) -> None:
    """``--{side}-levels``: the ``side`` stack runs ``depth`` levels (None: as built).

    Raises:
        ConfigError: a depth the stack cannot run, naming the flag.
    """
    try:
        stack.set_depth(depth)
    except ConfigError as err:
        raise err.renamed({"levels": spell(levels_flag(side))}) from None


def check_run_flags(args: Any) -> None:
    """Refuses, naming the flag, a way of training the model that cannot work: a
    ``--checkpoint-segment`` without ``--checkpoint-activations``, or ACT or mixed depth
    under a criterion that does not add their losses.

    Raises:
        ConfigError: naming the flag.
    """
    segment = checkpoint_segment(getattr(args, "checkpoint_segment", "0"))
    activations = getattr(args, "checkpoint_activations", False)
    if segment and not (activations or getattr(args, "offload_activations", False)):
        raise ConfigError("--checkpoint-segment", segment, "needs --checkpoint-activations")
    criterion = getattr(args, "criterion", None)
    on = [
        f"--{f.replace('_', '-')} on"
        for f in ("act", "mixed_depth")
        if getattr(args, f, "off") == "on"
    ]
    if on and criterion not in (None, RECURRENT_CRITERION):
        raise ConfigError(
            "--criterion",
            criterion,
            f"with {' and '.join(on)}, train with --criterion {RECURRENT_CRITERION} "
            "(it adds the ponder cost and the shallow-branch loss)",
        )


def check_model_args(args: Any) -> tuple[RecurrentStack, RecurrentStack]:
    """Refuses, naming the flag, what :meth:`RecurrentTransformerModel.build_model` would
    refuse of the model's settings, from the arguments alone: no dictionary, no weights, so
    before a command reads any data (fairseq-train's architecture function runs it as the
    command line is parsed; fairseq-generate's checks run it on a checkpoint's arguments).

    The stacks are built as the model builds them but on the meta device (no memory, no
    initialisation), at the depth ``--encoder-levels`` / ``--decoder-levels`` ask for.

    Args:
        args: fairseq's arguments, the architecture's defaults filled.

    Returns:
        The (encoder, decoder) stacks, on the meta device.

    Raises:
        ConfigError: an impossible setting, named by its command-line flag.
    """
    configs = stack_configs(args)
    compile_settings(getattr(args, "compile", None), getattr(args, "compile_mode", None))
    stacks = []
    for side, cfg in zip(SIDES, configs, strict=True):
        with flags_in_errors(side), torch.device("meta"):
            stack = build_stack(cfg)
        set_depth(stack, side, getattr(args, levels_flag(side).dest, None))
        stacks.append(stack)
    mixed_depth_levels(args, stacks[1].num_levels)
    return stacks[0], stacks[1]


def mixed_depth_levels(args: Any, levels: int) -> int | str:
    """``--mixed-depth-levels`` as ``first-loop``, ``random`` or a number of decoder levels.

    Raises:
        ConfigError: a value other than these, a depth not in 1 .. ``levels`` - 1, or a setting
            other than first-loop without ``--mixed-depth on``.
    """
    value = str(getattr(args, "mixed_depth_levels", "first-loop"))
    flag = "--mixed-depth-levels"
    if value != "first-loop" and getattr(args, "mixed_depth", "off") != "on":
        raise ConfigError(flag, value, "trains the shallow pass of --mixed-depth on; add it")
    if value in ("first-loop", "random"):
        if value == "random" and levels < 2:
            raise ConfigError(flag, value, f"the decoder has {levels} level: nothing shallower")
        return value
    if not value.isdigit() or not 1 <= int(value) < levels:
        raise ConfigError(
            flag, value, f"first-loop, random or a number of decoder levels 1 .. {levels - 1}"
        )
    return int(value)
