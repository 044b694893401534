"""Command-line options of the recurnmt translation models, and their translation to stacks.

fairseq's own transformer flags keep their meaning (``--encoder-layers`` is the number of
levels N, ``--encoder-embed-dim`` the width, ...): :data:`FAIRSEQ_ARGS` says which stack
option each sets. recurnmt's flags are declared once: a stack option's on its part config
(:mod:`recurnmt.modules.config`: the flag, its help and choices, its default), the model's
other settings as :class:`~recurnmt.flags.Flag` entries (:data:`MODEL_FLAGS`,
:data:`~recurnmt.nmt.embedding_layout.LAYOUT_FLAGS`). The parser group
(:func:`add_recurrent_args`), the defaults (:func:`recurnmt_defaults`), the option -> flag map
(:func:`flags_of_fields`) and the stacks (:func:`stack_configs`, the only reader of the
options) are derived from those declarations, and the tests check that each flag changes the
model.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from recurnmt.flags import (
    CHECKPOINT_SEGMENT,
    COMPILE,
    COMPILE_MODE,
    MIXED_DEPTH,
    Flag,
    add_flags,
    defaults,
    levels_flag,
)
from recurnmt.modules.config import ConfigError, StackConfig, option_declarations
from recurnmt.nmt.embedding_layout import LAYOUT_FLAGS

SIDES = ("encoder", "decoder")

# stack options that fairseq's transformer flags set ({side}: encoder or decoder)
FAIRSEQ_ARGS: dict[str, str] = {
    "embed_dim": "{side}_embed_dim",
    "ffn_dim": "{side}_ffn_embed_dim",
    "num_heads": "{side}_attention_heads",
    "num_levels": "{side}_layers",
    "normalize_before": "{side}_normalize_before",
    "dropout": "dropout",
    "attention_dropout": "attention_dropout",
    "activation_dropout": "activation_dropout",
    "activation": "activation_fn",
}


def _fixed(side: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """The stack options no flag sets that a translation stack of ``side`` sets otherwise than
    their declared defaults (every other flagless option keeps its default: no drop path,
    fairseq's LayerNorm eps 1e-5, SReT's sliced encoder attention as its Algorithm 1)."""
    decoder = side == "decoder"
    return {
        "cross_attention": decoder,
        "causal": decoder,
        "final_norm": options["normalize_before"],  # as fairseq's: after pre-LN stacks only
    }


MODEL_FLAGS = (
    CHECKPOINT_SEGMENT,
    MIXED_DEPTH,  # and --compile, --compile-mode, --checkpoint-segment: every front end's
    Flag(
        "--mixed-depth-levels",
        "first-loop",
        dict(
            metavar="R",
            help="with --mixed-depth on, the shallow pass: first-loop (SReT's branch, every "
            "block once on both sides), R (the decoder's first R levels over the full "
            "encoder: the draft that --draft-levels R decodes with) or random (R drawn from "
            "1 .. N-1 for every batch, as LayerSkip's early exits)",
        ),
    ),
    COMPILE,
    COMPILE_MODE,
    *(levels_flag(side) for side in SIDES),
)
"""The model's flags that are no stack options."""


def _dest(flag: str) -> str:
    return flag[2:].replace("-", "_")


def _flag(arg: str) -> str:
    """The command-line flag of a fairseq argument: ``encoder_layers`` -> ``--encoder-layers``."""
    return "--" + arg.replace("_", "-")


def arg_of(option: str, side: str) -> str | None:
    """The fairseq argument that sets ``option`` of the ``side`` stack (None: no flag does,
    or only the other side's, as ``--encoder-attn-groups``)."""
    if option in FAIRSEQ_ARGS:
        return FAIRSEQ_ARGS[option].format(side=side)
    flag = option_declarations()[option].option.flag
    if flag is None:
        return None
    other = SIDES[1 - SIDES.index(side)]
    if flag.startswith(f"--{other}-"):
        return None
    return _dest(flag.replace("{side}", side))


def _recurnmt_flags() -> Iterator[tuple[str, str, Any]]:
    """``(flag, option name, help)`` of every stack option with a flag of recurnmt's, in
    declaration order; a flag per side is given for both sides."""
    for name, where in option_declarations().items():
        flag = where.option.flag
        if flag is None:
            continue
        for side in SIDES if "{side}" in flag else (None,):
            if side is None:
                yield flag, name, where.option.help
            else:
                yield flag.replace("{side}", side), name, where.option.help.replace("{side}", side)


def add_recurrent_args(parser: argparse.ArgumentParser) -> None:
    """Adds recurnmt's options (fairseq hands models an argument group); their defaults are
    :data:`recurnmt.nmt.defaults.BASE`."""
    for flag, name, help in _recurnmt_flags():
        kwargs = option_declarations()[name].option.argparse_kwargs() | {"help": help}
        parser.add_argument(flag, **kwargs)
    add_flags(parser, MODEL_FLAGS)
    add_flags(parser, LAYOUT_FLAGS)


def option_text(option: str, value: Any) -> Any:
    """The flag's spelling of ``value`` of ``option`` (``True`` -> ``on``, ...)."""
    where = option_declarations()[option]
    return where.option.to_text(value) if where.option.flag else value


def recurnmt_defaults() -> dict[str, Any]:
    """``{argument: default}`` of every recurnmt flag: a stack option's is its field's default,
    as the flag spells it (so a model built with no flag is a plain stack)."""
    default = StackConfig().options()
    stack = {_dest(flag): option_text(name, default[name]) for flag, name, _ in _recurnmt_flags()}
    return stack | defaults(MODEL_FLAGS) | defaults(LAYOUT_FLAGS)


def flag_values(changes: Mapping[str, Any], side: str) -> dict[str, Any]:
    """``{argument: value}`` that set the options ``changes`` of the ``side`` stack (options
    that no flag of that side sets are left out)."""
    out = {}
    for option, value in changes.items():
        arg = arg_of(option, side)
        if arg is not None:
            out[arg] = option_text(option, value)
    return out


# fairseq transformer options that the recurrent models do not implement: refusing them
# beats silently training something else.
_UNSUPPORTED = {
    "adaptive_softmax_cutoff": "adaptive softmax",
    "encoder_layers_to_keep": "layer pruning",
    "decoder_layers_to_keep": "layer pruning",
    "cross_self_attention": "cross+self attention",
    "no_cross_attention": "decoders without cross-attention",
    "quant_noise_pq": "quantization noise",
    "encoder_layerdrop": "LayerDrop",
    "decoder_layerdrop": "LayerDrop",
    "tie_adaptive_weights": "adaptive input/softmax",
    "adaptive_input": "adaptive input",
}


def check_supported(args: Any) -> None:
    """Raises :class:`ConfigError` for settings that cannot work.

    Covers fairseq options the recurrent models do not implement. Half precision without
    CUDA and multi-process mistakes are refused by :func:`recurnmt.nmt.distributed_checks.check_distributed`.
    """
    for name, what in _UNSUPPORTED.items():
        value = getattr(args, name, None)
        if value not in (None, False, 0, 0.0, ""):
            raise ConfigError(_flag(name), value, f"{what} is not supported by recurnmt models")


def flags_of_fields(side: str) -> dict[str, str]:
    """Stack option -> the command-line flag that sets it, for the ``side`` stack."""
    args = {name: arg_of(name, side) for name in option_declarations()}
    return {name: _flag(arg) for name, arg in args.items() if arg is not None}


def stack_configs(args: Any) -> tuple[StackConfig, StackConfig]:
    """Encoder and decoder :class:`StackConfig` from fairseq arguments.

    Raises:
        ConfigError: an impossible setting, named by its command-line flag.
    """
    check_supported(args)
    if args.decoder_embed_dim != args.encoder_embed_dim:
        raise ConfigError(
            "--decoder-embed-dim",
            args.decoder_embed_dim,
            "must equal {--encoder-embed-dim} (cross-attention reads the encoder)",
            {"--encoder-embed-dim": args.encoder_embed_dim},
        )
    return _side_config(args, "encoder"), _side_config(args, "decoder")


def side_options(args: Any, side: str) -> dict[str, Any]:
    """Every stack option of the ``side`` stack, read from ``args``: a flag's value, or
    :func:`_fixed`'s, or its declared default (no flag, or only the other side's).

    Raises:
        ConfigError: a value the flag does not take, naming the option.
    """
    declared = StackConfig().options()
    values: dict[str, Any] = {}
    for name, where in option_declarations().items():
        arg = arg_of(name, side)
        if arg is not None:
            values[name] = where.option.to_value(name, getattr(args, arg), values)
    values |= _fixed(side, values)
    return {name: values.get(name, declared[name]) for name in option_declarations()}


def stack_config(options: Mapping[str, Any]) -> StackConfig:
    """The stack of ``options`` (every option given: none is left to StackConfig)."""
    return StackConfig.from_options(**options)


def _side_config(args: Any, side: str) -> StackConfig:
    with flags_in_errors(side):
        return stack_config(side_options(args, side))


@contextmanager
def flags_in_errors(side: str) -> Iterator[None]:
    """Re-raises a :class:`ConfigError` about a stack option naming its ``side`` flag instead.

    Wraps whatever validates a side's stack: its config, and building the stack (plan-level
    checks such as one ``--encoder-attn-groups`` entry per loop).
    """
    try:
        yield
    except ConfigError as err:
        raise err.renamed(flags_of_fields(side)) from None
