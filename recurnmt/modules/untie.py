"""Untying a stack: every level its own copy of its block, computing the same function.

The untied copy is the reference against which weight sharing is checked (a shared stack must
compute what its untied copy computes), and a starting point for fine-tuning without sharing.
"""

from __future__ import annotations

import copy
from typing import TypeVar

from torch import nn

from recurnmt.modules.depth_plan import DepthPlan

Stack = TypeVar("Stack", bound=nn.Module)


def untie(stack: Stack) -> Stack:
    """A copy of a :class:`~recurnmt.modules.stack.RecurrentStack` in which every level has its
    own block, holding the same weights, and the same modes (checkpointing, depth, compilation).
    A module shared by several blocks (One Wide FFN) is copied into each."""
    n = stack.num_levels
    untied = type(stack)(
        [copy.deepcopy(stack.block_of_level(i)) for i in range(n)],
        copy.deepcopy(list(stack.levels)),
        DepthPlan.build(n),
        halting=copy.deepcopy(stack.halting),
        final_norm=copy.deepcopy(stack.final_norm),
    )
    untied.set_grad_checkpointing(
        stack.grad_checkpointing, stack.offload_activations, stack.checkpoint_segment
    )
    untied.run_levels = stack.run_levels
    untied.compile_settings = stack.compile_settings
    return untied
