"""Signatures that torch.fx and TorchScript can read.

torch.fx writes the annotations of the traced model's ``forward`` into the code it generates,
and ``torch.jit.script`` of that graph (timm's ``test_model_forward_fx_torchscript``) compiles
the code; a function TorchScript leaves to Python (``@torch.jit.ignore``) is called with the
types its annotations say. Under ``from __future__ import annotations`` (every recurnmt
module) an annotation is a string (``"Tensor"``), which fx writes as an unknown name
(``_Tensor_``) and TorchScript refuses. :func:`traceable` resolves the annotations once, where
the function or class is defined.
"""

from __future__ import annotations

import typing

T = typing.TypeVar("T")


def traceable(obj: T) -> T:
    """Decorator: the annotations of a function, or of a module class's ``forward``, as
    objects instead of strings."""
    fn = obj.__dict__["forward"] if isinstance(obj, type) else obj
    fn.__annotations__ = typing.get_type_hints(fn)
    return obj
