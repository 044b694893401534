"""Image model families; importing this package registers every model."""

from recurnmt.vision.models import mixer, sret, vit  # noqa: F401
from recurnmt.vision.models.mixer import RecursiveMixer
from recurnmt.vision.models.sret import SReT
from recurnmt.vision.models.vit import VisionTransformer

__all__ = ["RecursiveMixer", "SReT", "VisionTransformer"]
