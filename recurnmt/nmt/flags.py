"""A translation model's flag that is no stack option, declared once: name, default, argparse.

Stack options declare their flags on their part configs (:mod:`recurnmt.modules.config`);
the model's other settings (checkpoint segments, compilation, elastic depth, the embedding
layout) are :class:`Flag` entries next to the code that reads them. Both reach fairseq's
parser through :func:`recurnmt.nmt.options.add_recurrent_args` and their defaults through
:data:`recurnmt.nmt.defaults.BASE`.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Flag:
    """One command-line flag.

    Attributes:
        flag: its name (``--mixed-depth``).
        default: the value every architecture gives it (filled by
            :func:`recurnmt.nmt.defaults.fill_defaults`, so checkpoints saved before it
            existed get it too).
        settings: ``add_argument``'s other keywords (help, choices, ...).
    """

    flag: str
    default: Any
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def dest(self) -> str:
        """fairseq's argument name: ``--mixed-depth`` -> ``mixed_depth``."""
        return self.flag[2:].replace("-", "_")


def add_flags(parser: argparse.ArgumentParser, flags: Iterable[Flag]) -> None:
    """Adds ``flags`` to ``parser`` (their defaults come from the architecture)."""
    for f in flags:
        parser.add_argument(f.flag, **f.settings)


def defaults(flags: Iterable[Flag]) -> dict[str, Any]:
    """``{argument: default}`` of ``flags``."""
    return {f.dest: f.default for f in flags}
