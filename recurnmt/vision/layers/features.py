"""Intermediate features of a level stack in timm's terms (``forward_intermediates``).

timm's feature extraction (``features_only=True``, ``FeatureGetterNet``, ``out_indices``) asks
a model for the outputs of some of its layers. In a recurnmt stack the feature points are its
levels: one pass through a block, whether that block is unique (ViT) or shared by every level
(RingFormer, UiT): a shared stack's levels are stages of computation on one set of weights.
Index i is the i-th level the stack runs now (its elastic depth or shallow branch included).
"""

from __future__ import annotations

from collections.abc import Sequence

from timm.models._features import feature_take_indices  # as timm's own models import it
from torch import Tensor

from recurnmt.modules import LevelHook, RecurrentStack
from recurnmt.modules.hooks import LevelOutputs

FORMATS = ("NCHW", "NLC")


def tokens_to_map(x: Tensor, grid: tuple[int, int]) -> Tensor:
    """Patch tokens B x N x D (N = h w, row-major) -> B x D x h x w."""
    return x.transpose(1, 2).reshape(x.size(0), x.size(2), *grid)


def level_intermediates(
    stack: RecurrentStack,
    tokens: Tensor,
    grid: tuple[int, int],
    order: Sequence[int],
    hooks: Sequence[LevelHook],
    indices: int | Sequence[int] | None,
    num_prefix_tokens: int,
    return_prefix_tokens: bool,
    norm: bool,
    stop_early: bool,
    output_fmt: str,
    intermediates_only: bool,
) -> list | tuple[Tensor, list]:
    """Runs ``stack`` on ``tokens`` (levels ``order``, the model's own ``hooks`` first) and
    returns the outputs of the levels ``indices`` as timm's ``forward_intermediates`` does.

    Raises:
        ValueError: an ``output_fmt`` other than NCHW or NLC.
    """
    if output_fmt not in FORMATS:
        raise ValueError(f"output_fmt={output_fmt!r}; use one of {FORMATS}")
    take, last = feature_take_indices(len(order), indices)
    record = LevelOutputs()
    run = order[: last + 1] if stop_early or intermediates_only else order
    out = stack(tokens, levels=list(run), hooks=[*hooks, record])
    features = []
    for i in take:
        x = record.outputs[i]
        if norm and stack.final_norm is not None:
            x = stack.final_norm(x)
        prefix, x = x[:, :num_prefix_tokens], x[:, num_prefix_tokens:]
        if output_fmt == "NCHW":
            x = tokens_to_map(x, grid)
        features.append((x, prefix) if return_prefix_tokens and num_prefix_tokens else x)
    if intermediates_only:
        return features
    return out.output, features


__all__ = ["FORMATS", "feature_take_indices", "level_intermediates", "tokens_to_map"]
