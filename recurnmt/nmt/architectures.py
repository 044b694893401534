"""Named architectures, registered with fairseq: every family at every size.

``fairseq-train --arch ringformer_wmt_en_de`` is the ``ringformer`` family at the
``wmt_en_de`` size; a bare family name (``--arch ringformer``) is the ``wmt_en_de`` size.
The defaults live in one table, :mod:`recurnmt.nmt.defaults`; each registered architecture
function fills them with :func:`~recurnmt.nmt.defaults.fill_defaults`. Explicit command-line
flags always win over these defaults.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from recurnmt.modules.families import FAMILIES
from recurnmt.nmt.defaults import ARCHS, SIZES, fill_defaults
from recurnmt.nmt.model import MODEL_NAME
from recurnmt.nmt.registry import register_arch_once

__all__ = ["ARCHS", "FAMILIES", "SIZES"]


def _arch(name: str, family: str, size: str) -> Callable[[Any], None]:
    def arch(args: Any) -> None:
        fill_defaults(args, family, size)

    arch.__name__ = name
    arch.__doc__ = f"The {family} family at the {size} size."
    return arch


for _name, (_family, _size) in ARCHS.items():
    register_arch_once(MODEL_NAME, _name)(_arch(_name, _family, _size))
