"""A setting that is no stack option, declared once as a flag: name, default, argparse.

Stack options declare their flags on their part configs (:mod:`recurnmt.modules.config`); the
other settings are :class:`Flag` entries next to the code that reads them: a translation
model's (checkpoint segments, elastic depth, the embedding layout: they reach fairseq's parser
through :func:`recurnmt.nmt.flags.add_recurrent_args` and their defaults through
:data:`recurnmt.nmt.defaults.BASE`), the run modes every front end takes (:data:`RUN_MODES`:
compilation, mixed depth and checkpoint segments, the same spelling and meaning in
``fairseq-train`` and the image trainer), elastic depth (:func:`levels_flag`: translation's
model flags, the image evaluator, the export's config keys), and the settings both
relaxed-recursion converters take (:data:`CONVERSION_FLAGS`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from recurnmt.modules.config import SHARING_SCHEMES, ConfigError
from recurnmt.modules.relaxed_init import INITS


@dataclass(frozen=True)
class Flag:
    """One command-line flag.

    Attributes:
        flag: its name (``--mixed-depth``).
        default: the value every architecture gives it (filled by
            :func:`recurnmt.nmt.defaults.fill_defaults`, so checkpoints saved before it
            existed get it too).
        settings: ``add_argument``'s other keywords (help, choices, ...).
        aliases: former spellings that still work (shown in ``--help`` beside the flag).
    """

    flag: str
    default: Any
    settings: dict[str, Any] = field(default_factory=dict)
    aliases: tuple[str, ...] = ()

    @property
    def dest(self) -> str:
        """fairseq's argument name: ``--mixed-depth`` -> ``mixed_depth``."""
        return self.flag[2:].replace("-", "_")


def add_flags(parser, flags: Iterable[Flag], with_defaults: bool = False) -> None:
    """Adds ``flags`` to ``parser`` (an ``argparse`` parser or group): their defaults come from
    the architecture (translation), or, ``with_defaults``, from the declarations."""
    for f in flags:
        parser.add_argument(
            f.flag,
            *f.aliases,
            dest=f.dest,
            **f.settings,
            **({"default": f.default} if with_defaults else {}),
        )


def defaults(flags: Iterable[Flag]) -> dict[str, Any]:
    """``{argument: default}`` of ``flags``."""
    return {f.dest: f.default for f in flags}


COMPILE = Flag(
    "--compile",
    None,  # eager
    dict(
        nargs="?",
        const="inductor",
        metavar="BACKEND",
        help="torch.compile the model's stacks (training and full passes; step-by-step "
        "decoding stays eager) with BACKEND (default inductor; aot_eager compiles without "
        "generating code)",
    ),
)
COMPILE_MODE = Flag(
    "--compile-mode",
    None,
    dict(help="torch.compile mode with --compile (default, reduce-overhead, max-autotune)"),
)
MIXED_DEPTH = Flag(
    "--mixed-depth",
    "off",
    dict(
        nargs="?",
        const="on",
        choices=("on", "off"),
        help="SReT mixed-depth training (appendix B): also train a shallow pass under the same "
        "loss (translation: --mixed-depth-levels chooses it, SReT's branch by default, and the "
        "recurrent criterion adds it); --mixed-depth alone is on",
    ),
)
CHECKPOINT_SEGMENT = Flag(
    "--checkpoint-segment",
    "0",
    dict(
        metavar="K",
        help="with activation checkpointing (fairseq's --checkpoint-activations, the image "
        "trainer's too): also checkpoint every K levels as one segment (Chen et al. 2016), K "
        "a number or 'sqrt' for ceil(sqrt(levels)): memory grows as sqrt(levels) instead of "
        "linearly, for one more forward pass; 0 (default) checkpoints each level only",
    ),
)
RUN_MODES = (COMPILE, COMPILE_MODE, MIXED_DEPTH, CHECKPOINT_SEGMENT)
"""The run modes of every front end, spelt and meant alike."""


def levels_flag(side: str, aliases: tuple[str, ...] = ()) -> Flag:
    """Elastic depth of the ``side`` stack (``encoder``: an image model's one stack too):
    ``--{side}-levels K`` runs a trained weight-shared stack at K levels instead of its
    trained depth (the modules' ``set_depth``; the ``transformers`` export's config key
    ``{side}_levels``). The same spelling and meaning in ``fairseq-train``/``-generate``
    (through ``--model-overrides``) and the image evaluator."""
    return Flag(
        f"--{side}-levels",
        None,  # as built
        dict(
            type=int,
            metavar="K",
            help=f"run the {side} at K levels instead of its trained depth (elastic depth of "
            "a trained shared model; in fairseq-generate: --model-overrides "
            f"\"{{'{side}_levels': K}}\"); K beyond the trained depth needs parameter-free "
            "level parts (Universal Transformer); SReT: K = loops x unique blocks",
        ),
        aliases,
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
    raise ConfigError(CHECKPOINT_SEGMENT.flag, value, "must be a number of levels >= 0 or 'sqrt'")


def is_on(value: Any) -> bool:
    """A switch given as ``on``/``off`` (or a bool, from older saved arguments)."""
    return value is True or value == "on"


# the relaxed-recursion converters' settings (recurnmt-convert and its vision twin): one target
# stack's shape and how the source's layers start it
UNIQUE_LAYERS = Flag(
    "--unique-layers",
    None,
    dict(
        type=int,
        metavar="M",
        help="M unique blocks (both sides of a translation model); default: the target's",
    ),
)
SHARING_SCHEME = Flag(
    "--sharing-scheme",
    "cycle",
    dict(choices=SHARING_SCHEMES, help="which block a level runs (relaxed recursion: cycle)"),
)
INIT = Flag(
    "--init",
    "stepwise",
    dict(
        choices=INITS,
        help="shared blocks from layers at even intervals (stepwise), the mean of the layers "
        "that share a block (average) or the first M layers (lower)",
    ),
)
LEVEL_LORA_RANK = Flag(
    "--level-lora-rank",
    None,
    dict(
        metavar="R",
        help="each level's LoRA rank, or full (exactly the source); default: the target's",
    ),
)
CONVERSION_FLAGS = (UNIQUE_LAYERS, SHARING_SCHEME, INIT, LEVEL_LORA_RANK)
"""The settings both converters take, spelt and meant alike."""
