"""Image models built from the shared blocks of :mod:`recurnmt.modules` (no fairseq).

Usage::

    from recurnmt.vision import create_model, list_models
    model = create_model("ringformer_vit_base_patch16_224", num_classes=100)

Training and evaluation: ``python -m recurnmt.vision.training.train`` and
``python -m recurnmt.vision.training.evaluate``. Importing this package also registers every model with
timm (``timm.create_model("sret_t")``, see :mod:`recurnmt.vision.timm_registry`).
"""

from recurnmt.vision import models  # noqa: F401  (the model files register themselves)
from recurnmt.vision.registry import create_model, list_models
from recurnmt.vision.timm_registry import register_with_timm

register_with_timm()

__all__ = ["create_model", "list_models", "register_with_timm"]
