"""Named architectures, registered with fairseq: every family at every size.

``fairseq-train --arch ringformer_wmt_en_de`` is the ``ringformer`` family at the
``wmt_en_de`` size; a bare family name (``--arch ringformer``) is the ``wmt_en_de`` size.
The defaults live in one table, :mod:`recurnmt.nmt.defaults`; each registered architecture
function fills them with :func:`~recurnmt.nmt.defaults.fill_defaults`. Explicit command-line
flags always win over these defaults.

fairseq calls the architecture function as it parses ``fairseq-train``'s command line, before
any task reads data, and again as it builds a model (a checkpoint's too); so it also checks the
model's settings there (:func:`~recurnmt.nmt.model.check_model_args`): ``--decoder-levels 0``
fails at once, naming the flag, not after the dictionaries have loaded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from recurnmt.modules.families import FAMILIES
from recurnmt.nmt.defaults import ARCHS, SIZES, fill_defaults
from recurnmt.nmt.model import MODEL_NAME, check_model_args
from recurnmt.nmt.registry import register_arch_once

__all__ = ["ARCHS", "FAMILIES", "SIZES"]


def _arch(name: str, family: str, size: str) -> Callable[[Any], None]:
    def arch(args: Any) -> None:
        fill_defaults(args, family, size)
        check_model_args(args)

    arch.__name__ = name
    arch.__doc__ = f"The {family} family at the {size} size."
    return arch


for _name, (_family, _size) in ARCHS.items():
    register_arch_once(MODEL_NAME, _name)(_arch(_name, _family, _size))
