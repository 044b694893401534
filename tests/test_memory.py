"""recurnmt.experiments.activation_memory: bytes saved for backward, the CPU benchmarks' memory figure."""

from __future__ import annotations

import torch

from recurnmt.experiments.activation_memory import saved_for_backward_bytes


def test_counts_each_saved_storage_once():
    torch.manual_seed(0)
    w = torch.randn(8, 16, requires_grad=True)
    x = torch.randn(4, 16, requires_grad=True)
    # x @ w.T saves x and w; a second product with the same operands saves nothing new
    out, saved = saved_for_backward_bytes(lambda: (x @ w.T).sum() + (x @ w.T).sum())
    assert saved == x.nbytes + w.nbytes
    out.backward()
    assert w.grad is not None


def test_recursion_saves_per_level_activations_but_shared_weights_once():
    torch.manual_seed(0)
    layer = torch.nn.Linear(32, 32)
    x = torch.randn(64, 32)

    def run(levels: int) -> int:
        def forward():
            h = x
            for _ in range(levels):
                h = torch.tanh(layer(h))
            return h.sum()

        return saved_for_backward_bytes(forward)[1]

    # from the second level on, each level adds its own activations and nothing for the weight
    per_level = run(3) - run(2)
    assert per_level > 0 and run(4) - run(3) == per_level
    assert per_level == 64 * 32 * 4  # one B x D float32 tensor: the tanh output
