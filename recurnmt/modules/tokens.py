"""A side's token front end, declared once for every front end that embeds tokens.

``LN?(scale * E[tokens] + P[positions])``, as fairseq's transformer embeds them (Vaswani et
al. 2017, sec. 3.4: the embeddings times sqrt(d_model); sec. 3.5: sinusoidal positions).
Translation (:class:`recurnmt.nmt.embedding.TokenEmbedding`, on fairseq's position modules,
whose weights its checkpoints hold) and the exported ``transformers`` models
(:class:`recurnmt.hf.modeling.TokenFrontEnd`) build their modules from a :class:`TokenConfig`;
the export writes the translation model's as it is (:meth:`TokenConfig.to_dict`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from recurnmt.modules.errors import ConfigError

POSITIONS = ("sinusoidal", "learned", "none")


@dataclass(frozen=True)
class TokenConfig:
    """How one side embeds its tokens.

    Attributes:
        positions: ``sinusoidal`` (fairseq's default), ``learned`` (a table, fairseq's
            ``--*-learned-pos``) or ``none`` (``--no-token-positional-embeddings``).
        scale_embedding: the token embeddings times sqrt(width) (fairseq, unless
            ``--no-scale-embedding``; RingFormer's code: off).
        layernorm_embedding: a layer norm after the sum (``--layernorm-embedding``).

    Raises:
        ConfigError: a kind of positions other than these.
    """

    positions: str = "sinusoidal"
    scale_embedding: bool = True
    layernorm_embedding: bool = False

    def __post_init__(self) -> None:
        if self.positions not in POSITIONS:
            raise ConfigError("positions", self.positions, "sinusoidal, learned or none")

    def scale(self, dim: int) -> float:
        """The factor on the token embeddings of width ``dim``."""
        return math.sqrt(dim) if self.scale_embedding else 1.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TokenConfig:
        """The config from a mapping holding its fields (others ignored: a model config)."""
        return cls(**{f.name: values[f.name] for f in fields(cls) if f.name in values})
