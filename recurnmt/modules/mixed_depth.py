"""SReT's shallow branch as a mode of a model's stacks (SReT appendix B, mixed depth).

A recursive network holds two networks with the same weights: the deep one, in which every
block runs all its loops, and the shallow one, in which every block runs once. Mixed-depth
training adds the shallow branch's loss to the deep one's. The branch is a mode of the stacks,
as their depth is (:meth:`~recurnmt.modules.stack.RecurrentStack.set_shallow`): no forward
takes an argument for it. :func:`shallow_branch` switches every stack of a model for the
passes inside it; the front ends use it (the translation criterion, the image trainer's
:class:`~recurnmt.vision.training.mixed_depth.MixedDepth`).

A model whose modules cannot run a shallow branch (a DVT cascade, which trains every exit
instead) says why in a ``no_shallow_branch`` attribute; entering the mode then raises.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn

from recurnmt.modules.stack import RecurrentStack


@contextmanager
def first_levels(stack: RecurrentStack, levels: int) -> Iterator[RecurrentStack]:
    """Within the ``with`` block ``stack`` runs its first ``levels`` active levels only (the
    draft of self-speculative decoding, :mod:`recurnmt.modules.decoding.speculative`: mixed-depth
    training at a draft depth); afterwards as before."""
    before = stack.shallow_levels
    stack.shallow_levels = list(stack.active_levels)[:levels]
    try:
        yield stack
    finally:
        stack.shallow_levels = before


@contextmanager
def shallow_branch(model: nn.Module) -> Iterator[nn.Module]:
    """Within the ``with`` block every :class:`RecurrentStack` of ``model`` runs each of its
    blocks once (its first-loop levels); afterwards each runs as before.

    Raises:
        ValueError: a module of ``model`` has no shallow branch (its ``no_shallow_branch``).
    """
    modules = list(model.modules())
    for module in modules:
        reason = getattr(module, "no_shallow_branch", None)
        if reason:
            raise ValueError(reason)
    stacks = [m for m in modules if isinstance(m, RecurrentStack)]
    before = [stack.shallow_levels for stack in stacks]
    for stack in stacks:
        stack.set_shallow(True)
    try:
        yield model
    finally:
        for stack, levels in zip(stacks, before, strict=True):
            stack.shallow_levels = levels
