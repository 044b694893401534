"""The non-linear projection layer (NLL) of SReT (SReT eq. 5, with LRC eq. 10).

``NLL(z) = zeta * MLP(LN(z)) + theta * z``: an FFN-shaped MLP with its own hidden ratio,
placed after every loop of a recursive block with weights of its own (SReT eq. 6), so that
neighbouring loops of a shared block do not collapse to the identity.
"""

from __future__ import annotations

from torch import Tensor, nn

from recurnmt.modules.feedforward import FeedForward
from recurnmt.modules.residual import ResidualCoefficients


class NonLinearProjection(nn.Module):
    """SReT's NLL.

    Args:
        embed_dim: width C.
        ratio: hidden width of the MLP as a multiple of C (SReT uses 1.0 or 2.0).
        activation: MLP non-linearity (GELU in SReT).
        lrc: learnable residual coefficients mode (:data:`~recurnmt.modules.residual.LRC_MODES`).
        norm_eps: epsilon of the layer norm.
    """

    def __init__(
        self,
        embed_dim: int,
        ratio: float,
        activation: str = "gelu",
        lrc: str = "both",
        norm_eps: float = 1e-5,
    ) -> None:
        super().__init__()
        hidden = max(1, round(embed_dim * ratio))
        self.norm = nn.LayerNorm(embed_dim, eps=norm_eps)
        self.mlp = FeedForward(embed_dim, hidden, activation)
        self.lrc = ResidualCoefficients(1, lrc)

    def forward(self, z: Tensor) -> Tensor:
        return self.lrc(z, self.mlp(self.norm(z)), 0)
