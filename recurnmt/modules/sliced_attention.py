"""Sliced group self-attention (SReT sec. 4, appendix C/D, Algorithm 1).

Global self-attention over T tokens is approximated, inside a recursive block, by attention
within G groups: the tokens are cut into G slices, each slice attends to itself only, and the
output is put back in the original order. Different loops of one block can use different G, so
that across loops every token still reaches every other (SReT Theorem 1: with G groups the
attention cost drops by a factor G).

Which loops permute follows Algorithm 1 (appendix D) by default: the first loop of a block
(``recursion == False``) slices the tokens contiguously, without permutation; every later
loop permutes them at random before slicing and applies the inverse permutation after
(appendix C, "P+I"). ``StackConfig.attn_permute`` chooses otherwise per loop.

Differences from the reference pseudo-code, each needed for text or for evaluation:

* Any length works: T is padded to a multiple of G with masked slots.
* Padding masks are honoured: a padded key is never attended to, so padding content cannot
  leak into real tokens. The mask is a key mask (one row per slice), the form the fused SDPA
  kernels accept; a slice of padding only sees its own padding slots, which no one reads.
* Evaluation is reproducible without reusing one permutation everywhere: training draws a
  fresh random permutation at every call (as Algorithm 1's ``torch.randperm``); evaluation
  draws from a generator seeded by the level's ``seed`` (its index in the stack) and the
  length, so evaluating twice gives identical outputs while the levels of a stack still slice
  along unrelated partitions, as in training. (One permutation per length for every level
  would nest a loop's 8-group partition inside the next loop's 2-group one.)
* Causal (decoder) self-attention is refused by the configuration: a token's group would
  depend on future positions, so step-by-step decoding could not equal the full pass.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from recurnmt.modules import sdpa
from recurnmt.modules.tracing import traceable

_EVAL_SEED = 20210712
# (seed, length, device) -> the evaluation permutation; small: levels x lengths seen
_eval_permutations: dict[tuple[int, int, str], Tensor] = {}


@torch.jit.ignore  # a Python call in TorchScript: the permutations are cached here
@traceable
def group_permutation(length: int, training: bool, device: torch.device, seed: int = 0) -> Tensor:
    """The token permutation of one sliced attention call.

    Args:
        length: number of tokens T.
        training: draw a fresh random permutation (SReT Algorithm 1); otherwise the fixed
            evaluation permutation of ``seed`` and ``length``.
        device: where the permutation is needed.
        seed: which evaluation permutation (one per level, so that levels differ).

    Returns:
        A permutation of range(T), a long tensor on ``device``.
    """
    if training:
        return torch.randperm(length, device=device)
    key = (seed, length, str(device))
    perm = _eval_permutations.get(key)
    if perm is None:
        # a CPU generator, so the permutation is the same on every device and machine
        g = torch.Generator().manual_seed(_EVAL_SEED + 1_000_003 * seed + length)
        with torch.inference_mode(False):  # cached: a normal tensor, whatever mode made it
            perm = torch.randperm(length, generator=g).to(device)
        _eval_permutations[key] = perm
    return perm


# one call in a torch.fx graph: the evaluation permutation is looked up by the token count
torch.fx.wrap("group_permutation")


def sliced_group_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    groups: int,
    perm: Tensor | None,
    key_padding_mask: Tensor | None = None,
    dropout_p: float = 0.0,
) -> Tensor:
    """Attention within ``groups`` slices of the (permuted) sequence.

    Args:
        q, k, v: B x H x T x D.
        groups: number of slices G (1 = ordinary attention, no permutation).
        perm: a permutation of range(T) (see :func:`group_permutation`); None slices the
            tokens in their own order (contiguous runs, Algorithm 1's first loop).
        key_padding_mask: B x T, True at padding.
        dropout_p: attention dropout.

    Returns:
        B x H x T x D, in the original token order.
    """
    b, h, t, d = q.shape
    if groups == 1:
        mask = None if key_padding_mask is None else ~key_padding_mask[:, None, None, :]
        return sdpa.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
    size = math.ceil(t / groups)  # tokens per slice
    extra = size * groups - t

    valid = torch.ones(b, t, dtype=torch.bool, device=q.device)
    if key_padding_mask is not None:
        valid = ~key_padding_mask
    if perm is not None:
        valid = valid.index_select(1, perm)
    valid = F.pad(valid, (0, extra), value=False)  # B x (G * S)
    mask: Tensor | None = None
    if key_padding_mask is not None or extra:
        # A key mask, (B * G) x 1 x 1 x S, which the fused SDPA kernels take as it is. A slice
        # with no real key (padding only) may see all of its slots, so that no row is empty
        # (an empty row is NaN); its rows are padding and are never read.
        valid = valid.view(b * groups, size)
        valid = valid | ~valid.any(dim=1, keepdim=True)
        mask = valid[:, None, None, :]
    q, k, v = (
        _slices(q, perm, groups, extra),
        _slices(k, perm, groups, extra),
        _slices(v, perm, groups, extra),
    )
    out = sdpa.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
    # (B * G) x H x S x D -> B x H x (G * S) x D -> drop pad slots -> original order
    out = out.view(b, groups, h, size, d).transpose(1, 2).reshape(b, h, groups * size, d)
    out = out[:, :, :t]
    return out if perm is None else out.index_select(2, torch.argsort(perm))


def _slices(x: Tensor, perm: Tensor | None, groups: int, extra: int) -> Tensor:
    """B x H x T x D -> (B * G) x H x S x D: permuted (``perm``), padded by ``extra`` slots,
    cut into ``groups`` slices of S tokens."""
    b, h, _, d = x.shape
    if perm is not None:
        x = x.index_select(2, perm)  # B x H x T x D, permuted
    if extra:
        x = F.pad(x, (0, 0, 0, extra))
    size = x.shape[2] // groups
    return x.view(b, h, groups, size, d).transpose(1, 2).reshape(b * groups, h, size, d)


# one call in a torch.fx graph (timm's feature extraction, torchvision's fx tools): the token
# slicing reads sizes as numbers
torch.fx.wrap("sliced_group_attention")


class SlicedGroups:
    """One level's sliced group setting: ``groups`` slices, permuted first or not.

    A level of a recursive block owns one (loop r of a block uses SReT's ``groups[r]``); it
    is handed to :class:`~recurnmt.modules.attention.SelfAttention` through the level's
    :class:`~recurnmt.modules.attention.AttentionTerms`. It holds no parameters.

    Args:
        groups: number of slices G (1 = global attention).
        permute: permute the tokens before slicing and invert after (a later loop of
            Algorithm 1), else contiguous slices (its first loop).
        seed: chooses the evaluation permutation (the builders pass the level index, so that
            no two levels of a stack share one).
    """

    def __init__(self, groups: int, permute: bool = True, seed: int = 0) -> None:
        if not isinstance(groups, int) or groups <= 0:
            raise ValueError(f"groups={groups!r} must be a positive integer")
        if not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed={seed!r} must be a non-negative integer")
        self.groups, self.permute, self.seed = groups, permute, seed

    def _key(self) -> tuple[int, bool, int]:
        return self.groups, self.permute, self.seed

    def __repr__(self) -> str:
        return f"SlicedGroups(groups={self.groups}, permute={self.permute}, seed={self.seed})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SlicedGroups) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def permutation(self, length: int, training: bool, device: torch.device) -> Tensor | None:
        """The permutation of one call over ``length`` tokens; None for contiguous slices."""
        return group_permutation(length, training, device, self.seed) if self.permute else None

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
        perm = self.permutation(q.size(2), training, q.device)
        return sliced_group_attention(q, k, v, self.groups, perm, key_padding_mask, dropout_p)
