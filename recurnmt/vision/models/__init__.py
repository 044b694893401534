"""Image model families; importing this package registers every model."""

from recurnmt.vision.models import dvt, mixer, mrla_resnet, sret, vit  # noqa: F401
from recurnmt.vision.models.dvt import DVTCascade
from recurnmt.vision.models.mixer import RecursiveMixer
from recurnmt.vision.models.mrla_resnet import MRLAResNet
from recurnmt.vision.models.sret import SReT
from recurnmt.vision.models.vit import VisionTransformer

__all__ = ["DVTCascade", "MRLAResNet", "RecursiveMixer", "SReT", "VisionTransformer"]
