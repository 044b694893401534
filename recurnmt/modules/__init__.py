"""Pure-PyTorch building blocks shared by the translation and vision front ends.

Nothing in this package imports fairseq.
"""

from recurnmt.modules.attention import CrossAttention, SelfAttention
from recurnmt.modules.config import ConfigError, SignalConfig, StackConfig
from recurnmt.modules.depth_plan import DepthPlan
from recurnmt.modules.feedforward import FeedForward
from recurnmt.modules.layer_attention import LayerAttention, MRLABase, MRLALight
from recurnmt.modules.layers import LevelParts, TransformerBlock
from recurnmt.modules.level_embedding import sinusoidal_level_embedding
from recurnmt.modules.level_signals import FullRankSignal, LowRankSignal, build_signal
from recurnmt.modules.stack import RecurrentStack

__all__ = [
    "ConfigError",
    "CrossAttention",
    "DepthPlan",
    "FeedForward",
    "FullRankSignal",
    "LayerAttention",
    "LevelParts",
    "LowRankSignal",
    "MRLABase",
    "MRLALight",
    "RecurrentStack",
    "SelfAttention",
    "SignalConfig",
    "StackConfig",
    "TransformerBlock",
    "build_signal",
    "sinusoidal_level_embedding",
]
