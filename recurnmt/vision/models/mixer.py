"""MLP-Mixer with SReT's recursion and learnable residual coefficients (SReT eq. 7, sec. 5.5).

A Mixer block (Tolstikhin et al. 2021, eq. 1) mixes tokens, then channels:

    U_{*,i} = X_{*,i} + W_2 GELU(W_1 LN(X)_{*,i}),   i = 1..C   (token mixing, hidden D_S)
    Y_{j,*} = U_{j,*} + W_4 GELU(W_3 LN(U)_{j,*}),   j = 1..S   (channel mixing, hidden D_C)

SReT's recursive Mixer runs every block twice in a row, Y = M(M(X)) (SReT eq. 7; no NLL
"for simplicity"), and "+LRC" puts learnable coefficients on both branches of both residuals
(SReT eq. 9). Both MLPs are :class:`~recurnmt.modules.FeedForward` and the coefficients
:class:`~recurnmt.modules.residual.ResidualCoefficients`. A Mixer block follows the level
protocol, so the levels run in the one level loop, :class:`~recurnmt.modules.RecurrentStack`,
by a ``sequence`` :class:`~recurnmt.modules.DepthPlan`. Shape legend: B batch, S tokens,
C channels.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from recurnmt.modules import DepthPlan, FeedForward, LevelHook, LevelParts, RecurrentStack
from recurnmt.modules.residual import ResidualCoefficients
from recurnmt.modules.tracing import traceable
from recurnmt.vision.layers import PatchEmbed, to_2tuple
from recurnmt.vision.layers.scripting import ScriptsAsInferenceGraph
from recurnmt.vision.registry import register_model


class MixerBlock(nn.Module):
    """Token mixing then channel mixing, with optional LRC (Mixer eq. 1, SReT eq. 7 and 9).

    Args:
        num_tokens: S (fixed by the image and patch size: token mixing is an S x D_S MLP).
        dim: C.
        token_dim: D_S.
        channel_dim: D_C.
        lrc: learnable residual coefficient mode (``none`` = plain Mixer).
        drop_rate: dropout on both residual branches.
    """

    def __init__(
        self,
        num_tokens: int,
        dim: int,
        token_dim: int,
        channel_dim: int,
        lrc: str = "none",
        drop_rate: float = 0.0,
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.token_mlp = FeedForward(num_tokens, token_dim, "gelu")
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.channel_mlp = FeedForward(dim, channel_dim, "gelu")
        self.lrc = ResidualCoefficients(2, lrc)
        self.drop = nn.Dropout(drop_rate)

    def forward(
        self,
        x: Tensor,
        parts: LevelParts,
        *,
        padding_mask: Tensor | None = None,
        memory: object = None,
        cache: object = None,
        hooks: Sequence[LevelHook] = (),
    ) -> Tensor:
        """One level (the level protocol of :mod:`recurnmt.modules.block`): B x S x C.

        Images have no padding, memory or cache; level hooks act before and after the block.
        """
        if padding_mask is not None or memory is not None or cache is not None:
            raise ValueError("a Mixer block takes no padding mask, memory or cache")
        # token mixing acts on the S axis: B x S x C -> B x C x S -> MLP -> B x S x C
        mixed = self.token_mlp(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        u = self.lrc(x, self.drop(mixed), 0)
        return parts.leave(self.lrc(u, self.drop(self.channel_mlp(self.norm2(u))), 1))


@traceable
class RecursiveMixer(ScriptsAsInferenceGraph, nn.Module):
    """Patch embedding, M Mixer blocks each run ``loops`` times in a row, pooling, head.

    Args:
        unique_layers: unique blocks M (the levels are ``unique_layers * loops``).
        loops: runs of each block in a row (1 = the plain MLP-Mixer; SReT uses 2).
        embed_dim: C.
        token_dim: D_S.
        channel_dim: D_C.
        lrc: learnable residual coefficients (``both`` for SReT's "+LRC").
        img_size: image size; fixes S = (H/P)(W/P), which token mixing depends on.
        patch_size: P.
        in_chans: image channels.
        num_classes: classifier outputs; 0 gives no head.
        global_pool: ``avg`` or ``""`` (none: the head reads every token).
        drop_rate: dropout in the blocks and before the head.
    """

    # forward_features gives tokens B x S x C, not a map (timm's Format)
    output_fmt = "NLC"

    def __init__(
        self,
        *,
        unique_layers: int = 12,
        loops: int = 2,
        embed_dim: int = 768,
        token_dim: int = 384,
        channel_dim: int = 3072,
        lrc: str = "both",
        img_size: int | tuple[int, int] = 224,
        patch_size: int | tuple[int, int] = 16,
        in_chans: int = 3,
        num_classes: int = 1000,
        global_pool: str = "avg",
        drop_rate: float = 0.0,
    ) -> None:
        super().__init__()
        self.img_size = to_2tuple(img_size)
        self.in_chans = in_chans
        self.num_classes = num_classes
        self.embed_dim = self.num_features = self.head_hidden_size = embed_dim
        self.patch_embed = PatchEmbed(patch_size, in_chans, embed_dim)
        rows, cols = self.patch_embed.grid_size(self.img_size)
        self.num_tokens = rows * cols
        plan = DepthPlan.build(unique_layers * loops, unique_layers, "sequence")
        self.stack = RecurrentStack(
            [
                MixerBlock(self.num_tokens, embed_dim, token_dim, channel_dim, lrc, drop_rate)
                for _ in range(unique_layers)
            ],
            [LevelParts(i) for i in range(plan.num_levels)],
            plan,
            final_norm=nn.LayerNorm(embed_dim, eps=1e-6),
        )
        self.head_drop = nn.Dropout(drop_rate)
        self.reset_classifier(num_classes, global_pool)
        reduction = self.patch_embed.patch_size[0]
        self.feature_info = [
            dict(module=f"stack.levels.{i}", num_chs=embed_dim, reduction=reduction)
            for i in range(plan.num_levels)
        ]

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Activation checkpointing per level (timm's API)."""
        self.stack.set_grad_checkpointing(enable)

    def set_depth(self, depth: int | None) -> None:
        """Runs ``depth`` levels: every block looped fewer times (elastic depth)."""
        self.stack.set_depth(depth)

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """Replaces the head with a fresh one of ``num_classes`` outputs (0: none), and the
        pooling where ``global_pool`` is given (``avg``, or ``""``: every token's)."""
        if global_pool is not None:
            if global_pool not in ("avg", ""):
                raise ValueError(f"global_pool={global_pool!r}; use avg or '' (none)")
            self.global_pool = global_pool
        self.num_classes = num_classes
        self.head = nn.Linear(self.embed_dim, num_classes) if num_classes > 0 else nn.Identity()

    def set_img_size(self, img_size: int | tuple[int, int]) -> None:
        """Refused: token mixing weights are sized for one token count.

        Raises:
            ValueError: always, unless the size gives the same number of tokens.
        """
        rows, cols = self.patch_embed.grid_size(to_2tuple(img_size))
        if rows * cols != self.num_tokens:
            raise ValueError("an MLP-Mixer cannot change its token count (token-mixing MLP)")
        self.img_size = to_2tuple(img_size)

    def forward_features(self, x: Tensor) -> Tensor:
        """Image B x C_in x H x W -> normalised tokens B x S x C (every block once in the
        shallow branch of mixed-depth training, SReT appendix B:
        :func:`~recurnmt.modules.shallow_branch`)."""
        x = self.patch_embed(x).flatten(2).transpose(1, 2)  # B x S x C
        return self.stack(checked_tokens(x, self.num_tokens, self.img_size)).output

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        """Tokens B x S x C -> logits (global average pooling, linear; with no pooling every
        token's)."""
        if self.global_pool == "avg":
            x = x.mean(dim=1)  # B x C
        x = self.head_drop(x)
        return x if pre_logits else self.head(x)

    def forward(self, x: Tensor) -> Tensor:
        return self.forward_head(self.forward_features(x))


def checked_tokens(x: Tensor, num_tokens: int, img_size: tuple[int, int]) -> Tensor:
    """``x`` (B x S x C), after checking S against the token count the Mixer was built for.

    Raises:
        ValueError: another token count (token mixing is sized for one).
    """
    if x.size(1) != num_tokens:
        raise ValueError(
            f"the image gives {x.size(1)} tokens; this Mixer was built for {num_tokens} "
            f"(img_size={img_size})"
        )
    return x


torch.fx.wrap("checked_tokens")  # a call in torch.fx's graph: the check runs with it

_B16 = dict(unique_layers=12, embed_dim=768, token_dim=384, channel_dim=3072, patch_size=16)


@register_model(fixed_input_size=True)
def mixer_b16_224(**kwargs) -> RecursiveMixer:
    """Mixer-B/16 (Mixer Table 1; SReT appendix H baseline): 12 blocks, 768, D_S 384, D_C 3072."""
    return RecursiveMixer(**{**_B16, "loops": 1, "lrc": "none", **kwargs})


@register_model(fixed_input_size=True)
def recursive_mixer_b16_224(**kwargs) -> RecursiveMixer:
    """Mixer-B/16 + recursion + LRC (SReT sec. 5.5): every block looped twice, same size."""
    return RecursiveMixer(**{**_B16, "loops": 2, "lrc": "both", **kwargs})


@register_model(img_size=32, fixed_input_size=True)
def recursive_mixer_mini(**kwargs) -> RecursiveMixer:
    """A CPU-sized recursive Mixer: 3 blocks x 2 loops, 64 wide, 4 x 4 patches of 32 x 32."""
    return RecursiveMixer(
        **{
            **dict(
                unique_layers=3,
                embed_dim=64,
                token_dim=32,
                channel_dim=128,
                patch_size=4,
                img_size=32,
                loops=2,
                lrc="both",
            ),
            **kwargs,
        }
    )
