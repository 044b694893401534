"""Position-wise feed-forward block (RingFormer eq. 2 and eq. 7; Relaxed Recursive
Transformers eq. 3)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch.nn.functional as F
from torch import Tensor, nn

from recurnmt.modules.attention import LinearReplacement, linear
from recurnmt.modules.dropout import Dropout

_ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu}


class FeedForward(nn.Module):
    """``a = sigma(u W_up + b_up + up(u) + d_hidden)``, ``u = x + d_in``;
    ``out = a W_down + b_down + down(a)``.

    With every delta absent this is the Transformer FFN (RingFormer eq. 2). RingFormer's FFN
    level signal enters as ``input_delta`` (eq. 7); ``hidden_delta`` is the Table 4 "inter-FF
    signal" ablation. ``up_delta`` and ``down_delta`` are functions of each projection's own
    input, a relaxed level's LoRA on W_up and W_down (Relaxed Recursive Transformers eq. 3).
    ``linears`` maps ``"up"`` or ``"down"`` to the weight and bias to use in place of that
    projection's own (:data:`~recurnmt.modules.attention.LinearReplacement`: a level's signal
    or LoRA folded in, in evaluation).
    """

    def __init__(
        self,
        embed_dim: int,
        ffn_dim: int,
        activation: str = "relu",
        activation_dropout: float = 0.0,
        bias: bool = True,
    ) -> None:
        super().__init__()
        if activation not in _ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; choose one of relu, gelu")
        self.up = nn.Linear(embed_dim, ffn_dim, bias=bias)
        self.down = nn.Linear(ffn_dim, embed_dim, bias=bias)
        self.activation = _ACTIVATIONS[activation]
        self.activation_dropout = Dropout(activation_dropout)
        nn.init.xavier_uniform_(self.up.weight)
        nn.init.xavier_uniform_(self.down.weight)
        for lin in (self.up, self.down):
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)

    def forward(
        self,
        x: Tensor,
        input_delta: Tensor | None = None,
        hidden_delta: Tensor | None = None,
        up_delta: Callable[[Tensor], Tensor] | None = None,
        down_delta: Callable[[Tensor], Tensor] | None = None,
        linears: Mapping[str, LinearReplacement] | None = None,
    ) -> Tensor:
        # x: B x T x C -> B x T x FF -> B x T x C
        linears = linears or {}
        if input_delta is not None:
            x = x + input_delta
        h = linear(x, self.up, linears.get("up"))
        if up_delta is not None:
            h = h + up_delta(x)
        if hidden_delta is not None:
            h = h + hidden_delta
        a = self.activation_dropout(self.activation(h))  # B x T x FF
        out = linear(a, self.down, linears.get("down"))
        return out if down_delta is None else out + down_delta(a)
