"""Position embeddings for a 2-D token grid, learned or fixed, at any grid size.

* Learned (ViT, Dosovitskiy et al. 2021, eq. 1): one vector per grid position, trained. At a
  different resolution (fine-tuning at 384 after training at 224, ViT sec. 3.2 / DeiT sec. 6)
  the grid of vectors is resampled by 2-D interpolation of their positions.
* Fixed sine-cosine: the sinusoids of Vaswani et al. (2017, sec. 3.5),
  PE(p, 2i) = sin(p / 10000^{2i/d}), PE(p, 2i+1) = cos(p / 10000^{2i/d}), applied to the row
  index with one half of the channels and to the column index with the other half (the 2-D
  form used by MoCo v3 and MAE). It has no parameters and exists at every grid size, which is
  what the RingFormer image models' parameter counts imply (RingFormer Tables 2-3 match models
  without learned position embeddings exactly).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def sincos_1d(positions: Tensor, dim: int) -> Tensor:
    """Sinusoids of ``positions`` (L) in ``dim`` channels (Vaswani et al. sec. 3.5): L x dim."""
    if dim % 2:
        raise ValueError(f"sine-cosine embedding needs an even width, got {dim}")
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    angle = positions.float()[:, None] * freq[None, :]  # L x dim/2
    return torch.stack([angle.sin(), angle.cos()], dim=-1).flatten(1)  # sin, cos interleaved


def sincos_2d(grid: tuple[int, int], dim: int) -> Tensor:
    """Fixed 2-D position embedding of a ``grid`` (rows, cols): (rows * cols) x dim, row-major.

    Raises:
        ValueError: ``dim`` is not a multiple of 4 (two halves of sin/cos pairs).
    """
    if dim % 4:
        raise ValueError(f"2-D sine-cosine embedding needs a width divisible by 4, got {dim}")
    rows, cols = grid
    r = torch.arange(rows).repeat_interleave(cols)  # row index of each token
    c = torch.arange(cols).repeat(rows)  # column index of each token
    return torch.cat([sincos_1d(r, dim // 2), sincos_1d(c, dim // 2)], dim=1)


def resize_grid(embed: Tensor, old: tuple[int, int], new: tuple[int, int]) -> Tensor:
    """Resamples a learned grid embedding (1 x old_rows*old_cols x D) to ``new`` (bicubic)."""
    if old == new:
        return embed
    d = embed.size(-1)
    grid = embed.reshape(1, old[0], old[1], d).permute(0, 3, 1, 2)  # 1 x D x rows x cols
    grid = F.interpolate(grid.float(), size=new, mode="bicubic", align_corners=False)
    return grid.permute(0, 2, 3, 1).reshape(1, new[0] * new[1], d).to(embed.dtype)


# calls in torch.fx's graph (timm's feature extraction): the size test runs when the graph
# does, and the sinusoids are made then (no tensor constant in the graph)
torch.fx.wrap("resize_grid")
torch.fx.wrap("sincos_2d")


class PositionEmbedding(nn.Module):
    """Adds a position embedding to B x (prefix + rows*cols) x D tokens.

    Args:
        kind: ``learned``, ``sincos`` or ``none``.
        grid: the token grid the learned table is sized for (other grids are interpolated).
        dim: token width D.
        num_prefix: class/distillation tokens in front of the grid. They get a learned vector
            each (``learned``) or none (``sincos``), as in ViT.
    """

    def __init__(self, kind: str, grid: tuple[int, int], dim: int, num_prefix: int = 0) -> None:
        super().__init__()
        if kind not in ("learned", "sincos", "none"):
            raise ValueError(f"unknown position embedding {kind!r}; use learned, sincos or none")
        self.kind, self.grid, self.dim, self.num_prefix = kind, tuple(grid), dim, num_prefix
        self._fixed: dict[tuple, Tensor] = {}
        if kind == "learned":
            self.weight = nn.Parameter(torch.zeros(1, num_prefix + grid[0] * grid[1], dim))
            nn.init.trunc_normal_(self.weight, std=0.02)
        else:
            self.weight = None
            if kind == "sincos":
                sincos_2d(self.grid, dim)  # fail early on a bad width

    def table(self, grid: tuple[int, int], like: Tensor) -> Tensor | None:
        """The embedding of every token, 1 x (prefix + rows*cols) x D (``None`` for ``none``).

        ``like`` gives the dtype and device. Prefix tokens get zeros under ``sincos``.
        """
        if self.kind == "none":
            return None
        if self.kind == "sincos":
            key = (tuple(grid), like.device, like.dtype)
            if key not in self._fixed:  # computed once per grid, device and dtype
                pe = sincos_2d(key[0], self.dim).to(like)
                self._fixed[key] = torch.cat([pe.new_zeros(self.num_prefix, self.dim), pe])[None]
            return self._fixed[key]
        prefix, table = self.weight[:, : self.num_prefix], self.weight[:, self.num_prefix :]
        return torch.cat([prefix, resize_grid(table, self.grid, tuple(grid))], dim=1).to(like)

    def forward(self, x: Tensor, grid: tuple[int, int]) -> Tensor:
        """``x`` (B x T x D) plus the embedding of a ``grid`` of tokens."""
        pe = self.table(grid, x)
        return x if pe is None else x + pe

    def resize_(self, grid: tuple[int, int]) -> None:
        """Permanently resamples the learned table to ``grid`` (fine-tuning at a new size)."""
        grid = tuple(grid)
        if self.weight is not None and grid != self.grid:
            prefix = self.weight.data[:, : self.num_prefix]
            table = resize_grid(self.weight.data[:, self.num_prefix :], self.grid, grid)
            self.weight = nn.Parameter(torch.cat([prefix, table], dim=1))
        self.grid = grid
