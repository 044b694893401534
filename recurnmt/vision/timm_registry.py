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

from typing import Any

from torch import nn

from recurnmt.vision.registry import (
    create_model,
    default_cfg,
    list_models,
    model_cfg,
    set_pretrained_cfg,
)

TIMM_PREFIX = "recurnmt_"

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
                "python -m recurnmt.vision.train and pass checkpoint_path="
            )
        if isinstance(pretrained_cfg, str):
            raise ValueError(f"{target} has no pretrained tag {pretrained_cfg!r}")
        model = create_model(name, **kwargs)
        base = model_cfg(name, model)
        if pretrained_cfg is not None:  # a dict or timm's PretrainedCfg, given by the caller
            given = pretrained_cfg if isinstance(pretrained_cfg, dict) else vars(pretrained_cfg)
            base.update({k: v for k, v in given.items() if v is not None})
        set_pretrained_cfg(
            model, {**base, **(pretrained_cfg_overlay or {}), "architecture": target}
        )
        return model

    entry.__name__ = entry.__qualname__ = target
    entry.__module__ = __name__
    entry.__doc__ = f"recurnmt's {name} (see recurnmt.vision.list_models)."
    return entry
