"""SReT's convolutional pieces: the stem and the pooling between pyramid stages.

* Stem (SReT appendix E "Spatial Pyramid Design", Table 10 "Stem"; following DSOD, Shen et al.
  2017): three 3 x 3 convolutions of stride 2, each followed by batch norm and ReLU, with
  C/2, C and C output channels. A 224 x 224 image becomes a C x 28 x 28 map (stride 8).
* Conv pooling (PiT, Heo et al. 2021; SReT Table 10 "Conv-Pooling Layer"): a 3 x 3 grouped
  convolution of stride 2 from C to C' channels with C groups, halving the resolution and
  widening the tokens between stages of the spatial pyramid.
"""

from __future__ import annotations

from torch import Tensor, nn


class ConvStem(nn.Sequential):
    """Three Conv3x3(stride 2)-BN-ReLU layers: B x in x H x W -> B x C x H/8 x W/8.

    Args:
        in_chans: image channels.
        embed_dim: output width C.
        hidden: widths of the first two convolutions; (C/2, C) as in SReT-T/TL/S by default
            (SReT-B prints 96, 168 for C = 336).
    """

    def __init__(
        self, in_chans: int, embed_dim: int, hidden: tuple[int, int] | None = None
    ) -> None:
        first, second = hidden or (embed_dim // 2, embed_dim)
        widths = [in_chans, first, second, embed_dim]
        layers: list[nn.Module] = []
        for cin, cout in zip(widths[:-1], widths[1:], strict=True):
            layers += [
                nn.Conv2d(cin, cout, kernel_size=3, stride=2, padding=1),
                nn.BatchNorm2d(cout),
                nn.ReLU(inplace=True),
            ]
        super().__init__(*layers)

    @staticmethod
    def grid_size(img_size: tuple[int, int]) -> tuple[int, int]:
        """Output rows and columns: each stride-2 convolution (padding 1) maps n to ceil(n/2)."""
        rows, cols = img_size
        for _ in range(3):
            rows, cols = (rows + 1) // 2, (cols + 1) // 2
        return rows, cols


class ConvPooling(nn.Module):
    """3 x 3 grouped convolution, stride 2: B x C x H x W -> B x C' x ceil(H/2) x ceil(W/2).

    Raises:
        ValueError: ``out_dim`` is not a multiple of ``in_dim`` (the grouping needs it).
    """

    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__()
        if out_dim % in_dim:
            raise ValueError(f"conv pooling from {in_dim} to {out_dim} channels needs a multiple")
        self.conv = nn.Conv2d(in_dim, out_dim, kernel_size=3, stride=2, padding=1, groups=in_dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(x)
