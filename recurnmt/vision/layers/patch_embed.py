"""Image to patch tokens (ViT, Dosovitskiy et al. 2021, eq. 1).

The image x in R^{H x W x C} is cut into non-overlapping P x P patches, each flattened and
linearly projected to the model width D. A convolution with kernel = stride = P is exactly that
projection applied to every patch. Height and width are independent: a 224 x 160 image with
16 x 16 patches gives a 14 x 10 grid.
"""

from __future__ import annotations

from torch import Tensor, nn


def to_2tuple(value: int | tuple[int, int]) -> tuple[int, int]:
    """``7 -> (7, 7)``; pairs pass through."""
    if isinstance(value, int):
        return value, value
    h, w = value
    return int(h), int(w)


class PatchEmbed(nn.Module):
    """Linear patch projection (ViT eq. 1).

    Args:
        patch_size: patch height and width P.
        in_chans: image channels C.
        embed_dim: model width D.
    """

    def __init__(self, patch_size: int | tuple[int, int], in_chans: int, embed_dim: int) -> None:
        super().__init__()
        self.patch_size = to_2tuple(patch_size)
        self.proj = nn.Conv2d(in_chans, embed_dim, self.patch_size, stride=self.patch_size)

    def grid_size(self, img_size: tuple[int, int]) -> tuple[int, int]:
        """Token grid (rows, columns) for an image of ``img_size``; partial patches are dropped."""
        return img_size[0] // self.patch_size[0], img_size[1] // self.patch_size[1]

    def forward(self, x: Tensor) -> Tensor:
        # B x C x H x W -> B x D x H/P x W/P
        return self.proj(x)
