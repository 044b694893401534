"""Multi-head recurrent layer attention, MRLA (Fang et al., ICLR 2023).

After level t of a stack, a query summarising the level's output ``X^t`` retrieves from the
earlier levels of the same stage (MRLA sec. 3-4). Two variants:

* **MRLA-light** (eq. 8, per head eq. 9 right; Algorithm 4):
  ``O^t = lambda_o^t * O^{t-1} + Q^t (K^t_t)^T V^t_t``, one learnable ``lambda_o^t`` of size C,
  linear in depth.
* **MRLA-base** (eq. 6, per head eq. 9 left; Algorithm 2): the query attends to the keys and
  values of every level of the stage so far, ``O^t = softmax(Q^t (K^t)^T / sqrt(d_k)) V^t``.

Per level (MRLA sec. 4, Fig. 2a, Algorithms 2 and 4), on the patch tokens only:

* ``f_Q``, ``f_K``: global average pooling over the patch tokens, then a bias-free Conv1D
  along the channels whose kernel size follows ECA's adaptive rule (Wang et al. 2020b):
  the odd number nearest ``(log2 C + 1) / 2``, rounded up;
* ``f_V``: a 3 x 3 depth-wise convolution on the token grid (followed by GELU in MRLA-light,
  Algorithm 4 line 13; none in MRLA-base, Algorithm 2 line 12);
* heads of ``d_k`` channels (d_k = 16 for vision transformers, sec. 5.1): head h weights its
  ``d_k`` value channels by the score of its ``d_k`` query and key channels;
* the class token (and any other prefix token) bypasses MRLA (Algorithm 4 lines 4 and 18).

In CNNs (sec. 4 "CNNs", Fig. 2a, Algorithms 1 and 3; ``recurnmt/vision/models/mrla_resnet.py``)
the same levels run on the block's feature map seen as tokens (a view, no copy), with d_k = 32
(sec. 5.1), no input LayerNorm and no GELU on the value (Algorithms 1 and 3), and a batch norm
on the branch (``branch_norm``, as the released ResNet code).

Choices where the paper is silent (the released code differs from the paper's text in places;
we follow the paper):

* MRLA-light scores are ``sigmoid(Q_h . K_h / sqrt(d_k))``: sec. 4 adds "a sigmoid activation
  on the projection of query and key to scale the attention weights into [0, 1]"; the scale
  is the usual attention scale. MRLA-base uses softmax over the stage's levels (sec. 3.1,
  "the softmax ... omitted for clarity"; Appendix A.3).
* ``X^t`` passes a LayerNorm before ``f_Q, f_K, f_V`` (pre-LN stacks let the residual stream
  grow with depth); eq. 8 holds exactly for the normalised input.
* ``O^t`` joins the token stream as a residual branch, ``x_p <- x_p + DropPath(O^t_p)``:
  sec. 3.3 reads eq. 8 as "a generalized residual connection", and a plain replacement of
  the patch tokens by ``O_p^t`` (Algorithm 4 line 18) would drop the block's own output.
* Stochastic depth on that branch has the level's rate, sampled independently of the
  MHSA/FFN branches (App. B.1.1 "shares the same probability"); the recurrent state ``O^t``
  itself is never dropped.
* Levels are grouped into stages (App. B.1.1: 12 layers, three stages of four); the state is
  reset at every stage boundary. A stage's first level has nothing to retrieve, so it has no
  ``lambda_o`` (MRLA-light) and no query (MRLA-base: a softmax over one level is 1):
  parameters that could never receive a gradient are not created.
* ``lambda_o`` starts at 1 (ablation (e), the identity connection) and learns away from it.
* A classifier that reads only the class token never sees the patch tokens after the last
  level, so MRLA there would have no effect on its output and get no gradient; such models
  leave it out (``skip_last_level``). Average-pooling models keep it.

Shape legend: B batch, N patch tokens (h x w grid), P prefix tokens, T = P + N, C channels,
H MRLA heads, d = d_k channels per head, L levels seen so far in the stage.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from recurnmt.modules.drop_path import drop_path as _drop_path
from recurnmt.modules.hooks import LevelHook

MRLA_VARIANTS = ("light", "base")

# the recurrent state of one stage: O^{t-1} (light) or the stacked keys and values (base)
LayerState = Tensor | tuple[Tensor, Tensor] | None


def eca_kernel_size(channels: int, gamma: int = 2, beta: int = 1) -> int:
    """ECA's adaptive Conv1D kernel size (Wang et al. 2020b, eq. 12): ``|(log2 C + b)/g|_odd``.

    ``channels=192`` gives 5, ``384`` and ``768`` give 5, ``64`` gives 3.
    """
    t = int(abs((math.log2(channels) + beta) / gamma))
    return t if t % 2 else t + 1


class LayerProjections(nn.Module):
    """``f_Q``, ``f_K`` and ``f_V`` of one level (MRLA eq. 2-3 with sec. 4's design).

    Args:
        dim: channels C.
        head_dim: channels per MRLA head d_k; must divide ``dim``.
        query: build the query (off at MRLA-base's first level of a stage, whose softmax
            over one level is 1; its key still serves the later levels).
        value_act: GELU after the depth-wise convolution (MRLA-light in vision transformers,
            Algorithm 4; none in CNNs, Algorithms 1 and 3).
        kernel_size: Conv1D kernel; ECA's adaptive size when None.
        norm_eps: epsilon of the input LayerNorm.
        input_norm: a LayerNorm on the input (transformers); a CNN's block output is already
            batch-normalised, and Algorithms 1 and 3 read it as it is.
    """

    def __init__(
        self,
        dim: int,
        head_dim: int,
        *,
        query: bool = True,
        value_act: bool = True,
        kernel_size: int | None = None,
        norm_eps: float = 1e-6,
        input_norm: bool = True,
    ) -> None:
        super().__init__()
        self.num_heads, self.head_dim = dim // head_dim, head_dim
        self.norm = nn.LayerNorm(dim, eps=norm_eps) if input_norm else nn.Identity()
        k = kernel_size or eca_kernel_size(dim)
        self.query = nn.Conv1d(1, 1, k, padding=k // 2, bias=False) if query else None
        self.key = nn.Conv1d(1, 1, k, padding=k // 2, bias=False)
        self.value = nn.Conv2d(dim, dim, 3, padding=1, groups=dim, bias=False)
        self.value_act = nn.GELU() if value_act else nn.Identity()

    def forward(self, x: Tensor, grid: tuple[int, int]) -> tuple[Tensor | None, Tensor, Tensor]:
        """Patch tokens B x N x C on an h x w grid -> Q (B x H x d, or None), K (B x H x d)
        and V (B x N x H x d)."""
        b, n, c = x.shape
        x = self.norm(x)
        v = x.transpose(1, 2).reshape(b, c, *grid)  # B x C x h x w
        v = self.value_act(self.value(v)).flatten(2).transpose(1, 2)  # B x N x C
        v = v.unflatten(-1, (self.num_heads, self.head_dim))  # B x N x H x d
        y = x.mean(dim=1, keepdim=True)  # B x 1 x C: GAP, one Conv1D input channel
        k = self.key(y).view(b, self.num_heads, self.head_dim)  # B x H x d
        if self.query is None:
            return None, k, v
        q = self.query(y).view(b, self.num_heads, self.head_dim)  # B x H x d
        return q, k, v


class MRLALight(nn.Module):
    """One level of MRLA-light (MRLA eq. 8; per head eq. 9 right; Algorithm 4).

    ``O^t = lambda_o^t * O^{t-1} + sigmoid(Q^t_h . K^t_h / sqrt(d_k)) V^t_h`` for every head h.

    Args:
        dim: channels C.
        head_dim: channels per head d_k.
        recurrent: the level receives ``O^{t-1}`` (False at a stage's first level: no
            ``lambda_o``).
        kernel_size: Conv1D kernel of the query/key; ECA's adaptive size when None.
        norm_eps: epsilon of the input LayerNorm.
        input_norm: a LayerNorm on the input (see :class:`LayerProjections`).
        value_act: GELU after the value convolution (Algorithm 4; not in CNNs, Algorithm 3).
    """

    def __init__(
        self,
        dim: int,
        head_dim: int = 16,
        *,
        recurrent: bool = True,
        kernel_size: int | None = None,
        norm_eps: float = 1e-6,
        input_norm: bool = True,
        value_act: bool = True,
    ) -> None:
        super().__init__()
        self.proj = LayerProjections(
            dim,
            head_dim,
            value_act=value_act,
            kernel_size=kernel_size,
            norm_eps=norm_eps,
            input_norm=input_norm,
        )
        self.scale = head_dim**-0.5
        self.lambda_o = nn.Parameter(torch.ones(dim)) if recurrent else None

    def forward(
        self, x: Tensor, grid: tuple[int, int], state: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """Patch tokens B x N x C and ``O^{t-1}`` (B x N x C or None) -> ``O^t`` twice
        (the output and the state for the next level)."""
        q, k, v = self.proj(x, grid)
        weight = torch.sigmoid((q * k).sum(-1) * self.scale)  # B x H
        out = (v * weight[:, None, :, None]).flatten(2)  # B x N x C
        if state is not None:
            if self.lambda_o is None:
                raise ValueError("this MRLA level starts a stage; it takes no previous output")
            out = out + self.lambda_o * state
        return out, out


class MRLABase(nn.Module):
    """One level of MRLA-base (MRLA eq. 5-6; per head eq. 9 left; Algorithm 2).

    The level appends its key and value to those of the stage's earlier levels and its query
    attends to all of them: ``O^t_h = softmax_s(Q^t_h . K^s_h / sqrt(d_k)) V^s_h``, s <= t.
    Memory grows with the stage length (the reason for MRLA-light, App. B.2).

    Args:
        dim: channels C.
        head_dim: channels per head d_k.
        recurrent: the level receives the earlier keys/values (False at a stage's first
            level, whose softmax over one level is 1: no query convolution).
        kernel_size: Conv1D kernel of the query/key; ECA's adaptive size when None.
        norm_eps: epsilon of the input LayerNorm.
        input_norm: a LayerNorm on the input (see :class:`LayerProjections`).
        value_act: GELU after the value convolution (none in Algorithms 1 and 2).
    """

    def __init__(
        self,
        dim: int,
        head_dim: int = 16,
        *,
        recurrent: bool = True,
        kernel_size: int | None = None,
        norm_eps: float = 1e-6,
        input_norm: bool = True,
        value_act: bool = False,
    ) -> None:
        super().__init__()
        self.proj = LayerProjections(
            dim,
            head_dim,
            query=recurrent,
            value_act=value_act,
            kernel_size=kernel_size,
            norm_eps=norm_eps,
            input_norm=input_norm,
        )
        self.scale = head_dim**-0.5

    def forward(
        self,
        x: Tensor,
        grid: tuple[int, int],
        state: tuple[Tensor, Tensor] | None = None,
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """Patch tokens B x N x C and the stage's keys (B x L x H x d) and values
        (B x L x N x H x d) so far -> ``O^t`` (B x N x C) and the keys/values with level t's."""
        q, k, v = self.proj(x, grid)
        if q is None:
            if state is not None:
                raise ValueError("this MRLA level starts a stage; it takes no previous keys")
            # a stage's first level attends to itself alone: softmax weight 1
            return v.flatten(2), (k.unsqueeze(1), v.unsqueeze(1))
        if state is None:
            keys, values = k.unsqueeze(1), v.unsqueeze(1)
        else:
            keys = torch.cat([state[0], k.unsqueeze(1)], dim=1)  # B x L x H x d
            values = torch.cat([state[1], v.unsqueeze(1)], dim=1)  # B x L x N x H x d
        scores = torch.einsum("bhd,blhd->bhl", q, keys) * self.scale
        weights = scores.softmax(dim=-1)  # B x H x L
        out = torch.einsum("bhl,blnhd->bnhd", weights, values).flatten(2)  # B x N x C
        return out, (keys, values)


class LayerAttention(nn.Module):
    """MRLA after every level of a stack, reset at stage boundaries (MRLA sec. 4, App. B.1.1).

    Holds one MRLA module per level (never shared, even when the stack shares its blocks);
    :meth:`start` returns the :class:`~recurnmt.modules.hooks.LevelHook` of one forward pass,
    which a :class:`~recurnmt.modules.RecurrentStack` calls after each level
    (``stack(x, hooks=[layer_attention.start(grid)])``).

    Args:
        dim: channels C.
        num_levels: levels N of the stack.
        variant: ``light`` (eq. 8) or ``base`` (eq. 6).
        head_dim: channels per MRLA head d_k (16 for ViTs, sec. 5.1); must divide ``dim``.
        stages: the number of equal stages (must divide ``num_levels``) or the length of each
            stage (summing to ``num_levels``). The paper's DeiT: 3 stages of 4 levels.
        drop_path: stochastic depth rate of the MRLA branch, one per level or one for all
            (the stack's per-level rates, App. B.1.1).
        kernel_size: Conv1D kernel of the queries/keys; ECA's adaptive size when None.
        norm_eps: epsilon of the input LayerNorms.
        skip_last_level: no MRLA after the last level (its patch tokens are not read by a
            class-token classifier).
        input_norm: a LayerNorm on every level's input (transformers; see
            :class:`LayerProjections`).
        value_act: GELU after the value convolution; None: the variant's choice in vision
            transformers (light: GELU, Algorithm 4; base: none, Algorithm 2). CNNs have none
            (Algorithms 1 and 3).
        branch_norm: a batch norm on the MRLA branch before it joins the feature map (CNNs;
            the released ResNet code's ``bn_mrla``); the recurrent state stays unnormalised.
        branch_relu: a ReLU on the branch after that norm (the released MRLA-base ResNet
            code, ``resnet_mrla_base.py``: ``relu(bn_mrla(O^t))``; its MRLA-light has none).

    Raises:
        ValueError: an unknown ``variant``, a ``head_dim`` that does not divide ``dim``, or
            ``stages`` that do not partition the levels.
    """

    def __init__(
        self,
        dim: int,
        num_levels: int,
        *,
        variant: str = "light",
        head_dim: int = 16,
        stages: int | Sequence[int] = 3,
        drop_path: float | Sequence[float] = 0.0,
        kernel_size: int | None = None,
        norm_eps: float = 1e-6,
        skip_last_level: bool = False,
        input_norm: bool = True,
        value_act: bool | None = None,
        branch_norm: bool = False,
        branch_relu: bool = False,
    ) -> None:
        super().__init__()
        if variant not in MRLA_VARIANTS:
            raise ValueError(f"unknown MRLA variant={variant!r}; choose one of light, base")
        if not isinstance(head_dim, int) or head_dim <= 0 or dim % head_dim:
            raise ValueError(f"MRLA head_dim={head_dim!r} (d_k) must divide the width {dim}")
        self.variant = variant
        self.stage_lengths = stage_lengths(stages, num_levels)
        self.stage_of_level = tuple(
            s for s, length in enumerate(self.stage_lengths) for _ in range(length)
        )
        rates = [drop_path] * num_levels if isinstance(drop_path, float | int) else drop_path
        if len(rates) != num_levels or any(not 0.0 <= r < 1.0 for r in rates):
            raise ValueError(f"MRLA drop_path={drop_path} needs {num_levels} rates in [0, 1)")
        self.drop_path = tuple(float(r) for r in rates)
        level_cls = MRLALight if variant == "light" else MRLABase
        count = num_levels - int(skip_last_level)
        self.levels = nn.ModuleList(
            level_cls(
                dim,
                head_dim,
                recurrent=not self.starts_stage(i),
                kernel_size=kernel_size,
                norm_eps=norm_eps,
                input_norm=input_norm,
                value_act=variant == "light" if value_act is None else value_act,
            )
            for i in range(count)
        )
        self.branch_norms = (
            nn.ModuleList(nn.BatchNorm1d(dim) for _ in range(count)) if branch_norm else None
        )
        self.branch_act = nn.ReLU() if branch_relu else nn.Identity()

    def starts_stage(self, level: int) -> bool:
        return level == 0 or self.stage_of_level[level] != self.stage_of_level[level - 1]

    def step(
        self,
        level: int,
        x: Tensor,
        grid: tuple[int, int],
        state: LayerState,
        num_prefix_tokens: int = 1,
    ) -> tuple[Tensor, LayerState]:
        """MRLA of ``level`` on a stack's output x (B x T x C) -> the new tokens and state.

        ``state`` is the previous level's (None at a stage's start). The first
        ``num_prefix_tokens`` tokens (the class token) pass unchanged.
        """
        p = num_prefix_tokens
        out, state = self.levels[level](x[:, p:], grid, state)  # B x N x C
        if self.branch_norms is not None:  # over B and N per channel, as BatchNorm2d on maps
            out = self.branch_norms[level](out.transpose(1, 2)).transpose(1, 2)
        out = _drop_path(self.branch_act(out), self.drop_path[level], self.training)
        if p == 0:  # no copy: keeps the memory layout of x (a CNN's channels-first map)
            return x + out, state
        return torch.cat([x[:, :p], x[:, p:] + out], dim=1), state

    def start(self, grid: tuple[int, int], num_prefix_tokens: int = 1) -> LayerAttentionHook:
        """A fresh hook for one forward pass over tokens on the h x w ``grid``."""
        return LayerAttentionHook(self, grid, num_prefix_tokens)


class LayerAttentionHook(LevelHook):
    """MRLA in one forward pass: runs :meth:`LayerAttention.step` after every level.

    It keeps the recurrent state between levels and resets it when a level of another stage
    runs (also when a pass runs only some levels, e.g. a shallow branch).
    """

    def __init__(self, mrla: LayerAttention, grid: tuple[int, int], num_prefix_tokens: int) -> None:
        self.mrla, self.grid, self.prefix = mrla, grid, num_prefix_tokens
        self.stage: int | None = None
        self.state: LayerState = None

    def after_level(self, level: int, x: Tensor) -> Tensor:
        if level >= len(self.mrla.levels):  # the skipped last level
            return x
        if self.mrla.stage_of_level[level] != self.stage:
            self.stage, self.state = self.mrla.stage_of_level[level], None
        x, self.state = self.mrla.step(level, x, self.grid, self.state, self.prefix)
        return x


def stage_lengths(stages: int | Sequence[int], num_levels: int) -> tuple[int, ...]:
    """The length of every stage from a stage count or explicit lengths.

    Raises:
        ValueError: naming ``stages`` when they do not partition ``num_levels`` levels.
    """
    if isinstance(stages, int):
        if stages <= 0 or num_levels % stages:
            raise ValueError(
                f"MRLA stages={stages} must be a positive divisor of the {num_levels} levels "
                "(or give the length of every stage)"
            )
        return (num_levels // stages,) * stages
    lengths = tuple(stages)
    if any(not isinstance(n, int) or n <= 0 for n in lengths) or sum(lengths) != num_levels:
        raise ValueError(
            f"MRLA stages={lengths} must be positive stage lengths summing to {num_levels} levels"
        )
    return lengths
