"""Image model families; importing this package registers every model."""

from recurnmt.vision.models import dvt, mixer, sret, vit  # noqa: F401
from recurnmt.vision.models.dvt import DVTCascade
from recurnmt.vision.models.mixer import RecursiveMixer
from recurnmt.vision.models.sret import SReT
from recurnmt.vision.models.vit import VisionTransformer

__all__ = ["DVTCascade", "RecursiveMixer", "SReT", "VisionTransformer"]
