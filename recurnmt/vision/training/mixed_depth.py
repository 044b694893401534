"""Mixed-depth training (SReT appendix B, Fig. 8 (d); SReT sec. 5.7).

A recursive network holds two networks with the same weights: the deep one, in which every
block runs all its loops, and the shallow one, in which every block runs once. Both take the
same stem output, one classifier sits on top of both, and the training loss is the sum of the
two branches' losses, an explicit deep supervision of the shared weights. Evaluation uses the
deep branch only.

:class:`MixedDepth` wraps a model, runs it twice in training, the second time in its stacks'
shallow-branch mode (:func:`~recurnmt.modules.shallow_branch`), and returns both branches'
logits from one ``forward`` call, so that DistributedDataParallel sees one forward per
backward.
"""

from __future__ import annotations

from torch import Tensor, nn

from recurnmt.modules import shallow_branch


class MixedDepth(nn.Module):
    """Returns ``(deep_logits, shallow_logits)`` in training, the deep logits in evaluation.

    Args:
        module: a model of recurnmt's stacks (every model of :mod:`recurnmt.vision` but DVT's
            cascades, which refuse the mode).
    """

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, x: Tensor) -> Tensor | tuple[Tensor, Tensor]:
        if not self.training:
            return self.module(x)
        deep = self.module(x)
        with shallow_branch(self.module):
            return deep, self.module(x)
