"""A Transformer block whose weights may serve many levels.

The block receives its sub-modules built (timm's and torchtune's injectable layers): a
self-attention, an optional cross-attention, an optional FFN (One Wide FFN passes one FFN
object to every block of a stack), its layer norms unless the levels own them, and SReT's
learnable residual coefficients (eq. 9). The level it runs at is described by the
:class:`~recurnmt.modules.level_parts.LevelParts` handed in at call time, and extensions
reach it through :class:`~recurnmt.modules.hooks.LevelHook` objects.

The level protocol: any module called as ``block(x, parts, padding_mask=..., memory=...,
cache=..., hooks=...)`` can be stacked by :class:`~recurnmt.modules.stack.RecurrentStack`;
a block with cross-attention also has ``project_memory``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from torch import Tensor, nn

from recurnmt.modules.attention import (
    CrossAttention,
    KVCache,
    MemoryKV,
    SelfAttention,
    combine_terms,
)
from recurnmt.modules.drop_path import drop_path
from recurnmt.modules.dropout import Dropout
from recurnmt.modules.feedforward import FeedForward
from recurnmt.modules.hooks import LevelHook
from recurnmt.modules.level_parts import LevelParts
from recurnmt.modules.residual import ResidualCoefficients


class TransformerBlock(nn.Module):
    """Self-attention, optional cross-attention and FFN, each in a residual sub-layer.

    Post-LN: ``x = LN(skip * x + main * Dropout(f(x)))``; pre-LN:
    ``x = skip * x + main * Dropout(f(LN(x)))``, where skip = main = 1 unless learnable
    residual coefficients are given (SReT eq. 9).

    Args:
        self_attn: the self-attention (causal in decoders).
        ffn: the FFN, possibly shared with other blocks; None for a block without FFN (the
            One Wide FFN decoder).
        cross_attn: attention onto an encoder memory (decoders).
        norms: one layer norm per sub-layer; None when every level brings its own.
        lrc: learnable residual coefficients of the sub-layers; None for plain residuals.
        dropout: dropout on every residual branch.
        normalize_before: pre-LN (True) or post-LN (False).
    """

    def __init__(
        self,
        self_attn: SelfAttention,
        ffn: FeedForward | None,
        *,
        cross_attn: CrossAttention | None = None,
        norms: nn.ModuleList | None = None,
        lrc: ResidualCoefficients | None = None,
        dropout: float = 0.0,
        normalize_before: bool = False,
    ) -> None:
        super().__init__()
        self.self_attn = self_attn
        self.cross_attn = cross_attn
        self.ffn = ffn
        self.norms = norms
        self.lrc = lrc if lrc is not None else ResidualCoefficients(self.num_sublayers, "none")
        self.dropout = Dropout(dropout)
        self.normalize_before = normalize_before
        if norms is not None and len(norms) != self.num_sublayers:
            raise ValueError(f"{len(norms)} norms for {self.num_sublayers} sub-layers")

    @property
    def num_sublayers(self) -> int:
        """Residual sub-layers: self-attention, cross-attention?, FFN?."""
        return 1 + int(self.cross_attn is not None) + int(self.ffn is not None)

    def project_memory(
        self, memory: Tensor, padding_mask: Tensor | None = None, group: int = 1
    ) -> MemoryKV:
        """Keys and values of the encoder memory for this block's cross-attention (``group``:
        query rows per memory row, see :class:`~recurnmt.modules.attention.MemoryKV`)."""
        if self.cross_attn is None:
            raise ValueError("this block has no cross-attention")
        return self.cross_attn.project_memory(memory, padding_mask, group)

    def keys_values(self, x: Tensor, parts: LevelParts, hooks: Sequence[LevelHook] = ()) -> Tensor:
        """The self-attention keys and values this block writes to a cache for the input ``x``
        (B x T x C) at the level ``parts`` describes, 2 x B x H x T x D, and nothing else of
        the block (state propagation, :mod:`recurnmt.modules.decoding.exits`)."""
        norms = parts.norms if parts.norms is not None else self.norms
        h = norms[0](x) if self.normalize_before else x
        terms = combine_terms(
            parts.attention_terms(h), *(hook.attention(parts.index, h) for hook in hooks)
        )
        return self.self_attn.keys_values(h, terms)

    def _sublayer(
        self,
        x: Tensor,
        index: int,
        norm: nn.Module,
        fn: Callable[[Tensor], Tensor],
        rate: float,
    ) -> Tensor:
        if self.normalize_before:
            branch = self.dropout(fn(norm(x)))
            return self.lrc(x, drop_path(branch, rate, self.training), index)
        branch = self.dropout(fn(x))
        return norm(self.lrc(x, drop_path(branch, rate, self.training), index))

    def forward(
        self,
        x: Tensor,
        parts: LevelParts,
        *,
        padding_mask: Tensor | None = None,
        memory: MemoryKV | None = None,
        cache: KVCache | None = None,
        hooks: Sequence[LevelHook] = (),
    ) -> Tensor:
        """Runs the block at the level ``parts`` describes, then the level's NLL.

        Args:
            x: B x T x C.
            parts: the level's own norms, signals, NLL, slicing and drop-path rate.
            padding_mask: B x T, True at padding (self-attention keys).
            memory: the projected encoder memory (blocks with cross-attention).
            cache: this level's incremental decoding state (self-attention keys/values).
            hooks: the call's extensions (:class:`~recurnmt.modules.hooks.LevelHook`).
        """
        level, rate = parts.index, parts.drop_path
        norms = parts.norms if parts.norms is not None else self.norms

        def self_attention(h: Tensor) -> Tensor:
            terms = combine_terms(
                parts.attention_terms(h), *(hook.attention(level, h) for hook in hooks)
            )
            return self.self_attn(h, key_padding_mask=padding_mask, terms=terms, cache=cache)

        x = self._sublayer(x, 0, norms[0], self_attention, rate)
        index = 1
        if self.cross_attn is not None:
            if memory is None:
                raise ValueError("a block with cross-attention needs the memory")

            def cross_attention(h: Tensor) -> Tensor:
                terms = combine_terms(
                    parts.cross_attention_terms(h),
                    *(hook.cross_attention(level) for hook in hooks),
                )
                return self.cross_attn(h, memory, terms=terms)

            x = self._sublayer(x, index, norms[index], cross_attention, rate)
            index += 1
        if self.ffn is not None:
            x = self._ffn_sublayer(x, index, norms[index], parts, hooks)
        return parts.leave(x)

    def _ffn_sublayer(
        self,
        x: Tensor,
        index: int,
        norm: nn.Module,
        parts: LevelParts,
        hooks: Sequence[LevelHook],
    ) -> Tensor:
        """The FFN sub-layer; a hook may replace the pre-FFN normalisation (DVT eq. 5)."""
        level, rate = parts.index, parts.drop_path
        if self.normalize_before:
            h, hidden = norm(x), None
            for hook in hooks:
                joint = hook.ffn_input(level, x, norm)
                if joint is not None:
                    if hidden is not None:
                        raise ValueError("two hooks replace the FFN input of one level")
                    h, hidden = joint
            kwargs = parts.ffn_deltas(h)
            if hidden is not None:
                kwargs["hidden_delta"] = kwargs.get("hidden_delta", 0) + hidden
            branch = self.dropout(self.ffn(h, **kwargs))
            return self.lrc(x, drop_path(branch, rate, self.training), index)
        if any(hook.ffn_input(level, x, norm) is not None for hook in hooks):
            raise ValueError("a hook replaces the FFN input, which needs a pre-LN block")
        return self._sublayer(x, index, norm, lambda h: self.ffn(h, **parts.ffn_deltas(h)), rate)
