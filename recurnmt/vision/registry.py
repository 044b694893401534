"""The vision model registry: ``create_model(name, **kwargs)``, ``list_models()`` and the data
configuration each model was designed for.

Every model family registers thin entry points (one function per named configuration) with
:func:`register_model`. The entry points accept keyword overrides (image size, number of
classes, widths, loops, ...), so a registered name is a set of defaults, never a cage.

The model files register themselves when :mod:`recurnmt.vision.models` imports. The package
``recurnmt.vision`` imports it, and Python runs a package before any of its modules, so every
importer of this registry finds every model (the registry imports no model file: they import
it). The same import registers every model with timm (:mod:`recurnmt.vision.timm_registry`).

Every built model carries ``pretrained_cfg`` (alias ``default_cfg``), the dict that timm's
models carry: input size, normalisation, evaluation crop and interpolation, so that
``timm.data.resolve_data_config(model=model)`` gives the data pipeline the model expects. The
defaults are DeiT's (Touvron et al. 2021, sec. 6 and Table 9: ImageNet mean and std, bicubic
resizing, centre crop of 224/256 = 0.875); the input size is the registered one, or the one the
model was built at. Training on another data set overwrites the normalisation
(:mod:`recurnmt.vision.training.setup`), so a checkpoint's model knows its own data.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from typing import Any, overload

from torch import nn

ModelFn = Callable[..., nn.Module]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
DEIT_CROP_PCT = 0.875  # DeiT evaluates a 224 centre crop of the image resized to 256
DEIT_INTERPOLATION = "bicubic"

_MODELS: dict[str, ModelFn] = {}
_INPUT_SIZES: dict[str, tuple[int, int]] = {}
_FIXED_INPUT_SIZE: set[str] = set()


@overload
def register_model(fn: ModelFn) -> ModelFn: ...


@overload
def register_model(
    *, img_size: int | tuple[int, int] = 224, fixed_input_size: bool = False
) -> Callable[[ModelFn], ModelFn]: ...


def register_model(
    fn: ModelFn | None = None,
    *,
    img_size: int | tuple[int, int] = 224,
    fixed_input_size: bool = False,
) -> ModelFn | Callable[[ModelFn], ModelFn]:
    """Registers ``fn`` under its function name (a decorator, bare or with arguments).

    Args:
        fn: the entry point.
        img_size: the resolution the entry point builds by default (its data configuration's
            input size; ``tests/test_vision_models.py`` checks it against the built model).
        fixed_input_size: the model works at that size only (an MLP-Mixer's token mixing):
            timm's ``fixed_input_size``, which tells timm's tools and tests not to resize.

    Raises:
        ValueError: the name is registered already.
    """

    def add(fn: ModelFn) -> ModelFn:
        name = fn.__name__
        if name in _MODELS:
            raise ValueError(f"vision model {name!r} is registered twice")
        _MODELS[name] = fn
        size = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
        _INPUT_SIZES[name] = size
        if fixed_input_size:
            _FIXED_INPUT_SIZE.add(name)
        return fn

    return add(fn) if fn is not None else add


def list_models(pattern: str = "*") -> list[str]:
    """Sorted names of the registered models that match the shell-style ``pattern``."""
    return sorted(n for n in _MODELS if fnmatch.fnmatch(n, pattern))


def entry_point(name: str) -> ModelFn:
    """The function registered as ``name`` (its ``__module__`` names the model's family file).

    Raises:
        KeyError: no model of that name.
    """
    _check_known(name)
    return _MODELS[name]


def default_cfg(name: str) -> dict[str, Any]:
    """The data configuration of model ``name`` as registered, in timm's ``PretrainedCfg`` keys.

    Raises:
        KeyError: no model of that name.
    """
    _check_known(name)
    rows, cols = _INPUT_SIZES[name]
    return {
        "architecture": name,
        "input_size": (3, rows, cols),
        "fixed_input_size": name in _FIXED_INPUT_SIZE,
        "interpolation": DEIT_INTERPOLATION,
        "crop_pct": DEIT_CROP_PCT,
        "crop_mode": "center",
        "mean": IMAGENET_MEAN,
        "std": IMAGENET_STD,
        "num_classes": 1000,
        "license": "mit",
        "origin_url": "recurnmt",
    }


def model_cfg(name: str, model: nn.Module) -> dict[str, Any]:
    """:func:`default_cfg` with the input size, channels and classes ``model`` was built with.

    A grey-scale model (``in_chans=1``) keeps the first channel's statistics.
    """
    cfg = default_cfg(name)
    rows, cols = getattr(model, "img_size", cfg["input_size"][1:])
    chans = getattr(model, "in_chans", 3)
    cfg.update(model_parts(model))
    cfg.update(
        input_size=(chans, rows, cols),
        num_classes=getattr(model, "num_classes", cfg["num_classes"]),
        mean=cfg["mean"][:chans] if chans < 3 else cfg["mean"],
        std=cfg["std"][:chans] if chans < 3 else cfg["std"],
    )
    return cfg


def model_parts(model: nn.Module) -> dict[str, Any]:
    """timm's configuration keys that name a built model's parts: ``first_conv`` (the first
    convolution), ``classifier`` (the head's module, or every head of a cascade) and
    ``pool_size`` (the grid of ``forward_features``' output at the built resolution)."""
    convs = [n for n, m in model.named_modules() if isinstance(m, nn.Conv2d)]
    parts: dict[str, Any] = {"first_conv": convs[0] if convs else ""}
    parts["classifier"] = getattr(model, "classifier_names", "head")
    pool = getattr(model, "pool_size", None)
    if pool is None and hasattr(model, "patch_embed") and hasattr(model, "img_size"):
        pool = model.patch_embed.grid_size(model.img_size)
    if pool is not None:
        parts["pool_size"] = tuple(pool)
    return parts


def set_pretrained_cfg(model: nn.Module, cfg: dict[str, Any]) -> None:
    """Attaches ``cfg`` as ``model.pretrained_cfg`` and its old alias ``default_cfg`` (timm's)."""
    model.pretrained_cfg = cfg
    model.default_cfg = cfg


def create_model(name: str, **kwargs) -> nn.Module:
    """Builds the registered model ``name``; ``kwargs`` override its defaults.

    Raises:
        KeyError: no model of that name; the message lists close names.
    """
    _check_known(name)
    model = _MODELS[name](**kwargs)
    set_pretrained_cfg(model, model_cfg(name, model))
    return model


def _check_known(name: str) -> None:
    if name not in _MODELS:
        close = [n for n in _MODELS if name.split("_")[0] in n] or sorted(_MODELS)
        raise KeyError(f"unknown vision model {name!r}; known models include {', '.join(close)}")
