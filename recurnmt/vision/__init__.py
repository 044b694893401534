"""Image models built from the shared blocks of :mod:`recurnmt.modules` (no fairseq).

Usage::

    from recurnmt.vision import create_model, list_models
    model = create_model("ringformer_vit_base_patch16_224", num_classes=100)

Training and evaluation: ``python -m recurnmt.vision.train`` and
``python -m recurnmt.vision.evaluate``. With timm installed (and importable), every model is
also registered with timm (see :mod:`recurnmt.vision.registry`).
"""

from recurnmt.vision import models  # noqa: F401  (the model files register themselves)
from recurnmt.vision.registry import create_model, list_models, register_with_timm

register_with_timm()

__all__ = ["create_model", "list_models", "register_with_timm"]
