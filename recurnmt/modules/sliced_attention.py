"""Sliced group self-attention (SReT sec. 4, appendix C/D, Algorithm 1).

Global self-attention over T tokens is approximated, inside a recursive block, by attention
within G groups: the tokens are permuted, cut into G contiguous slices, each slice attends
to itself only, and the output is put back in the original order. Different loops of one
block can use different G, so that across loops every token still reaches every other
(SReT Theorem 1: with G groups the attention cost drops by a factor G).

Differences from the reference pseudo-code, each needed for text:

* The inverse permutation is applied after every permuted sliced attention, so the output is
  in the original token order and adds to the residual token by token. Algorithm 1 inverts
  only in the second loop; the released code permutes only in the second loop as well (the
  first loop uses contiguous slices), which is reproduced by ``attn_permute=(False, True)``.
* Any length works: T is padded to a multiple of G with masked slots.
* Padding masks are honoured: a padded key is never attended to, so padding content cannot
  leak into real tokens. A query whose whole slice is padding attends to itself only.
* Evaluation is deterministic: training draws a fresh random permutation at every call
  (as the paper does); evaluation uses a fixed permutation for each length.
* Causal (decoder) self-attention is refused by the configuration: a token's group would
  depend on future positions, so step-by-step decoding could not equal the full pass.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

_EVAL_SEED = 20210712
_eval_permutations: dict[tuple[int, str], Tensor] = {}


def group_permutation(length: int, training: bool, device: torch.device) -> Tensor:
    """The token permutation of one sliced attention call.

    Random in training; in evaluation a fixed permutation per length (and device), so that
    evaluating twice gives identical outputs.
    """
    if training:
        return torch.randperm(length, device=device)
    key = (length, str(device))
    perm = _eval_permutations.get(key)
    if perm is None:
        g = torch.Generator().manual_seed(_EVAL_SEED + length)
        perm = torch.randperm(length, generator=g).to(device)
        _eval_permutations[key] = perm
    return perm


def sliced_group_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    groups: int,
    perm: Tensor,
    key_padding_mask: Tensor | None = None,
    dropout_p: float = 0.0,
) -> Tensor:
    """Attention within ``groups`` slices of the permuted sequence.

    Args:
        q, k, v: B x H x T x D.
        groups: number of slices G (1 = ordinary attention, no permutation).
        perm: a permutation of range(T) (see :func:`group_permutation`).
        key_padding_mask: B x T, True at padding.
        dropout_p: attention dropout.

    Returns:
        B x H x T x D, in the original token order.
    """
    b, h, t, d = q.shape
    if groups == 1:
        mask = None if key_padding_mask is None else ~key_padding_mask[:, None, None, :]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
    size = math.ceil(t / groups)  # tokens per slice
    extra = size * groups - t

    def slice_up(x: Tensor) -> Tensor:
        x = x.index_select(2, perm)  # B x H x T x D, permuted
        if extra:
            x = F.pad(x, (0, 0, 0, extra))
        # B x H x (G * S) x D -> (B * G) x H x S x D
        return x.view(b, h, groups, size, d).transpose(1, 2).reshape(b * groups, h, size, d)

    valid = torch.ones(b, t, dtype=torch.bool, device=q.device)
    if key_padding_mask is not None:
        valid = ~key_padding_mask
    valid = F.pad(valid.index_select(1, perm), (0, extra), value=False)  # B x (G * S)
    mask = None
    if key_padding_mask is not None or extra:
        # a slot may always see itself, so no row is empty (padding-only slices)
        eye = torch.eye(size, dtype=torch.bool, device=q.device)
        mask = valid.view(b * groups, 1, 1, size) | eye
    out = F.scaled_dot_product_attention(
        slice_up(q), slice_up(k), slice_up(v), attn_mask=mask, dropout_p=dropout_p
    )
    # (B * G) x H x S x D -> B x H x (G * S) x D -> drop pad slots -> original order
    out = out.view(b, groups, h, size, d).transpose(1, 2).reshape(b, h, groups * size, d)
    out = out[:, :, :t]
    return out.index_select(2, torch.argsort(perm))


class SlicedGroups:
    """One level's sliced group setting: ``groups`` slices, permuted first or not.

    A level of a recursive block owns one (loop r of a block uses SReT's ``groups[r]``); it
    is handed to :class:`~recurnmt.modules.attention.SelfAttention` through the level's
    :class:`~recurnmt.modules.attention.AttentionTerms`. It holds no parameters.

    Args:
        groups: number of slices G (1 = global attention).
        permute: permute the tokens before slicing (else contiguous slices).
    """

    def __init__(self, groups: int, permute: bool = True) -> None:
        if not isinstance(groups, int) or groups <= 0:
            raise ValueError(f"groups={groups!r} must be a positive integer")
        self.groups, self.permute = groups, permute

    def __repr__(self) -> str:
        return f"SlicedGroups(groups={self.groups}, permute={self.permute})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SlicedGroups) and (self.groups, self.permute) == (
            other.groups,
            other.permute,
        )

    def __hash__(self) -> int:
        return hash((self.groups, self.permute))

    def __call__(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        key_padding_mask: Tensor | None,
        dropout_p: float,
        training: bool,
    ) -> Tensor:
        """Sliced attention of q, k, v (B x H x T x D) -> B x H x T x D, original order."""
        t = q.size(2)
        perm = (
            group_permutation(t, training, q.device)
            if self.permute
            else torch.arange(t, device=q.device)
        )
        return sliced_group_attention(q, k, v, self.groups, perm, key_padding_mask, dropout_p)
