"""The names recurnmt registers with fairseq, and idempotent registration.

The plugin may be imported twice under different module names (the installed package and a
``--user-dir`` pointing inside it); fairseq refuses duplicate registrations, so these helpers
register a name once and ignore a repeat from a module of the same name.
"""

from __future__ import annotations

from collections.abc import Callable

from fairseq.criterions import CRITERION_REGISTRY, register_criterion
from fairseq.models import (
    ARCH_MODEL_REGISTRY,
    MODEL_REGISTRY,
    register_model,
    register_model_architecture,
)

MODEL_NAME = "recurrent_transformer"
RECURRENT_CRITERION = "recurrent_label_smoothed_cross_entropy"


def register_model_once(name: str) -> Callable[[type], type]:
    def wrap(cls: type) -> type:
        existing = MODEL_REGISTRY.get(name)
        if existing is not None and existing.__qualname__ == cls.__qualname__:
            return existing
        return register_model(name)(cls)

    return wrap


def register_arch_once(model: str, arch: str) -> Callable[[Callable], Callable]:
    def wrap(fn: Callable) -> Callable:
        if arch in ARCH_MODEL_REGISTRY and ARCH_MODEL_REGISTRY[arch] is MODEL_REGISTRY[model]:
            return fn
        return register_model_architecture(model, arch)(fn)

    return wrap


def register_criterion_once(name: str, dataclass: type) -> Callable[[type], type]:
    def wrap(cls: type) -> type:
        existing = CRITERION_REGISTRY.get(name)
        if existing is not None and existing.__qualname__ == cls.__qualname__:
            return existing
        return register_criterion(name, dataclass=dataclass)(cls)

    return wrap
