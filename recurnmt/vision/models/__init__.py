"""Image model families; importing this package registers every model."""

from recurnmt.vision.models import vit  # noqa: F401
from recurnmt.vision.models.vit import VisionTransformer

__all__ = ["VisionTransformer"]
