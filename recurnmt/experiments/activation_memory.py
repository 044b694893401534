"""Training memory that a CPU can measure: the activations a forward pass saves for backward.

CUDA keeps a peak (``torch.cuda.max_memory_allocated``); the CPU allocator does not, and the
process's peak resident set mixes in the allocator's caching and everything that ran before.
What weight sharing, recursion and level signals change is the set of tensors autograd keeps
for the backward pass, so the benchmarks report that on CPU: the bytes of the distinct
storages saved during one forward, counted with ``torch.autograd.graph.saved_tensors_hooks``.
Parameters saved for backward count too (shared ones once), as on a GPU they occupy memory.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


def saved_for_backward_bytes(forward: Callable[[], Tensor]) -> tuple[Tensor, int]:
    """Runs ``forward()`` and counts the bytes of the distinct storages it saves for backward.

    Args:
        forward: computes and returns a loss (or any tensor that requires grad).

    Returns:
        (the tensor ``forward`` returned, bytes saved for its backward pass).
    """
    storages: dict[tuple[torch.device, int], int] = {}

    def pack(t: Tensor) -> Tensor:
        storage = t.untyped_storage()
        storages[(t.device, storage.data_ptr())] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = forward()
    return out, sum(storages.values())
