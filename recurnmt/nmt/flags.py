"""Command-line options of the recurnmt translation models, and their translation to stacks.

Every setting is declared once, with a neutral name (:mod:`recurnmt.modules.declarations`): a
stack option on its part config (:mod:`recurnmt.modules.config`: its help, choices, parser and
default), the model's other settings as lone options (:data:`MODEL_FLAGS`,
:data:`~recurnmt.nmt.embedding_layout.LAYOUT_FLAGS`). This module spells them as
``fairseq-train`` flags:

* fairseq's own transformer flags keep their meaning (``--encoder-layers`` is the number of
  levels N, ``--encoder-embed-dim`` the width, ...): :data:`FAIRSEQ_ARGS` says which stack
  option each sets;
* every other stack option with a help text has a flag of recurnmt's, by the rule: ``--`` and
  the option's name with ``-`` (:func:`recurnmt.flags.spell`), after ``--encoder-`` and
  ``--decoder-`` for the options set per side (:data:`PER_SIDE`; :data:`ONE_SIDE`: one side
  only), or the spelling of :data:`SPELLINGS`, the flags of today that do not follow the rule;
* the lone options by the rule.

The parser group (:func:`add_recurrent_args`), the defaults (:func:`recurnmt_defaults`), the
option -> flag map (:func:`flags_of_fields`, which renames the block library's errors) and the
stacks (:func:`stack_configs`, the only reader of the options) are derived from those
declarations, and the tests check that each flag changes the model.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import field, make_dataclass
from typing import Any, Optional

from recurnmt.flags import (
    CHECKPOINT_SEGMENT,
    COMPILE,
    COMPILE_MODE,
    MIXED_DEPTH,
    add_options,
    defaults,
    levels_flag,
    spell,
)
from recurnmt.modules.config import ConfigError, StackConfig, option_declarations
from recurnmt.modules.declarations import Option
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
# stack options with a flag per side (--encoder-NAME, --decoder-NAME); the others' one flag
# sets both sides
PER_SIDE = ("num_unique", "ffn_sharing")
# stack options with a flag for one side only (the other side keeps the declared default)
ONE_SIDE = {"attn_groups": "encoder"}  # sliced attention: encoders only
# the flags of today that do not follow the rule, option name -> the flag without ``--`` and
# its side (the blocks M of --encoder-unique-layers, the level signals' --level-signal*, ...)
SPELLINGS: dict[str, str] = {
    "num_unique": "unique-layers",
    "sharing": "sharing-scheme",
    "bias": "block-bias",
    "norms_per_level": "layer-norms",
    "signal.kind": "level-signal",
    "signal.rank": "level-signal-rank",
    "signal.attn": "attn-signal",
    "signal.ffn": "ffn-signal",
    "signal.down_init": "level-signal-down-init",
    "signal.down_std": "level-signal-down-std",
    "positions_every_level": "positions",
    "lora_rank": "level-lora-rank",
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
    Option(
        "with --mixed-depth on, the shallow pass: first-loop (SReT's branch, every block once "
        "on both sides), R (the decoder's first R levels over the full encoder: the draft that "
        "--draft-levels R decodes with) or random (R drawn from 1 .. N-1 for every batch, as "
        "LayerSkip's early exits)",
        name="mixed_depth_levels",
        default="first-loop",
        metavar="R",
    ),
    COMPILE,
    COMPILE_MODE,
    *(levels_flag(side) for side in SIDES),
)
"""The model's flags that are no stack options."""


def fairseq_config(name: str, options: tuple[Option, ...], base: type) -> type:
    """A fairseq dataclass ``name`` (a subclass of ``base``, a ``FairseqDataclass`` such as
    ``TranslationConfig``) whose fields are lone ``options`` (a
    :meth:`~recurnmt.modules.declarations.Settings.declarations`): fairseq makes their flags by
    the rule (``draft_tokens`` -> ``--draft-tokens``) with their defaults and help; a switch
    (``action="store_true"``) is a bool, an option with a ``type`` that type, else text.
    Types are real ones, not strings: fairseq reads them to build its parser."""
    fields = []
    for option in options:
        if option.action == "store_true":
            kind: Any = bool
        else:
            kind = option.type or str
            kind = Optional[kind] if option.default is None else kind  # noqa: UP045
        meta = {"help": option.help}
        fields.append(
            (option.dest, kind, field(default=option.to_text(option.default), metadata=meta))
        )
    return make_dataclass(name, fields, bases=(base,))


def _dest(flag: str) -> str:
    return flag[2:].replace("-", "_")


def _flag(arg: str) -> str:
    """The command-line flag of a fairseq argument: ``encoder_layers`` -> ``--encoder-layers``."""
    return "--" + arg.replace("_", "-")


def has_flag(option: str) -> bool:
    """Whether the stack option ``option`` has a flag of recurnmt's: one with a help text
    that fairseq's own flags do not set."""
    return option not in FAIRSEQ_ARGS and bool(option_declarations()[option].option.help)


def flag_of(option: str, side: str | None = None) -> str | None:
    """recurnmt's flag of the stack option ``option`` (of the ``side`` stack, for a flag per
    side; None: the option has none, or only the other side has one)."""
    if not has_flag(option):
        return None
    word = SPELLINGS.get(option) or spell(option)[2:]
    if option in ONE_SIDE:
        return f"--{ONE_SIDE[option]}-{word}" if side in (None, ONE_SIDE[option]) else None
    if option in PER_SIDE:
        return None if side is None else f"--{side}-{word}"
    return f"--{word}"


def arg_of(option: str, side: str) -> str | None:
    """The fairseq argument that sets ``option`` of the ``side`` stack (None: no flag does,
    or only the other side's, as ``--encoder-attn-groups``)."""
    if option in FAIRSEQ_ARGS:
        return FAIRSEQ_ARGS[option].format(side=side)
    flag = flag_of(option, side)
    return None if flag is None else _dest(flag)


def _recurnmt_flags() -> Iterator[tuple[str, str, str]]:
    """``(flag, option name, help)`` of every stack option with a flag of recurnmt's, in
    declaration order; a flag per side is given for both sides."""
    for name, where in option_declarations().items():
        if not has_flag(name):
            continue
        for side in SIDES if name in PER_SIDE else (ONE_SIDE.get(name, "encoder"),):
            names = flags_of_fields(side) | {"side": side}
            if name not in PER_SIDE and name not in ONE_SIDE:
                names["side"] = "encoder and decoder"
            yield flag_of(name, side), name, where.option.help_in(names)


def add_stack_flags(parser: argparse.ArgumentParser, names: tuple[str, ...]) -> None:
    """Adds the flags of the stack options ``names`` (unset: the architecture's defaults)."""
    for flag, name, help in _recurnmt_flags():
        if name in names:
            kwargs = option_declarations()[name].option.argparse_kwargs() | {"help": help}
            parser.add_argument(flag, **kwargs)


def add_recurrent_args(parser: argparse.ArgumentParser) -> None:
    """Adds recurnmt's options (fairseq hands models an argument group); their defaults are
    :data:`recurnmt.nmt.defaults.BASE`."""
    add_stack_flags(parser, tuple(option_declarations()))
    add_options(parser, MODEL_FLAGS)
    add_options(parser, LAYOUT_FLAGS)


def option_text(option: str, value: Any) -> Any:
    """The flag's spelling of ``value`` of ``option`` (``True`` -> ``on``, ...)."""
    where = option_declarations()[option]
    return where.option.to_text(value) if has_flag(option) else value


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
    """Stack option -> the command-line flag that sets it, for the ``side`` stack (fairseq's
    or recurnmt's: the names in which translation reports the block library's errors)."""
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
