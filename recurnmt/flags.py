"""The command line's spelling of a setting, and the settings that are no stack option.

Every setting is an :class:`~recurnmt.modules.declarations.Option` (one declaration system,
:mod:`recurnmt.modules.declarations`); a command line spells it ``--`` and its name with ``-``
(:func:`spell`; translation adds ``--encoder-``/``--decoder-`` for per-side stack options and
keeps a table of the spellings of today that do not follow the rule, :mod:`recurnmt.nmt.flags`),
and :func:`add_options` adds it to a parser. The options here are the lone settings that more
than one front end takes, declared next to nothing else that reads them: the run modes
(:data:`RUN_MODES`: compilation, mixed depth and checkpoint segments, the same spelling and
meaning in ``fairseq-train`` and the image trainer), elastic depth (:func:`levels_flag`:
translation's model flags, the image evaluator, the export's config keys), and the settings both
relaxed-recursion converters take (:data:`CONVERSION_FLAGS`: the stack's own options, as it
declares them, and the initialisation). A translation model's other settings (the embedding
layout, the shallow pass of mixed depth) are options next to the code that reads them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from recurnmt.modules.config import ConfigError, option_declarations
from recurnmt.modules.declarations import Option
from recurnmt.modules.relaxed_init import INITS


def spell(option: Option | str) -> str:
    """The command line's flag of an option (or an option name): ``compile_mode`` ->
    ``--compile-mode``, ``signal.rank`` -> ``--signal-rank``."""
    name = option if isinstance(option, str) else option.name
    return "--" + name.replace("_", "-").replace(".", "-")


def add_options(
    parser,
    options: Iterable[Option],
    with_defaults: bool = False,
    aliases: Mapping[str, tuple[str, ...]] | None = None,
) -> None:
    """Adds ``options`` to ``parser`` (an ``argparse`` parser or group) as their flags.

    Args:
        parser: the parser or group.
        options: lone options (their names given).
        with_defaults: the flags' defaults are the declarations' (else unset: translation's
            architecture fills them, :func:`recurnmt.nmt.defaults.fill_defaults`, so that
            checkpoints saved before an option existed get it too).
        aliases: ``{option name: former spellings}`` that still work (shown in ``--help``).
    """
    for option in options:
        kwargs = option.argparse_kwargs()
        if with_defaults:
            kwargs["default"] = option.to_text(option.default)
        elif option.action == "store_true":
            kwargs["default"] = None  # unset, not False, until the architecture fills it
        parser.add_argument(
            spell(option),
            *(aliases or {}).get(option.name, ()),
            dest=option.dest,
            help=option.help,
            **kwargs,
        )


def defaults(options: Iterable[Option]) -> dict[str, Any]:
    """``{argument: default}`` of lone ``options``, as their flags spell them."""
    return {option.dest: option.to_text(option.default) for option in options}


COMPILE = Option(
    "torch.compile the model's stacks (training and full passes; step-by-step decoding stays "
    "eager) with BACKEND (default inductor; aot_eager compiles without generating code)",
    name="compile",
    default=None,  # eager
    nargs="?",
    const="inductor",
    metavar="BACKEND",
)
COMPILE_MODE = Option(
    "torch.compile mode with --compile (default, reduce-overhead, max-autotune)",
    name="compile_mode",
)
MIXED_DEPTH = Option(
    "SReT mixed-depth training (appendix B): also train a shallow pass under the same loss "
    "(translation: --mixed-depth-levels chooses it, SReT's branch by default, and the "
    "recurrent criterion adds it); --mixed-depth alone is on",
    name="mixed_depth",
    default="off",
    choices=("on", "off"),
    nargs="?",
    const="on",
)
CHECKPOINT_SEGMENT = Option(
    "with activation checkpointing (fairseq's --checkpoint-activations, the image trainer's "
    "too): also checkpoint every K levels as one segment (Chen et al. 2016), K a number or "
    "'sqrt' for ceil(sqrt(levels)): memory grows as sqrt(levels) instead of linearly, for one "
    "more forward pass; 0 (default) checkpoints each level only",
    name="checkpoint_segment",
    default="0",
    metavar="K",
)
RUN_MODES = (COMPILE, COMPILE_MODE, MIXED_DEPTH, CHECKPOINT_SEGMENT)
"""The run modes of every front end, spelt and meant alike."""


def compile_settings(backend: str | None, mode: str | None = None):
    """The :class:`~recurnmt.modules.compile.CompileSettings` of ``--compile [BACKEND]`` and
    ``--compile-mode`` (None: no compilation).

    Raises:
        ConfigError: an unknown backend or mode, or a mode without ``--compile``, naming the
            flag.
    """
    from recurnmt.modules.compile import from_flags

    if mode and not backend:
        raise ConfigError(spell(COMPILE_MODE), mode, f"needs {spell(COMPILE)}")
    try:
        return from_flags(backend, mode)
    except ConfigError as err:
        raise err.renamed({o.name: spell(o) for o in (COMPILE, COMPILE_MODE)}) from None


def levels_flag(side: str) -> Option:
    """Elastic depth of the ``side`` stack (``encoder``: an image model's one stack too):
    ``--{side}-levels K`` runs a trained weight-shared stack at K levels instead of its
    trained depth (the modules' ``set_depth``; the ``transformers`` export's config key
    ``{side}_levels``). The same spelling and meaning in ``fairseq-train``/``-generate``
    (through ``--model-overrides``) and the image evaluator."""
    return Option(
        f"run the {side} at K levels instead of its trained depth (elastic depth of a trained "
        f"shared model; in fairseq-generate: --model-overrides \"{{'{side}_levels': K}}\"); K "
        "beyond the trained depth needs parameter-free level parts (Universal Transformer); "
        "SReT: K = loops x blocks",
        name=f"{side}_levels",
        default=None,  # as built
        type=int,
        metavar="K",
    )


def checkpoint_segment(value: Any) -> int | str:
    """``--checkpoint-segment``: a number of levels >= 0, or ``"sqrt"``.

    Raises:
        ConfigError: anything else, naming the flag.
    """
    text = str(value).strip()
    if text == "sqrt":
        return text
    if text.isdigit():
        return int(text)
    raise ConfigError(spell(CHECKPOINT_SEGMENT), value, "must be a number of levels >= 0 or 'sqrt'")


def is_on(value: Any) -> bool:
    """A switch given as ``on``/``off`` (or a bool, from older saved arguments)."""
    return value is True or value == "on"


def _stack_option(name: str, as_name: str, target: bool) -> Option:
    """The stack option ``name`` as a converter's setting ``as_name``: its declaration (help,
    choices, parser, default) for the target's stacks; ``target``: unset (None), it is the
    target architecture's instead of the declared default."""
    declared = option_declarations()[name].option
    help = declared.help_in({"side": "target's", "num_levels": "the source's layers"})
    if not target:
        return dataclasses.replace(declared, name=as_name, help=help)
    help += "; default: the target architecture's"
    return dataclasses.replace(declared, name=as_name, help=help, default=None)


# the relaxed-recursion converters' settings (recurnmt-convert and its vision twin): one target
# stack's shape, from the stack's own declarations, and how the source's layers start it
BLOCKS = _stack_option("num_unique", "unique_layers", target=True)  # both sides
SHARING_SCHEME = _stack_option("sharing", "sharing_scheme", target=False)
INIT = Option(
    "shared blocks from layers at even intervals (stepwise), the mean of the layers that share "
    "a block (average) or the first M layers (lower)",
    name="init",
    default="stepwise",
    choices=INITS,
)
LEVEL_LORA_RANK = _stack_option("lora_rank", "level_lora_rank", target=True)
CONVERSION_FLAGS = (BLOCKS, SHARING_SCHEME, INIT, LEVEL_LORA_RANK)
"""The settings both converters take, spelt and meant alike."""
