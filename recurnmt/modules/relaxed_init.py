"""A relaxed recursive stack started from a trained stack of unshared layers.

Relaxed Recursive Transformers (Bae et al., ICLR 2025, arXiv 2410.20672) convert a trained
N-layer Transformer into M shared blocks looped over the same N levels (eq. 2), each level
relaxed by a LoRA of its own (eq. 3), then fine-tune. Two choices start the converted model:

**The shared blocks** ("initialization techniques for looped layers", Fig. 3; as the first
author's public code, ``model/sharing_strategy/llama.py`` of
``raymin0223/mixture_of_recursions``, ``selection_initialize`` / ``average_initialize``):

* ``stepwise``: block b starts as source layer ``round(linspace(0, N - 1, M)[b])``: layers
  at even intervals, the first and the last kept;
* ``average``: block b starts as the mean of the source layers at the levels that run it;
* ``lower``: block b starts as source layer b (the first M layers).

Level i runs block ``plan[i]`` (:class:`~recurnmt.modules.depth_plan.DepthPlan`; the paper's
looped tying is the ``cycle`` plan, level i -> block i mod M). N need not be a multiple of M:
``average`` then averages over however many levels run each block. Everything a block owns is
started this way: weights and biases of its linears, and its layer norms when the blocks own
them (the authors' code treats the norms alike).

**Each level's LoRA** (SVD initialisation): the truncated SVD, at the level's rank, of the
difference between the weight of the source layer at that level and its block's shared weight
(:meth:`~recurnmt.modules.level_lora.LowRankDelta.set_difference`). recurnmt also starts each
level's bias delta at the difference of the biases, and copies the source layer's norms into
the level's own (per-level norms): the authors' code starts per-level norms from the shared
layer's instead, which loses exactness; with both, a relaxed stack at the full rank computes
exactly the source's function (float rounding aside), and at rank 0 it is plain sharing of
the initialised blocks.

The source is a :class:`~recurnmt.modules.stack.RecurrentStack` whose levels own nothing but
(optionally) their norms: a vanilla stack, or a shared one (it is untied first).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from recurnmt.modules.depth_plan import DepthPlan
from recurnmt.modules.level_lora import LINEARS
from recurnmt.modules.stack import RecurrentStack

INITS = ("stepwise", "average", "lower")


def source_layers(plan: DepthPlan, num_layers: int, init: str) -> list[list[int]]:
    """The source layers each unique block of ``plan`` starts from (their mean).

    Args:
        plan: the relaxed stack's plan (``num_layers`` levels).
        num_layers: N, the source's layers.
        init: one of :data:`INITS`.

    Raises:
        ValueError: an unknown ``init``, or a plan of another depth.
    """
    if plan.num_levels != num_layers:
        raise ValueError(f"a plan of {plan.num_levels} levels for {num_layers} source layers")
    m = plan.num_unique
    if init == "stepwise":  # the authors' code: [round(i) for i in np.linspace(0, L - 1, K)]
        return [[round(float(i))] for i in np.linspace(0, num_layers - 1, m)]
    if init == "lower":
        return [[b] for b in range(m)]
    if init == "average":
        return [plan.levels_of_block(b) for b in range(m)]
    raise ValueError(f"init={init!r}; choose one of {', '.join(INITS)}")


def layer_state(stack: RecurrentStack, level: int) -> dict[str, Tensor]:
    """The weights of an untied stack's ``level`` under its block's names, its norms
    included (``norms.j.*``) wherever they live."""
    state = dict(stack.blocks[stack.plan.block_of_level[level]].state_dict())
    norms = stack.levels[level].norms
    if norms is not None:
        state |= {f"norms.{k}": v for k, v in norms.state_dict().items()}
    return state


def _untied_source(source: RecurrentStack) -> RecurrentStack:
    for i, parts in enumerate(source.levels):
        owned = [n for n, _ in parts.named_parameters() if not n.startswith("norms.")]
        if owned:
            raise ValueError(
                f"the source's level {i} owns {owned[0]} (level signals, NLLs or a LoRA): "
                "only stacks whose levels own at most their norms can be converted"
            )
    if source.halting is not None:
        raise ValueError("the source halts (ACT): its levels do not all run")
    if source.plan.block_of_level == tuple(range(source.num_levels)):
        return source
    return source.untied()


def _check_target(target: RecurrentStack) -> None:
    seen: set[int] = set()
    for block in target.blocks:
        params = {id(p) for p in block.parameters()}
        if params & seen:
            raise ValueError(
                "the relaxed stack's blocks share a module (One Wide FFN): each block must "
                "own its weights to start from its own source layers"
            )
        seen |= params
    if target.halting is not None:
        raise ValueError("a relaxed stack with ACT halting cannot start from a trained one")


@torch.no_grad()
def relax_stack(
    source: RecurrentStack, target: RecurrentStack, init: str = "stepwise"
) -> tuple[float, float]:
    """Starts ``target`` (M shared blocks, per-level LoRA) from the trained ``source``.

    See the module docstring for the initialisations. ``target``'s parts that the source
    cannot give (level signals, level embeddings) keep their own initialisation; learned
    level signals start at zero, so they do not change the function.

    Args:
        source: a trained stack of N levels whose levels own at most their norms.
        target: the relaxed stack, N levels, built with the source's widths and layout.
        init: how the shared blocks start, one of :data:`INITS`.

    Returns:
        The energy of the levels' differences from their blocks that the LoRAs keep, and the
        whole (sums of squared singular values over every level and linear; equal at the full
        rank, the first 0 without LoRAs).

    Raises:
        ValueError: the stacks do not fit each other, or an unknown ``init``.
    """
    source = _untied_source(source)
    _check_target(target)
    n = source.num_levels
    if target.num_levels != n:
        raise ValueError(f"the relaxed stack has {target.num_levels} levels, the source {n}")
    layers = [layer_state(source, i) for i in range(n)]
    for block, picks in zip(target.blocks, source_layers(target.plan, n, init), strict=True):
        own = block.state_dict()
        missing = sorted(set(own) - set(layers[0]))
        if missing:
            raise ValueError(f"the source's layers have no {missing[0]}")
        block.load_state_dict({k: torch.stack([layers[i][k] for i in picks]).mean(0) for k in own})
    kept = whole = 0.0
    for i, parts in enumerate(target.levels):
        shared = target.block_of_level(i).state_dict()
        if parts.norms is not None:
            parts.norms.load_state_dict(
                {
                    k.removeprefix("norms."): v
                    for k, v in layers[i].items()
                    if k.startswith("norms.")
                }
            )
        lora = parts.lora or {}
        for name, (linear, _groups) in LINEARS.items():
            if f"{linear}.weight" not in shared:
                continue
            weight = layers[i][f"{linear}.weight"] - shared[f"{linear}.weight"]
            if name not in lora:  # no LoRA (rank 0): the difference is lost
                whole += weight.double().square().sum().item()
                continue
            bias = None
            if f"{linear}.bias" in shared:
                bias = layers[i][f"{linear}.bias"] - shared[f"{linear}.bias"]
            energy = lora[name].set_difference(weight, bias)
            kept, whole = kept + energy[0], whole + energy[1]
    if (source.final_norm is None) != (target.final_norm is None):
        raise ValueError("one stack has a final norm (pre-LN) and the other not")
    if target.final_norm is not None:
        target.final_norm.load_state_dict(source.final_norm.state_dict())
    return kept, whole
