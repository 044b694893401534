"""Level hooks: how a front end or a paper extends one forward pass of a stack.

A :class:`~recurnmt.modules.stack.RecurrentStack` runs its levels; everything that is not
the level loop itself plugs in as a hook passed to that call (``stack(x, hooks=[...])``),
so extensions never widen the shared signatures. A hook is asked at fixed points of every
level, and each method's default does nothing:

==================  ===================================================================
``before_level``    rewrite the level's input (UT: positions at every level)
``attention``       :class:`~recurnmt.modules.attention.AttentionTerms` for the level's
                    self-attention: logit bias, logit probes (DVT relationship reuse)
``cross_attention`` terms for the level's cross-attention (fairseq's alignment output)
``ffn_input``       replace the pre-FFN normalisation and add to the FFN's hidden
                    pre-activation (DVT feature reuse, eq. 5)
``after_level``     rewrite the level's output (MRLA layer attention; recording states)
==================  ===================================================================

Hooks hold per-call state (the level outputs recorded so far, the upstream features of a
cascade); their parameters, if any, live in modules owned by the front end that creates them.
This file has the generic hooks; paper-specific ones live with their front end
(:mod:`recurnmt.vision.layers.layer_attention`, :mod:`recurnmt.vision.layers.reuse`).
"""

from __future__ import annotations

from torch import Tensor, nn

from recurnmt.modules.attention import AttentionTerms
from recurnmt.modules.config import CoordinateConfig


class LevelHook:
    """Extends every level of one stack call; subclasses override what they need.

    Attributes:
        needs_all_levels: the hook must see every level run, so ACT halting may not stop the
            pass early (True unless a subclass says otherwise).
        recomputable: a checkpoint segment of several levels may run the hook again: its
            calls have no side effects, carry no state from level to level, and use no
            tensor that needs a gradient (False unless a subclass says otherwise).
    """

    needs_all_levels = True
    recomputable = False

    def before_level(self, level: int, x: Tensor) -> Tensor:
        """The input of ``level`` (B x T x C), before its block."""
        return x

    def attention(self, level: int, h: Tensor) -> AttentionTerms | None:
        """Terms for ``level``'s self-attention, given its (normalised) input h."""
        return None

    def cross_attention(self, level: int) -> AttentionTerms | None:
        """Terms for ``level``'s cross-attention."""
        return None

    def ffn_input(self, level: int, x: Tensor, norm: nn.Module) -> tuple[Tensor, Tensor] | None:
        """Replaces ``norm(x)`` before a pre-LN FFN: returns the FFN input (B x T x C) and a
        term added to its hidden pre-activation (B x T x FF); None keeps ``norm(x)``."""
        return None

    def after_level(self, level: int, x: Tensor) -> Tensor:
        """The output of ``level`` (B x T x C), after its block and per-level parts."""
        return x


class AddAtEveryLevel(LevelHook):
    """Adds one tensor to the input of every level: the Universal Transformer's position
    embedding, which joins the level embedding at every step (UT sec. 2.1).

    Args:
        term: broadcastable to B x T x C (positions, B x T x C).
    """

    needs_all_levels = False

    def __init__(self, term: Tensor) -> None:
        self.term = term
        # fixed sinusoids; learned ones need grads (and a term torch.fx traces is no tensor)
        self.recomputable = isinstance(term, Tensor) and not term.requires_grad

    def before_level(self, level: int, x: Tensor) -> Tensor:
        return x + self.term

    def rows(self, rows: Tensor) -> AddAtEveryLevel:
        """The hook of the batch rows ``rows`` (rows that run on after others exited,
        :mod:`recurnmt.modules.decoding.exits`)."""
        if not isinstance(self.term, Tensor) or self.term.dim() < 3 or self.term.size(0) == 1:
            return self
        return AddAtEveryLevel(self.term.index_select(0, rows))


def positions_hooks(coordinates: CoordinateConfig, positions: Tensor | None) -> list[LevelHook]:
    """The Universal Transformer's rule for positions (UT sec. 2.1), for every front end: with
    ``coordinates.positions_every_level`` the positions join the level embedding at every
    level, scaled as it is (``coordinates.scale``); otherwise the front end added them to its
    input once, and there is no hook.

    Args:
        coordinates: the stack's coordinate settings.
        positions: the front end's position embeddings, broadcastable to B x T x C.
    """
    if not coordinates.positions_every_level or positions is None:
        return []
    scale = coordinates.scale
    return [AddAtEveryLevel(positions if scale == 1 else scale * positions)]


class LevelOutputs(LevelHook):
    """Records the output of every level that runs (``outputs[k]``: the k-th level run)."""

    needs_all_levels = False

    def __init__(self) -> None:
        self.outputs: list[Tensor] = []

    def after_level(self, level: int, x: Tensor) -> Tensor:
        self.outputs.append(x)
        return x


class CrossAttentionWeights(LevelHook):
    """Keeps the cross-attention probabilities of one level, averaged over heads.

    fairseq's ``--print-alignment`` and scorers read them from the decoder's output as
    ``extra["attn"]`` (B x T x S).

    Args:
        level: the level to read (the last one, as fairseq's transformer does).
    """

    def __init__(self, level: int) -> None:
        self.level = level
        self.weights: Tensor | None = None

    def _keep(self, logits: Tensor) -> None:
        self.weights = logits.softmax(-1).mean(dim=1)  # B x H x T x S -> B x T x S

    def cross_attention(self, level: int) -> AttentionTerms | None:
        return AttentionTerms(probes=(self._keep,)) if level == self.level else None


class AttentionWeights(LevelHook):
    """Keeps every level's self- and cross-attention probabilities, B x H x T x S each
    (``self_weights[k]``, ``cross_weights[k]``: the k-th level run; float32 for half-precision
    inputs, as :func:`~recurnmt.modules.attention.attention_logits` computes them).

    Its probes make every attention call of the pass compute its logits explicitly instead of
    through SDPA's fused kernels, so a pass pays for them only when they are asked for.

    Args:
        cross: keep the cross-attention probabilities too (decoders).
    """

    needs_all_levels = False

    def __init__(self, cross: bool = False) -> None:
        self.cross = cross
        self.self_weights: list[Tensor] = []
        self.cross_weights: list[Tensor] = []

    def _keep_self(self, logits: Tensor) -> None:
        self.self_weights.append(logits.softmax(-1))  # B x H x T x S

    def _keep_cross(self, logits: Tensor) -> None:
        self.cross_weights.append(logits.softmax(-1))  # B x H x T x S

    def attention(self, level: int, h: Tensor) -> AttentionTerms | None:
        return AttentionTerms(probes=(self._keep_self,))

    def cross_attention(self, level: int) -> AttentionTerms | None:
        return AttentionTerms(probes=(self._keep_cross,)) if self.cross else None
