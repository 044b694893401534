"""Sliced Recursive Transformer (SReT, Shen et al.): SReT-ExT/T/TL/S/B.

Structure (SReT appendix G, Table 10; appendix E "Spatial Pyramid Design"):

    stem (three stride-2 3x3 conv-BN-ReLU)  ->  C1 x H/8 x W/8, + learned position embedding
    stage 1: recursive blocks at width C1   ->  conv pooling (stride 2, grouped)
    stage 2: recursive blocks at width C2   ->  conv pooling
    stage 3: recursive blocks at width C3   ->  global average pooling, LayerNorm, linear head

A stage of ``[[block] x A] x B`` runs A unique pre-LN blocks, each looped B times in a row
(the internal loop, SReT sec. 5.2 and eq. 6), each loop followed by a non-linear projection
layer with weights of its own (NLL, SReT eq. 5), and every residual carrying learnable
coefficients (LRC, SReT eq. 9-10). Loop r of a block uses sliced group self-attention with
``groups[stage][r]`` groups (SReT sec. 4, appendix C/D; the paper's final design
[8,2][4,1][1,1]). There is no class token (SReT appendix E, "Other Small Modifications").

All of this is one :class:`~recurnmt.modules.RecurrentStack` per stage, configured with
``sharing="sequence"``, ``lrc``, ``nll_ratio`` and ``attn_groups``; this file adds only the
image parts. Shape legend: B batch, C width, h x w token grid, T = h * w tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn

from recurnmt.modules import DepthPlan, RecurrentStack, StackConfig
from recurnmt.vision.layers import PositionEmbedding, to_2tuple
from recurnmt.vision.layers.conv import ConvPooling, ConvStem
from recurnmt.vision.registry import register_model

FINAL_GROUPS = ((8, 2), (4, 1), (1, 1))  # SReT appendix C, Table 7: [8,2][4,1][1,1]


class SReT(nn.Module):
    """A spatial-pyramid recursive transformer (SReT Table 10).

    Args:
        dims: token width C of each stage.
        depths: unique blocks A of each stage.
        heads: attention heads of each stage.
        loops: times B each block runs in a row.
        groups: sliced attention groups per stage and loop (``None``: global attention,
            SReT-* in the paper's tables).
        mlp_ratio: FFN width as a multiple of C (3.6 in SReT-T, 4.0 in SReT-TL, 3.0 in S/B).
        nll_ratio: NLL width as a multiple of C (1.0 in T/TL, 2.0 in S/B; 0 = no NLL).
        lrc: learnable residual coefficient mode (``both`` = SReT eq. 9-10, ``none`` = off).
        img_size: training resolution; the learned position table is sized for it.
        in_chans: image channels.
        num_classes: classifier outputs; 0 gives no head.
        drop_rate: dropout on residual branches, after the position embedding and the head.
        attn_drop_rate: attention dropout.
        stem_dims: widths of the first two stem convolutions (default C1 / 2 and C1).
    """

    def __init__(
        self,
        dims: Sequence[int],
        depths: Sequence[int],
        heads: Sequence[int],
        *,
        loops: int = 2,
        groups: Sequence[Sequence[int]] | None = FINAL_GROUPS,
        mlp_ratio: float = 3.6,
        nll_ratio: float = 1.0,
        lrc: str = "both",
        img_size: int | tuple[int, int] = 224,
        in_chans: int = 3,
        num_classes: int = 1000,
        drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        stem_dims: tuple[int, int] | None = None,
    ) -> None:
        super().__init__()
        if not len(dims) == len(depths) == len(heads):
            raise ValueError(f"dims {dims}, depths {depths} and heads {heads} differ in length")
        if groups is not None and len(groups) != len(dims):
            raise ValueError(f"groups {groups} must give one tuple per stage ({len(dims)})")
        self.img_size = to_2tuple(img_size)
        self.in_chans = in_chans
        self.num_classes = num_classes
        self.embed_dim = self.num_features = dims[-1]
        self.stem = ConvStem(in_chans, dims[0], stem_dims)
        grid = ConvStem.grid_size(self.img_size)
        self.pos_embed = PositionEmbedding("learned", grid, dims[0])
        self.pos_drop = nn.Dropout(drop_rate)
        self.stages = nn.ModuleList()
        for s, (dim, depth, head) in enumerate(zip(dims, depths, heads, strict=True)):
            cfg = StackConfig(
                embed_dim=dim,
                ffn_dim=int(dim * mlp_ratio),
                num_heads=head,
                num_levels=depth * loops,
                num_unique=depth,
                sharing="sequence",
                normalize_before=True,
                activation="gelu",
                lrc=lrc,
                nll_ratio=nll_ratio,
                attn_groups=tuple(groups[s]) if groups is not None else (),
                dropout=drop_rate,
                attention_dropout=attn_drop_rate,
            )
            stack = RecurrentStack(cfg, DepthPlan.build(cfg.num_levels, depth, "sequence"))
            stack.final_norm = None  # SReT normalises once, after global pooling
            self.stages.append(stack)
        self.pools = nn.ModuleList(
            ConvPooling(a, b) for a, b in zip(dims[:-1], dims[1:], strict=True)
        )
        self.norm = nn.LayerNorm(dims[-1], eps=1e-6)
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(dims[-1], num_classes) if num_classes > 0 else nn.Identity()
        if isinstance(self.head, nn.Linear):
            nn.init.trunc_normal_(self.head.weight, std=0.02)
            nn.init.zeros_(self.head.bias)

    def no_weight_decay(self) -> set[str]:
        """Parameter names exempt from weight decay (besides all biases and 1-D tensors)."""
        return {"pos_embed.weight"}

    def set_img_size(self, img_size: int | tuple[int, int]) -> None:
        """Re-targets the model at a new resolution (SReT fine-tuning at 384, appendix E)."""
        self.img_size = to_2tuple(img_size)
        self.pos_embed.resize_(ConvStem.grid_size(self.img_size))

    def reset_classifier(self, num_classes: int) -> None:
        """Replaces the head with a fresh one of ``num_classes`` outputs."""
        self.num_classes = num_classes
        self.head = nn.Linear(self.embed_dim, num_classes) if num_classes > 0 else nn.Identity()

    def forward_features(self, x: Tensor, shallow: bool = False) -> Tensor:
        """Image B x in x H x W -> last-stage tokens B x T x C3.

        Args:
            shallow: every block runs once (no second loop): the shallow branch of mixed-depth
                training (SReT appendix B).
        """
        x = self.stem(x)  # B x C1 x h x w
        for s, stage in enumerate(self.stages):
            if s > 0:
                x = self.pools[s - 1](x)  # B x C_s x ceil(h/2) x ceil(w/2)
            h, w = x.shape[-2:]
            x = x.flatten(2).transpose(1, 2)  # B x T x C
            if s == 0:
                x = self.pos_drop(self.pos_embed(x, (h, w)))
            levels = stage.plan.first_loop_levels() if shallow else None
            x, _ = stage(x, levels=levels)
            if s + 1 < len(self.stages):
                x = x.transpose(1, 2).reshape(x.size(0), -1, h, w)  # B x C x h x w
        return x

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        """Tokens B x T x C -> logits: average pooling, LayerNorm, linear."""
        x = self.head_drop(self.norm(x.mean(dim=1)))  # B x C
        return x if pre_logits else self.head(x)

    def forward(self, x: Tensor, shallow: bool = False) -> Tensor:
        return self.forward_head(self.forward_features(x, shallow))


def _create(defaults: dict, kwargs: dict) -> SReT:
    return SReT(**{**defaults, **kwargs})


# Table 10: widths are base dims x heads, e.g. SReT-T 32 x (2, 4, 8) = (64, 128, 256).
_TINY = dict(dims=(64, 128, 256), depths=(2, 5, 3), heads=(2, 4, 8), nll_ratio=1.0)
_SMALL = dict(
    dims=(126, 252, 504), depths=(2, 5, 3), heads=(3, 6, 12), mlp_ratio=3.0, nll_ratio=2.0
)


@register_model
def sret_t(**kwargs) -> SReT:
    """SReT-T (SReT Table 10): widths 64/128/256, blocks [2, 5, 3] x 2 loops, FFN 3.6, 4.76M."""
    return _create({**_TINY, "mlp_ratio": 3.6}, kwargs)


@register_model
def sret_tl(**kwargs) -> SReT:
    """SReT-TL (SReT Table 10): SReT-T with FFN ratio 4.0, 4.99M."""
    return _create({**_TINY, "mlp_ratio": 4.0}, kwargs)


@register_model
def sret_s(**kwargs) -> SReT:
    """SReT-S (SReT Table 10): widths 126/252/504, FFN 3.0, NLL 2.0, 20.9M."""
    return _create(_SMALL, kwargs)


@register_model
def sret_b(**kwargs) -> SReT:
    """SReT-B as printed in SReT Table 10: widths 336/672/1344, [2, 5, 3] x 2, FFN 3.0, NLL 2.0.

    The table states 71.2M parameters, but the structure it prints has 144.7M (the same
    arithmetic reproduces SReT-T/TL/S exactly); the paper does not say which part of the
    printed structure differs, so we build what is printed. The paper gives no head count;
    56-wide heads (6/12/24) are our choice. The stem follows the printed 96/168/336 widths.
    """
    return _create(
        {**_SMALL, "dims": (336, 672, 1344), "heads": (6, 12, 24), "stem_dims": (96, 168)}, kwargs
    )


@register_model
def sret_ext(**kwargs) -> SReT:
    """SReT-ExT, the "ex-tiny" model of SReT Table 2/5 (4.0M, 0.7G FLOPs).

    The paper does not publish its configuration. Ours keeps SReT-T's widths, heads and
    ratios with [1, 2, 3] unique blocks: 3.94M parameters, 0.69 GMACs at 224.
    """
    return _create({**_TINY, "depths": (1, 2, 3), "mlp_ratio": 3.6}, kwargs)


@register_model
def sret_mini(**kwargs) -> SReT:
    """A CPU-sized SReT (widths 32/64/128, one block per stage, 2 loops) for 32 x 32 images."""
    return _create(
        dict(
            dims=(32, 64, 128),
            depths=(1, 1, 1),
            heads=(1, 2, 4),
            mlp_ratio=2.0,
            nll_ratio=1.0,
            groups=((2, 1), (1, 1), (1, 1)),
            img_size=32,
        ),
        kwargs,
    )
