"""Every recurnmt vision model as a timm model: ``timm.create_model("sret_t")``.

:func:`register_with_timm` (run when :mod:`recurnmt.vision` imports) gives timm one entry point
per registered model, so timm's tools work on ours: ``timm.create_model`` (with
``checkpoint_path=``, ``num_classes=``, ``drop_path_rate=`` ...), ``timm.list_models("*sret*")``,
``timm.models.get_pretrained_cfg(name)`` and ``timm.data.resolve_data_config(model=model)``.

Several of our baseline names (``deit_tiny_patch16_224``, ``vit_base_patch16_224``,
``mixer_b16_224``) are timm's own models; overwriting timm's entries would silently change other
people's code. Every model is therefore registered as ``recurnmt_<name>`` and, only where timm
has no model of that name, also as ``<name>``. timm reads a module's ``default_cfgs`` when it
registers an entry point of that module; this module is that module for our entry points (and
timm lists it as ``timm.list_modules()``'s ``timm_registry``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import torch
from timm.models._builder import pretrained_cfg_for_features  # timm's, as its builder uses it
from torch import nn

from recurnmt.vision.registry import (
    create_model,
    default_cfg,
    list_models,
    model_cfg,
    set_pretrained_cfg,
)

TIMM_PREFIX = "recurnmt_"
# timm.create_model's feature-extraction arguments, taken before our builder sees the rest
FEATURE_KWARGS = ("features_only", "out_indices", "feature_cls", "feature_cfg")

# timm.models.register_model looks up the entry point's module and copies the data
# configuration registered here under the entry point's name into its own registry.
default_cfgs: dict[str, dict[str, Any]] = {}


def register_with_timm() -> list[str]:
    """Registers every model with timm (once); returns the names given to timm this call."""
    from timm.models import is_model
    from timm.models import register_model as timm_register

    registered = []
    for name in list_models():
        targets = [TIMM_PREFIX + name] + ([] if is_model(name) else [name])
        for target in targets:
            if is_model(target):
                continue
            default_cfgs[target] = {**default_cfg(name), "architecture": target}
            timm_register(_timm_entry(name, target))
            registered.append(target)
    return registered


def feature_model(
    model: nn.Module,
    out_indices: int | Sequence[int] | None = None,
    feature_cls: str = "getter",
    feature_cfg: dict[str, Any] | None = None,
) -> nn.Module:
    """``model`` as timm's feature extractor (``features_only=True``): timm's
    ``FeatureGetterNet`` over the model's ``forward_intermediates`` (NCHW maps of the points
    in its ``feature_info``), or another of timm's feature classes by name (``feature_cls``:
    ``list``, ``dict``, ``hook``, ``fx``, where the model supports it). ``out_indices``
    defaults to every point of a model with at most 5 (a CNN's or SReT's stages), the last 3
    of a deeper one (a ViT's levels), as timm's own models do.

    Raises:
        ValueError: the model has no feature points, or an unknown ``feature_cls``.
    """
    from timm.models import FeatureDictNet, FeatureGraphNet, FeatureHookNet, FeatureListNet
    from timm.models._features import FeatureGetterNet

    classes = {"getter": FeatureGetterNet, "list": FeatureListNet, "dict": FeatureDictNet,
               "hook": FeatureHookNet, "fx": FeatureGraphNet}  # fmt: skip
    info = getattr(model, "feature_info", None)
    if not info:
        raise ValueError(f"features_only: {type(model).__name__} has no feature points")
    if feature_cls not in classes:
        raise ValueError(f"feature_cls={feature_cls!r}; use one of {sorted(classes)}")
    if out_indices is None:
        out_indices = tuple(range(len(info))) if len(info) <= 5 else 3
    cfg = {**(feature_cfg or {}), "out_indices": out_indices}
    return classes[feature_cls](model, **cfg)


def _timm_entry(name: str, target: str):
    """An entry point with timm's signature that builds our model ``name``."""

    def entry(
        pretrained: bool = False,
        pretrained_cfg: Any = None,
        pretrained_cfg_overlay: dict[str, Any] | None = None,
        cache_dir: Any = None,
        **kwargs: Any,
    ) -> nn.Module:
        # We publish no weights: refusing is better than a randomly initialised "pretrained"
        # model. Weights of our own runs load with timm.create_model(..., checkpoint_path=).
        if pretrained:
            raise ValueError(
                f"recurnmt has no pretrained weights for {target}; train one with "
                "python -m recurnmt.vision.training.train and pass checkpoint_path="
            )
        if isinstance(pretrained_cfg, str):
            raise ValueError(f"{target} has no pretrained tag {pretrained_cfg!r}")
        features = {k: kwargs.pop(k) for k in FEATURE_KWARGS if k in kwargs}
        # timm's factory arguments (its models take them; its tests pass them): our builders
        # create their tensors where torch's default device says and in float32, so the
        # device is that default while the model is built, and the dtype a cast after
        device, dtype = kwargs.pop("device", None), kwargs.pop("dtype", None)
        with torch.device(device) if device is not None else contextlib.nullcontext():
            model = create_model(name, **kwargs)
        if dtype is not None:
            model.to(dtype=dtype)
        base = model_cfg(name, model)
        if pretrained_cfg is not None:  # a dict or timm's PretrainedCfg, given by the caller
            given = pretrained_cfg if isinstance(pretrained_cfg, dict) else vars(pretrained_cfg)
            base.update({k: v for k, v in given.items() if v is not None})
        cfg = {**base, **(pretrained_cfg_overlay or {}), "architecture": target}
        set_pretrained_cfg(model, cfg)
        if features.pop("features_only", False):
            model = feature_model(model, **features)
            set_pretrained_cfg(model, pretrained_cfg_for_features(cfg))
        return model

    entry.__name__ = entry.__qualname__ = target
    entry.__module__ = __name__
    entry.__doc__ = f"recurnmt's {name} (see recurnmt.vision.list_models)."
    return entry
