"""Activation checkpointing of a level loop: per level, and per segment of levels.

The memory policy of :class:`~recurnmt.modules.stack.RecurrentStack`
(:meth:`~recurnmt.modules.stack.RecurrentStack.set_grad_checkpointing`, fairseq's
``--checkpoint-activations`` and ``--offload-activations``):

* per level (:func:`checkpointed_block`): in training, each level keeps only its input and
  recomputes its block in the backward pass, so activation memory holds one level's
  intermediates instead of every level's; offloading also moves the kept inputs to CPU
  memory. Losses and gradients are those of the plain pass (dropout's random state is
  replayed).
* per segment of k levels (:func:`checkpointed_segment`; Chen et al. 2016, "Training deep nets
  with sublinear memory cost", sec. 4): per-level inputs still grow linearly with depth, so a
  second checkpoint around every k levels keeps only every k-th level input; the backward pass
  of a segment recomputes its k level inputs, then each level as before. Memory holds about
  N / k + k level inputs and one level's intermediates (O(sqrt N) at k = sqrt N), for one more
  forward pass of every level. It applies where levels carry no state from one to the next
  besides x (no ACT halting; only hooks marked ``recomputable``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from recurnmt.modules.attention import MemoryKV
from recurnmt.modules.errors import ConfigError
from recurnmt.modules.hooks import LevelHook


def check_segment(segment: int | str) -> None:
    """Raises :class:`ConfigError` unless ``segment`` is a number of levels >= 0 or ``sqrt``."""
    if segment != "sqrt" and not (isinstance(segment, int) and segment >= 0):
        raise ConfigError(
            "checkpoint_segment", segment, "must be a number of levels >= 0 or 'sqrt'"
        )


def segment_length(
    segment: int | str, levels: int, x: Tensor, training: bool, hooks: Sequence[LevelHook]
) -> int:
    """Levels per segment (``segment``: k or ``"sqrt"``) of a training pass of ``levels``
    levels on ``x`` with ``hooks``; 0 (per-level checkpoints only) outside training and where
    a hook cannot run twice."""
    if not segment or not (training and torch.is_grad_enabled() and x.requires_grad):
        return 0
    if not all(hook.recomputable for hook in hooks):
        return 0
    k = math.ceil(math.sqrt(levels)) if segment == "sqrt" else segment
    return k if 1 < k < levels else 0


def checkpointed_block(
    block: nn.Module, x: Tensor, parts: nn.Module, offload: bool, **kwargs
) -> Tensor:
    """``block(x, parts, **kwargs)`` under a per-level checkpoint.

    Raises:
        ValueError: in incremental decoding (a cache), which checkpointing is not for.
    """
    if kwargs.get("cache") is not None:
        raise ValueError("activation checkpointing is for training, not incremental decoding")
    if not offload:
        return checkpoint(block, x, parts, use_reentrant=False, **kwargs)
    with torch.autograd.graph.save_on_cpu(pin_memory=x.is_cuda):
        return checkpoint(block, x, parts, use_reentrant=False, **kwargs)


def checkpointed_segment(
    level: Callable[[int, Tensor, dict[int, MemoryKV]], Tensor],
    x: Tensor,
    levels: Sequence[int],
    kv: dict[int, MemoryKV],
) -> Tensor:
    """Runs ``level(i, x, kv)`` for ``levels`` in order, keeping only ``x`` for backward,
    which recomputes them level by level under their own checkpoints.

    The segment is a reentrant checkpoint: its forward runs without autograd, so the
    per-level checkpoints inside it keep nothing, and its backward pass reruns it with
    autograd, where they keep one input per level of this segment only (a non-reentrant
    segment would keep every inner level's input alive from the first forward). A reentrant
    checkpoint differentiates only into its tensor arguments, so the memory's keys and values
    are passed as arguments, each distinct tensor once (levels of one block share their
    block's keys and values).
    """
    index: dict[int, int] = {}
    memory: list[Tensor] = []
    for t in (t for i in levels if i in kv for t in (kv[i].k, kv[i].v)):
        if id(t) not in index:
            index[id(t)] = len(memory)
            memory.append(t)

    def run(x: Tensor, *inputs: Tensor) -> Tensor:
        kv_in = {
            i: kv[i]._replace(k=inputs[index[id(kv[i].k)]], v=inputs[index[id(kv[i].v)]])
            for i in levels
            if i in kv
        }
        for i in levels:
            x = level(i, x, kv_in)
        return x

    return checkpoint(run, x, *memory, use_reentrant=True, preserve_rng_state=True)
