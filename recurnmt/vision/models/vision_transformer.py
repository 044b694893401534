"""The Vision Transformer module: patch tokens (ViT eq. 1) through a level stack from
:mod:`recurnmt.modules`, classified from the class token (ViT eq. 4) or the average token.

Every ViT family of :mod:`recurnmt.vision.models.vit` is this module with another stack; that
file builds the stacks and registers the models. Shape legend: B batch, C channels, H x W
image, P patch, D width, N = (H/P)(W/P) patch tokens, T = N + 1 with the class token.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from recurnmt.modules import (
    ConfigError,
    CoordinateConfig,
    LevelHook,
    RecurrentStack,
    positions_hooks,
)
from recurnmt.modules.tracing import traceable
from recurnmt.vision.layers import PatchEmbed, PositionEmbedding, to_2tuple
from recurnmt.vision.layers.features import feature_take_indices, level_intermediates
from recurnmt.vision.layers.layer_attention import LayerAttention
from recurnmt.vision.layers.scripting import ScriptsAsInferenceGraph


@traceable
class VisionTransformer(ScriptsAsInferenceGraph, nn.Module):
    """Patch embedding, a level stack and a classifier (ViT eq. 1-4).

    Args:
        stack: the level stack (:class:`~recurnmt.modules.RecurrentStack`), its final norm
            included.
        embed_dim: token width D (the stack's width).
        img_size: the training image size (rows, cols); other sizes work too, the learned
            position table is interpolated for them.
        patch_size: patch size P.
        in_chans: image channels.
        num_classes: classifier outputs; 0 gives no head (features only).
        class_token: prepend a learned class token (ViT eq. 1); otherwise average the tokens.
        global_pool: ``token`` (class token), ``avg`` (mean of the patch tokens) or ``""``
            (none: the head reads every token, timm's convention).
        pos_embed: ``learned``, ``sincos`` or ``none`` (see :mod:`~recurnmt.vision.layers`).
        drop_rate: dropout after the position embedding and before the head.
        layer_attention: MRLA run after every level of the stack on the patch tokens
            (:class:`~recurnmt.vision.layers.layer_attention.LayerAttention`); None for none.
        coordinates: the stack's coordinate settings: with ``positions_every_level`` the
            position embedding is added before every level, scaled as the level embedding,
            instead of once (Universal Transformer coordinate embedding); None: once.
    """

    # forward_features gives tokens B x T x D, not a map (timm's Format: a ViT's layout)
    output_fmt = "NLC"

    def __init__(
        self,
        stack: RecurrentStack,
        embed_dim: int,
        *,
        img_size: int | tuple[int, int] = 224,
        patch_size: int | tuple[int, int] = 16,
        in_chans: int = 3,
        num_classes: int = 1000,
        class_token: bool = True,
        global_pool: str = "token",
        pos_embed: str = "learned",
        drop_rate: float = 0.0,
        layer_attention: LayerAttention | None = None,
        coordinates: CoordinateConfig | None = None,
    ) -> None:
        super().__init__()
        self.num_prefix_tokens = 1 if class_token else 0
        self.global_pool = _check_pool(global_pool, self.num_prefix_tokens)
        self.embed_dim = self.num_features = self.head_hidden_size = embed_dim
        self.num_classes = num_classes
        self.img_size = to_2tuple(img_size)
        self.in_chans = in_chans
        self.patch_embed = PatchEmbed(patch_size, in_chans, embed_dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim)) if class_token else None
        grid = self.patch_embed.grid_size(self.img_size)
        self.pos_embed = PositionEmbedding(pos_embed, grid, embed_dim, self.num_prefix_tokens)
        self.pos_drop = nn.Dropout(drop_rate)
        self.stack = stack
        self.layer_attn = layer_attention
        self.coordinates = coordinates or CoordinateConfig()
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(embed_dim, num_classes) if num_classes > 0 else nn.Identity()
        # timm's feature points: every level of the stack, a level being one pass through a
        # (possibly shared) block; a shared stack's levels are its stages of computation
        reduction = self.patch_embed.patch_size[0]
        self.feature_info = [
            dict(module=f"stack.levels.{i}", num_chs=embed_dim, reduction=reduction)
            for i in range(stack.num_levels)
        ]
        self._init_own_weights()

    def _init_own_weights(self) -> None:
        # The stack initialises itself (recurnmt.modules); these are the image-side parts.
        if self.cls_token is not None:
            nn.init.trunc_normal_(self.cls_token, std=0.02)
        w = self.patch_embed.proj.weight
        nn.init.trunc_normal_(w.view(w.size(0), -1), std=0.02)
        nn.init.zeros_(self.patch_embed.proj.bias)
        if isinstance(self.head, nn.Linear):
            nn.init.trunc_normal_(self.head.weight, std=0.02)
            nn.init.zeros_(self.head.bias)

    @property
    def positions_every_level(self) -> bool:
        """The stack adds the positions at every level (UT), not the embedding once."""
        return self.coordinates.positions_every_level

    def no_weight_decay(self) -> set[str]:
        """Parameter names exempt from weight decay (besides all biases and norms)."""
        return {"cls_token", "pos_embed.weight"}

    def set_img_size(self, img_size: int | tuple[int, int]) -> None:
        """Re-targets the model at a new resolution (fine-tuning, DeiT sec. 6)."""
        self.img_size = to_2tuple(img_size)
        self.pos_embed.resize_(self.patch_embed.grid_size(self.img_size))

    def set_grad_checkpointing(self, enable: bool = True, segment: int | str = 0) -> None:
        """Activation checkpointing per level of the stack (timm's API); ``segment`` (k levels
        or ``"sqrt"``) also checkpoints every k levels as one segment (memory O(sqrt N)),
        see :meth:`RecurrentStack.set_grad_checkpointing`."""
        self.stack.set_grad_checkpointing(enable, segment=segment)

    def set_depth(self, depth: int | None) -> None:
        """Runs ``depth`` levels of the trained stack (elastic depth; None: as built).

        See :meth:`~recurnmt.modules.DepthPlan.depth_levels` for the depths a stack has.

        Raises:
            ConfigError: naming ``levels``, a depth the stack or its MRLA does not define.
        """
        built = len(self.layer_attn.drop_path) if self.layer_attn is not None else None
        if depth is not None and built is not None and depth > built:
            raise ConfigError(
                "levels", depth, f"MRLA exists for the {built} levels it was trained with"
            )
        self.stack.set_depth(depth)

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """Replaces the head with a fresh one of ``num_classes`` outputs (0: none), and the
        pooling where ``global_pool`` is given (timm's API)."""
        if global_pool is not None:
            self.global_pool = _check_pool(global_pool, self.num_prefix_tokens)
        self.num_classes = num_classes
        self.head = nn.Linear(self.embed_dim, num_classes) if num_classes > 0 else nn.Identity()
        self._init_own_weights()

    def embed(self, x: Tensor) -> tuple[Tensor, tuple[int, int]]:
        """Image B x C x H x W -> tokens B x T x D and the token grid (ViT eq. 1).

        The position embedding is added here, unless the stack adds it at every level
        (Universal Transformer coordinate embedding).
        """
        x = self.patch_embed(x)  # B x D x H/P x W/P
        grid = (x.size(2), x.size(3))
        x = x.flatten(2).transpose(1, 2)  # B x N x D
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.size(0), -1, -1), x], dim=1)  # B x T x D
        if not self.positions_every_level:
            x = self.pos_embed(x, grid)
        return self.pos_drop(x), grid

    def _own_hooks(self, x: Tensor, grid: tuple[int, int]) -> list[LevelHook]:
        own: list[LevelHook] = []
        if self.positions_every_level:
            own += positions_hooks(self.coordinates, self.pos_embed.table(grid, x))
        if self.layer_attn is not None:
            own.append(self.layer_attn.start(grid, self.num_prefix_tokens))
        return own

    def forward_features(self, x: Tensor, hooks: Sequence[LevelHook] = ()) -> Tensor:
        """Image B x C x H x W -> normalised tokens B x T x D (ViT eq. 2-4 before the head).

        Args:
            hooks: further level hooks for the stack, after the model's own (UT positions,
                MRLA): DVT's reuse, recording level outputs.
        """
        x, grid = self.embed(x)
        return self.stack(x, hooks=[*self._own_hooks(x, grid), *hooks]).output

    def forward_intermediates(
        self,
        x: Tensor,
        indices: int | Sequence[int] | None = None,
        return_prefix_tokens: bool = False,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
        hooks: Sequence[LevelHook] = (),
    ) -> list[Tensor] | tuple[Tensor, list[Tensor]]:
        """The outputs of the levels ``indices`` (timm's API: an int n takes the last n, None
        all; a level is one pass through a block, so a shared block's every pass is a feature
        point), as B x D x h x w maps (``NCHW``) or B x N x D tokens (``NLC``), with the
        final norm where ``norm``; and, unless ``intermediates_only``, the features of
        :meth:`forward_features` (the levels after the last index run only then, or where
        ``stop_early`` is false). ``hooks``: further level hooks, as for
        :meth:`forward_features`."""
        tokens, grid = self.embed(x)
        order = list(self.stack.active_levels)
        own = [*self._own_hooks(tokens, grid), *hooks]
        return level_intermediates(
            self.stack, tokens, grid, order, own, indices,
            self.num_prefix_tokens, return_prefix_tokens, norm, stop_early, output_fmt,
            intermediates_only,
        )  # fmt: skip

    def prune_intermediate_layers(
        self, indices: int | Sequence[int] = 1, prune_norm: bool = False, prune_head: bool = True
    ) -> list[int]:
        """Drops what the levels ``indices`` do not need (timm's API): the head (and its
        pooling) where ``prune_head``, the final norm where ``prune_norm``. A shared stack keeps
        its levels: the blocks after the last index are the blocks before it, and
        :meth:`forward_intermediates` stops after the last level asked for. Returns the
        levels taken."""
        take, _ = feature_take_indices(len(self.stack.active_levels), indices)
        if prune_head:
            self.reset_classifier(0, "")
        if prune_norm:
            self.stack.final_norm = None
        return take

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        """Tokens B x T x D -> logits B x num_classes (or the pooled B x D); with no pooling
        (``global_pool=""``) every token's."""
        if self.global_pool == "token":
            x = x[:, 0]  # B x D, the class token
        elif self.global_pool == "avg":
            x = x[:, self.num_prefix_tokens :].mean(dim=1)  # B x D
        x = self.head_drop(x)
        return x if pre_logits else self.head(x)

    def forward(self, x: Tensor) -> Tensor:
        return self.forward_head(self.forward_features(x))


def _check_pool(global_pool: str, num_prefix_tokens: int) -> str:
    if global_pool not in ("token", "avg", ""):
        raise ValueError(f"global_pool={global_pool!r}; use token, avg or '' (none)")
    if global_pool == "token" and not num_prefix_tokens:
        raise ValueError("global_pool='token' needs class_token=True")
    return global_pool
