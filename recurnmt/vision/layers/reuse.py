"""DVT's reuse mechanisms (Wang et al. 2021, sec. 3.2): feature and relationship reuse.

A downstream model of a DVT cascade reuses its upstream model's computation:

* :class:`FeatureReuse` (eq. 4-5): context embeddings ``E_l = f_l(z^up)`` upsampled to the
  downstream grid and concatenated to the FFN input of every downstream level;
* :class:`RelationReuse` (eq. 8-9): an MLP over the upstream attention logits of all levels,
  upsampled row- and column-wise (Fig. 5) and added to each downstream level's logits.

Both reach each level of a downstream :class:`~recurnmt.modules.RecurrentStack` through one
:class:`ReuseHook` per forward pass (a :class:`~recurnmt.modules.hooks.LevelHook`: the
relation term is the self-attention's logit bias, the feature term replaces the pre-FFN
norm); the same hook captures a stage's logits for its downstream model. The cascade is
:mod:`recurnmt.vision.models.dvt`, which also lists the choices made where the paper is silent.

Shape legend: B batch, T = 1 + N tokens with an N = h x w grid, D width, H heads, L levels,
D' context width, F FFN width, M attention maps.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from recurnmt.modules.attention import AttentionTerms
from recurnmt.modules.hooks import LevelHook

Grid = tuple[int, int]


def resize_matrix(grid_in: Grid, grid_out: Grid, mode: str, like: Tensor) -> Tensor:
    """The resize of an ``grid_in`` map to ``grid_out`` (``F.interpolate`` with ``mode``) as
    an N_out x N_in matrix, on ``like``'s device and dtype.

    Resizing is linear in the map, so its matrix is the resize of every basis map; applying
    it is a matrix product, whose backward is a matrix product too. ``F.interpolate``'s own
    backward (bilinear, bicubic) accumulates with atomic adds on CUDA, so two identical runs
    differ in the last bits and a resumed run drifts from one that never stopped.
    """
    n = grid_in[0] * grid_in[1]
    basis = torch.eye(n, dtype=like.dtype, device=like.device).reshape(n, 1, *grid_in)
    resized = F.interpolate(basis, size=grid_out, mode=mode, **_align(mode))  # N_in x 1 x h' x w'
    return resized.reshape(n, -1).t()  # N_out x N_in


def upsample_tokens(x: Tensor, grid_in: Grid, grid_out: Grid, mode: str = "bilinear") -> Tensor:
    """Patch tokens B x N_in x C on ``grid_in`` -> B x N_out x C on ``grid_out``."""
    if tuple(grid_in) == tuple(grid_out):
        return x
    return resize_matrix(grid_in, grid_out, mode, x) @ x  # B x N_out x C


def upsample_relations(
    a: Tensor, grid_in: Grid, grid_out: Grid, prefix: int = 1, mode: str = "bilinear"
) -> Tensor:
    """Attention maps B x M x T_in x T_in -> B x M x T_out x T_out (DVT Fig. 5).

    Rows (queries) and columns (keys) each index the token grid, so each is reshaped to the
    grid, resized and flattened; a plain 2-D resize of the T x T map would mix tokens that are
    not neighbours. The ``prefix`` (class-token) rows and columns are kept as they are.
    """
    if tuple(grid_in) == tuple(grid_out):
        return a

    resize = resize_matrix(grid_in, grid_out, mode, a).t()  # N_in x N_out

    def keys(m: Tensor) -> Tensor:
        # B x M x R x T_in -> B x M x R x T_out, resizing the grid of the last axis
        return torch.cat([m[..., :prefix], m[..., prefix:] @ resize], dim=-1)

    a = keys(a)  # B x M x T_in x T_out
    return keys(a.transpose(-1, -2)).transpose(-1, -2)  # B x M x T_out x T_out


def _align(mode: str) -> dict:
    return {"align_corners": False} if mode in ("bilinear", "bicubic") else {}


class FeatureReuse(nn.Module):
    """Context embeddings from the upstream model's tokens (DVT eq. 4-5).

    ``E_l = f_l(z^up)`` with ``f_l = LN -> Linear(D_up, hidden) -> GELU -> Linear(hidden, D')``,
    upsampled to the downstream grid. Level l of the downstream stack then runs its FFN on
    ``LN(Concat(z'_l, E_l))`` (eq. 5): the context LN and the D' extra first-layer columns
    ``W_E`` live here, the rest is the backbone's own norm and FFN.

    Args:
        upstream_dim: width of the upstream tokens D_up.
        embed_dim: width of the downstream model (unused by the maths, kept for checks).
        ffn_dim: FFN width F of the downstream model.
        block_of_level: the downstream depth plan (level -> unique block).
        norms_per_level: the downstream model owns norms per level (RingFormer), so the
            context LN is per level too; else per unique block.
        shared_ffn: the downstream blocks share one FFN (One Wide FFN): one set of columns.
        hidden_dim: hidden width of ``f_l`` (128 in the paper).
        context_dim: D' (48 in the paper).
        norm_eps: LN epsilon.
        skip_last_level: no ``f_L`` for the last level, whose context is zero: the class
            token's context is zero anyway (sec. 3.2), and the last level's patch tokens are
            never read when the downstream model is the cascade's last and classifies from its
            class token, so ``f_L`` would change nothing and receive no gradient.
    """

    def __init__(
        self,
        upstream_dim: int,
        embed_dim: int,
        ffn_dim: int,
        block_of_level: Sequence[int],
        *,
        norms_per_level: bool = False,
        shared_ffn: bool = False,
        hidden_dim: int = 128,
        context_dim: int = 48,
        norm_eps: float = 1e-6,
        skip_last_level: bool = False,
    ) -> None:
        super().__init__()
        self.block_of_level = tuple(block_of_level)
        num_levels, num_blocks = len(self.block_of_level), max(self.block_of_level) + 1
        self.embed_dim, self.context_dim = embed_dim, context_dim
        self.f = nn.ModuleList(
            nn.Sequential(
                nn.LayerNorm(upstream_dim, eps=norm_eps),
                nn.Linear(upstream_dim, hidden_dim),
                nn.GELU(),
                nn.Linear(hidden_dim, context_dim),
            )
            for _ in range(num_levels - int(skip_last_level))
        )
        self.norm_of_level = tuple(range(num_levels)) if norms_per_level else self.block_of_level
        self.proj_of_level = (0,) * num_levels if shared_ffn else self.block_of_level
        self.norms = nn.ModuleList(
            nn.LayerNorm(context_dim, eps=norm_eps) for _ in range(max(self.norm_of_level) + 1)
        )
        self.projs = nn.ModuleList(
            nn.Linear(context_dim, ffn_dim, bias=False)
            for _ in range(1 if shared_ffn else num_blocks)
        )
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    def contexts(
        self, tokens: Tensor, grid_in: Grid, grid_out: Grid, prefix: int, mode: str
    ) -> Tensor:
        """Upstream tokens B x T_up x D_up -> contexts L x B x N x D' on the downstream grid
        (L counts the levels that have an ``f_l``).

        Eq. 4's "reshaped to the corresponding locations in the original image, upsampled":
        the context of level l at downstream token n comes from the upstream tokens at the
        same image location (on equal grids, exactly ``f_l`` of upstream token n).
        """
        patches = tokens[:, prefix:]  # B x N_up x D_up
        if not self.f:  # a one-level model whose only level is skipped
            return patches.new_zeros(
                0, patches.size(0), grid_out[0] * grid_out[1], self.context_dim
            )
        e = torch.stack([f(patches) for f in self.f], dim=2)  # B x N_up x L x D'
        # levels as channels of one image, so all levels are upsampled in one call
        e = upsample_tokens(e.flatten(2), grid_in, grid_out, mode)
        return e.unflatten(-1, (len(self.f), self.context_dim)).permute(
            2, 0, 1, 3
        )  # L x B x N x D'

    def ffn_input(
        self, contexts: Tensor, level: int, prefix: int, x: Tensor, norm: nn.Module
    ) -> tuple[Tensor, Tensor]:
        """Level ``level``'s FFN input from ``LN(Concat(z', E_l))`` (eq. 5): the D part of
        the joint norm (B x T x D) and ``W_E`` times its D' part (B x T x F)."""
        if not isinstance(norm, nn.LayerNorm) or norm.weight is None or norm.bias is None:
            raise ValueError("feature reuse needs affine LayerNorms before the FFN")
        # B x T x D', zero at the class token (and at a skipped last level)
        if level < len(self.f):  # contexts holds one per f_l
            e = contexts[level]
        else:
            e = x.new_zeros(x.size(0), x.size(1) - prefix, self.context_dim)
        e = F.pad(e, (0, 0, prefix, 0))
        ctx_norm = self.norms[self.norm_of_level[level]]
        d = x.size(-1)
        u = torch.cat([x, e.to(x.dtype)], dim=-1)  # B x T x (D + D')
        weight = torch.cat([norm.weight, ctx_norm.weight])
        bias = torch.cat([norm.bias, ctx_norm.bias])
        u = F.layer_norm(u, (u.size(-1),), weight, bias, norm.eps)
        h, c = u.split([d, u.size(-1) - d], dim=-1)
        return h, self.projs[self.proj_of_level[level]](c)


class RelationReuse(nn.Module):
    """``r_l(A^up)`` for every downstream level at once (DVT eq. 8-9, Fig. 4).

    A position-wise MLP over the stacked upstream logits (channels = upstream heads x levels)
    with one hidden layer shared by all levels (``hidden_ratio`` x downstream heads x levels)
    and each level's H output channels, then the row/column upsampling of Fig. 5.

    Args:
        upstream_maps: N^Att_up, the upstream heads x levels.
        num_heads: downstream heads H.
        num_levels: downstream levels L.
        hidden_ratio: hidden width as a multiple of H L (3 in the paper).
    """

    def __init__(
        self, upstream_maps: int, num_heads: int, num_levels: int, hidden_ratio: int = 3
    ) -> None:
        super().__init__()
        self.num_heads, self.num_levels = num_heads, num_levels
        maps = num_heads * num_levels
        # 1 x 1 convolutions: a position-wise MLP on the channels-first maps (no transposes)
        self.fc1 = nn.Conv2d(upstream_maps, hidden_ratio * maps, 1)
        self.fc2 = nn.Conv2d(hidden_ratio * maps, maps, 1)
        for m in (self.fc1, self.fc2):
            nn.init.trunc_normal_(m.weight, std=0.02)
            nn.init.zeros_(m.bias)

    def hidden(self, logits: Tensor) -> Tensor:
        """Upstream logits B x M_up x T_up x T_up -> hidden B x 3HL x T_up x T_up (in the MLP's
        dtype: attention gives its logits in float32, a bfloat16 model's MLP is bfloat16)."""
        return F.gelu(self.fc1(logits.to(self.fc1.weight.dtype)))

    def bias(
        self, hidden: Tensor, level: int, grid_in: Grid, grid_out: Grid, prefix: int, mode: str
    ) -> Tensor:
        """Level ``level``'s additive logits B x H x T x T on the downstream grid."""
        rows = slice(level * self.num_heads, (level + 1) * self.num_heads)
        a = F.conv2d(hidden, self.fc2.weight[rows], self.fc2.bias[rows])  # B x H x T_up x T_up
        return upsample_relations(a, grid_in, grid_out, prefix, mode)


class ReuseHook(LevelHook):
    """DVT's reuse in one forward pass of a downstream stage, and its logit capture.

    Args:
        prefix: prefix (class) tokens of the stage.
        features: the stage's :class:`FeatureReuse` and its contexts (L x B x N x D'),
            or None.
        relations: the stage's :class:`RelationReuse` and its hidden maps
            (:meth:`RelationReuse.hidden`), or None.
        grids: the upstream and this stage's token grids.
        mode: the upsampling mode.
        capture: if given, receives this stage's self-attention logits of every level, in
            order (for the next stage's relation reuse).
    """

    def __init__(
        self,
        prefix: int,
        *,
        features: tuple[FeatureReuse, Tensor] | None = None,
        relations: tuple[RelationReuse, Tensor] | None = None,
        grids: tuple[Grid, Grid] | None = None,
        mode: str = "bilinear",
        capture: list[Tensor] | None = None,
    ) -> None:
        if (features or relations) and grids is None:
            raise ValueError("reuse needs the upstream and downstream grids")
        self.prefix, self.features, self.relations = prefix, features, relations
        self.grids, self.mode, self.capture = grids, mode, capture

    def attention(self, level: int, h: Tensor) -> AttentionTerms | None:
        bias = None
        if self.relations is not None:
            rr, hidden = self.relations
            bias = rr.bias(hidden, level, *self.grids, self.prefix, self.mode)
        probes = (self.capture.append,) if self.capture is not None else ()
        return AttentionTerms(bias=bias, probes=probes) if bias is not None or probes else None

    def ffn_input(self, level: int, x: Tensor, norm: nn.Module) -> tuple[Tensor, Tensor] | None:
        if self.features is None:
            return None
        fr, contexts = self.features
        return fr.ffn_input(contexts, level, self.prefix, x, norm)
