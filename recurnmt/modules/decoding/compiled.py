"""One ``torch.compile``d function per decoder stack and decoding setting.

The compiled decoding paths (the static-shape beam step, speculation's passes and greedy
rounds) compile plain functions of fixed buffers; :func:`compiled_decoding` keeps one
compiled copy of each per model and setting, held as long as the model's stack lives.
"""

from __future__ import annotations

import types
import weakref
from collections.abc import Callable
from typing import Any

import torch

from recurnmt.modules.compile import within_limit

_DECODING: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def compiled_decoding(owner: object, key: tuple, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` compiled by ``torch.compile`` (TorchInductor, dynamic shapes) for decoding with
    ``owner`` (a model's decoder stack) in the setting ``key`` (what else specialises the
    compiled code: a pass and its levels, a beam size), made once per pair, each with a code
    object of its own. Dynamo keeps a code object's compilations up to a small limit and runs
    new shapes eagerly past it; one code object per model and setting keeps each within it
    (a few compilations: the first shapes, then symbolic sizes, a new length bucket), where one
    for all would pass the limit in a process that decodes several models or settings."""
    per_owner = _DECODING.setdefault(owner, {})
    if key not in per_owner:
        name = f"{fn.__name__}_{abs(hash(key)):x}"
        code = fn.__code__.replace(co_name=name, co_qualname=name)
        copy = types.FunctionType(code, fn.__globals__, name, fn.__defaults__, fn.__closure__)
        # batches of other sizes and sentences of other lengths (capacities, buckets) pass
        # torch's default limit of 8 within one setting: the higher one of training's
        per_owner[key] = within_limit(copy, torch.compile(copy, dynamic=True))
    return per_owner[key]
