"""What a decoding session derives from the weights, kept exactly as long as the session.

A beam-search step on a GPU is bound by the host's dispatch of small operations (docs/gpu.md),
so incremental decoding runs some levels with tensors derived from the parameters, made once
instead of at every step and level:

* a RingFormer level's low-rank signals (RingFormer eq. 5-7) and a relaxed level's LoRA and
  bias deltas (Relaxed Recursive Transformers eq. 3) folded into its block's projections
  (:meth:`~recurnmt.modules.level_parts.LevelParts.fold_linears`): the level then runs the
  operations of a plain layer;
* ACT's halting unit in float32 for a half-precision model
  (:meth:`~recurnmt.modules.halting.HaltingUnit.float_params`).

They are made at the session's first step, from the weights as they are then, and held by the
session's :class:`~recurnmt.modules.decoding.cache.StackCache`, which beam search reorders and which is
dropped with the batch it decodes. A derived tensor therefore lives exactly as long as the keys
and values computed from the same weights, and no way of changing weights can meet one made
before the change: an optimizer step (fairseq's, torch's fused ones), a write through ``.data``,
``vector_to_parameters``, ``load_state_dict``, a dtype or device move, an EMA, quantisation.
Nothing derived is kept on a module. (Until 2026-11 the folds were kept on the modules, keyed by
storage address and version counter: writes through ``.data`` and fused optimizers bump no
version, and the models decoded with stale weights without a word; ``tests/test_derived_state.py``
holds every such path.)

Only inference starts a session (evaluation mode, no gradients); a cached pass in training runs
its levels as training does. Every pass without a cache (training, validation, scoring, an
image model's evaluation) derives nothing: its levels compute their terms in rank space, where
a forward hook on a shared projection fires as in training. Within a session a projection with
a forward hook, or one that is not a plain ``nn.Linear`` (dynamic int8 quantisation replaces
them), is left unfolded for the same reason. The cost: one fold per folded linear and level at a
session's first step (a few d x d x r products, measured in docs/benchmarks.md).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from recurnmt.modules.attention import AttentionTerms
from recurnmt.modules.level_parts import LevelParts


class SessionLevel:
    """Level ``parts.index`` as one decoding session runs it: its parts with the block's
    linears replaced by :meth:`LevelParts.fold_linears` (the level protocol's view of a
    level: what :class:`~recurnmt.modules.block.TransformerBlock` reads of its parts)."""

    def __init__(self, parts: LevelParts, folded: dict[str, tuple[Tensor, Tensor | None]]) -> None:
        self.parts, self.folded = parts, folded
        self.index, self.norms, self.drop_path = parts.index, parts.norms, parts.drop_path
        self.slicing = parts.slicing
        self.enter, self.leave = parts.enter, parts.leave

    def attention_terms(self, h: Tensor) -> AttentionTerms | None:
        return self.parts.attention_terms(h, self.folded)

    def cross_attention_terms(self, h: Tensor) -> AttentionTerms | None:
        return self.parts.cross_attention_terms(h, self.folded)

    def ffn_deltas(self, h: Tensor) -> dict[str, object]:
        return self.parts.ffn_deltas(h, self.folded)


class DecodingSession:
    """Everything one decoding session of a stack derives from its weights.

    Attributes:
        levels: ``levels[i]`` runs level i: a :class:`SessionLevel` where the level folds
            something, else the level's own parts.
        halting: the halting unit's weight and bias in float32 (None without ACT).
    """

    def __init__(self, levels: Sequence[LevelParts], blocks: Sequence[nn.Module], halting=None):
        with torch.no_grad():
            self.levels: list[LevelParts | SessionLevel] = []
            for parts, block in zip(levels, blocks, strict=True):
                folded = parts.fold_linears(block)
                self.levels.append(SessionLevel(parts, folded) if folded else parts)
            self.halting = None if halting is None else halting.float_params()

    @classmethod
    def of(cls, stack: nn.Module, cache) -> DecodingSession | None:
        """The session of ``stack``'s decoding ``cache`` (a
        :class:`~recurnmt.modules.decoding.cache.StackCache`): made at its first step in inference, from
        the weights as they are then, or anew when the stack's depth changed; None in a pass
        with gradients or in training, which derives nothing."""
        if stack.training or torch.is_grad_enabled():
            return None
        session = cache.session
        if session is None or len(session.levels) != len(stack.levels):
            blocks = [stack.block_of_level(i) for i in range(len(stack.levels))]
            session = cache.session = cls(stack.levels, blocks, stack.halting)
        return session
