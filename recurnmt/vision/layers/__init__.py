"""Image-specific layers: patch embedding, position embeddings, convolutional stem and pooling.

Attention, feed-forward and level-signal code is not here: it lives once, in
:mod:`recurnmt.modules`, and the image models use it from there.
"""

from recurnmt.vision.layers.patch_embed import PatchEmbed, to_2tuple
from recurnmt.vision.layers.pos_embed import PositionEmbedding, resize_grid, sincos_2d

__all__ = ["PatchEmbed", "PositionEmbedding", "resize_grid", "sincos_2d", "to_2tuple"]
