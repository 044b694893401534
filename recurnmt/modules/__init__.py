"""Pure-PyTorch building blocks shared by the translation and vision front ends.

Nothing in this package imports fairseq, and nothing here belongs to one front end only.
The layers, bottom up (see ARCHITECTURE.md at the repository root):

* one equation a file: attention (:mod:`~recurnmt.modules.attention`), sliced group
  attention, FFN, level signals, a relaxed level's LoRA (:mod:`~recurnmt.modules.level_lora`),
  level embeddings, NLL, residual coefficients, halting;
* :class:`TransformerBlock` (built sub-modules) and :class:`LevelParts` (what a level owns);
* :class:`DepthPlan` (level -> block) and :class:`RecurrentStack` (the one level loop),
  extended per call by :class:`LevelHook` objects;
* :class:`StackConfig` (part configs whose fields are the options, :mod:`~recurnmt.modules.declarations`)
  and :func:`build_stack`, which turn a configuration into a stack; :data:`FAMILIES`, what
  makes each architecture family, in option values;
  :func:`~recurnmt.modules.relaxed_init.relax_stack` starts a relaxed recursive stack from a
  trained one.
"""

from recurnmt.modules.attention import (
    AttentionTerms,
    CrossAttention,
    MemoryKV,
    SelfAttention,
    attention_logits,
)
from recurnmt.modules.block import TransformerBlock
from recurnmt.modules.builders import build_block, build_level_parts, build_plan, build_stack
from recurnmt.modules.config import (
    BlockConfig,
    ConfigError,
    CoordinateConfig,
    DepthConfig,
    HaltingConfig,
    LoRAConfig,
    NormConfig,
    RegularizationConfig,
    ResidualConfig,
    SignalConfig,
    SlicingConfig,
    StackConfig,
)
from recurnmt.modules.decoding.cache import StackCache
from recurnmt.modules.decoding.kv_cache import KVCache
from recurnmt.modules.depth_plan import DepthPlan
from recurnmt.modules.families import FAMILIES, Family
from recurnmt.modules.feedforward import FeedForward
from recurnmt.modules.hooks import (
    AddAtEveryLevel,
    AttentionWeights,
    CrossAttentionWeights,
    LevelHook,
    LevelOutputs,
    positions_hooks,
)
from recurnmt.modules.level_embedding import sinusoidal_level_embedding
from recurnmt.modules.level_lora import LevelLoRA, LowRankDelta
from recurnmt.modules.level_parts import LevelParts
from recurnmt.modules.level_signals import FullRankSignal, LowRankSignal, build_signal
from recurnmt.modules.memory import Memory
from recurnmt.modules.mixed_depth import shallow_branch
from recurnmt.modules.sliced_attention import SlicedGroups
from recurnmt.modules.stack import RecurrentStack, StackOutput

__all__ = [
    "FAMILIES",
    "AddAtEveryLevel",
    "AttentionTerms",
    "AttentionWeights",
    "BlockConfig",
    "ConfigError",
    "CoordinateConfig",
    "CrossAttention",
    "CrossAttentionWeights",
    "DepthConfig",
    "DepthPlan",
    "Family",
    "FeedForward",
    "FullRankSignal",
    "HaltingConfig",
    "LevelHook",
    "LevelLoRA",
    "LevelOutputs",
    "KVCache",
    "LevelParts",
    "LoRAConfig",
    "LowRankDelta",
    "LowRankSignal",
    "Memory",
    "MemoryKV",
    "NormConfig",
    "RecurrentStack",
    "RegularizationConfig",
    "ResidualConfig",
    "SelfAttention",
    "SignalConfig",
    "SlicedGroups",
    "SlicingConfig",
    "StackCache",
    "StackConfig",
    "StackOutput",
    "TransformerBlock",
    "attention_logits",
    "build_block",
    "build_level_parts",
    "build_plan",
    "build_stack",
    "build_signal",
    "positions_hooks",
    "shallow_branch",
    "sinusoidal_level_embedding",
]
