"""The vision model registry: ``create_model(name, **kwargs)`` and ``list_models()``.

Every model family registers thin entry points (one function per named configuration) with
:func:`register_model`. The entry points accept keyword overrides (image size, number of
classes, widths, loops, ...), so a registered name is a set of defaults, never a cage.

The model files register themselves when :mod:`recurnmt.vision.models` imports. The package
``recurnmt.vision`` imports it, and Python runs a package before any of its modules, so every
importer of this registry finds every model (the registry imports no model file: they import
it).

When timm imports, :func:`register_with_timm` makes every model reachable through
``timm.create_model``. Several of our baseline names (``deit_tiny_patch16_224``,
``vit_base_patch16_224``) exist in timm already; overwriting timm's own entries would silently
change other people's code, so every model is registered in timm as ``recurnmt_<name>`` and,
when timm does not know the plain name, also as ``<name>``.
"""

from __future__ import annotations

import fnmatch
import functools
from collections.abc import Callable

from torch import nn

ModelFn = Callable[..., nn.Module]

_MODELS: dict[str, ModelFn] = {}
TIMM_PREFIX = "recurnmt_"


def register_model(fn: ModelFn) -> ModelFn:
    """Registers ``fn`` under its function name (a decorator).

    Raises:
        ValueError: the name is registered already.
    """
    name = fn.__name__
    if name in _MODELS:
        raise ValueError(f"vision model {name!r} is registered twice")
    _MODELS[name] = fn
    return fn


def list_models(pattern: str = "*") -> list[str]:
    """Sorted names of the registered models that match the shell-style ``pattern``."""
    return sorted(n for n in _MODELS if fnmatch.fnmatch(n, pattern))


def create_model(name: str, **kwargs) -> nn.Module:
    """Builds the registered model ``name``; ``kwargs`` override its defaults.

    Raises:
        KeyError: no model of that name; the message lists close names.
    """
    if name not in _MODELS:
        close = [n for n in _MODELS if name.split("_")[0] in n] or sorted(_MODELS)
        raise KeyError(f"unknown vision model {name!r}; known models include {', '.join(close)}")
    return _MODELS[name](**kwargs)


def register_with_timm() -> list[str]:
    """Registers every model with timm when timm imports; returns the names given to timm.

    timm entry points take ``pretrained``; we have no pretrained weights to download, so
    ``pretrained=True`` is refused rather than silently ignored.
    """
    try:
        from timm.models import is_model
        from timm.models import register_model as timm_register
    except Exception:  # timm missing, or broken (it needs torchvision)
        return []
    registered = []
    for name, fn in _MODELS.items():
        targets = [TIMM_PREFIX + name] + ([] if is_model(name) else [name])
        for target in targets:
            if is_model(target):
                continue
            timm_register(_timm_entry(fn, target))
            registered.append(target)
    return registered


def _timm_entry(fn: ModelFn, name: str) -> ModelFn:
    @functools.wraps(fn)
    def entry(pretrained: bool = False, **kwargs) -> nn.Module:
        if pretrained:
            raise ValueError(f"recurnmt has no pretrained weights for {name}")
        kwargs.pop("pretrained_cfg", None)
        kwargs.pop("pretrained_cfg_overlay", None)
        kwargs.pop("cache_dir", None)
        return fn(**kwargs)

    entry.__name__ = entry.__qualname__ = name
    return entry
