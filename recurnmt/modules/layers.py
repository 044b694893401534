"""A Transformer block whose weights may serve many levels, and the parts each level owns.

A recurrent stack runs one :class:`TransformerBlock` at several levels. What differs between
levels lives in that level's :class:`LevelParts` and is handed to the block at call time:

* layer norms, when every level owns its own (RingFormer sec. 3.2, "unique layer
  normalization"); otherwise the block owns them and all its levels share them;
* RingFormer level signals (eq. 5-7): on Q, K and V of the self-attention and on the FFN
  input, never on cross-attention (RingFormer sec. 3.2.2, last paragraph).

Keeping per-level parts out of the block means the block's parameters are registered once,
and "shared across levels" is true by construction (the same module object runs each level).
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor, nn

from recurnmt.modules.attention import CrossAttention, KVCache, SelfAttention
from recurnmt.modules.config import StackConfig
from recurnmt.modules.feedforward import FeedForward
from recurnmt.modules.level_signals import build_signal


def _num_norms(cfg: StackConfig) -> int:
    return 3 if cfg.cross_attention else 2


class LevelParts(nn.Module):
    """The parameters one level owns: layer norms (optional) and level signals (optional)."""

    def __init__(self, cfg: StackConfig) -> None:
        super().__init__()
        c, sig = cfg.embed_dim, cfg.signal
        self.norms = (
            nn.ModuleList(nn.LayerNorm(c) for _ in range(_num_norms(cfg)))
            if cfg.norms_per_level
            else None
        )
        self.attn_place, self.ffn_place = sig.attn, sig.ffn
        self.attn_signal = (
            build_signal(sig.kind, c, c, cfg.signal_rank, groups=3)
            if sig.learned and sig.attn != "none"
            else None
        )
        ffn_out = cfg.ffn_dim if sig.ffn == "inter" else c
        self.ffn_signal = (
            build_signal(sig.kind, c, ffn_out, cfg.signal_rank)
            if sig.learned and sig.ffn != "none"
            else None
        )

    def attn_kwargs(self, h: Tensor) -> dict[str, Tensor]:
        """Keyword arguments carrying this level's Q/K/V signals (RingFormer eq. 6)."""
        if self.attn_signal is None:
            return {}
        delta = self.attn_signal(h)  # B x T x 3C
        if self.attn_place == "after":
            return {"qkv_delta": delta}
        return {"qkv_input_delta": delta.unflatten(-1, (3, h.size(-1)))}

    def ffn_kwargs(self, h: Tensor) -> dict[str, Tensor]:
        """Keyword arguments carrying this level's FFN signal (RingFormer eq. 7)."""
        if self.ffn_signal is None:
            return {}
        key = "input_delta" if self.ffn_place == "input" else "hidden_delta"
        return {key: self.ffn_signal(h)}


class TransformerBlock(nn.Module):
    """Self-attention, optional cross-attention and FFN, each in a residual sub-layer.

    Post-LN: ``x = LN(x + Dropout(f(x)))``; pre-LN: ``x = x + Dropout(f(LN(x)))``.
    """

    def __init__(self, cfg: StackConfig) -> None:
        super().__init__()
        c = cfg.embed_dim
        self.self_attn = SelfAttention(c, cfg.num_heads, cfg.attention_dropout, cfg.bias)
        self.cross_attn = (
            CrossAttention(c, cfg.num_heads, dropout=cfg.attention_dropout, bias=cfg.bias)
            if cfg.cross_attention
            else None
        )
        self.ffn = FeedForward(c, cfg.ffn_dim, cfg.activation, cfg.activation_dropout, cfg.bias)
        self.norms = (
            None
            if cfg.norms_per_level
            else nn.ModuleList(nn.LayerNorm(c) for _ in range(_num_norms(cfg)))
        )
        self.dropout = nn.Dropout(cfg.dropout)
        self.normalize_before = cfg.normalize_before

    def _sublayer(self, x: Tensor, norm: nn.Module, fn: Callable[[Tensor], Tensor]) -> Tensor:
        if self.normalize_before:
            return x + self.dropout(fn(norm(x)))
        return norm(x + self.dropout(fn(x)))

    def forward(
        self,
        x: Tensor,
        parts: LevelParts,
        *,
        key_padding_mask: Tensor | None = None,
        causal: bool = False,
        memory_kv: tuple[Tensor, Tensor] | None = None,
        memory_padding_mask: Tensor | None = None,
        cache: KVCache | None = None,
        cache_key: str = "",
    ) -> Tensor:
        """Runs the block at one level.

        Args:
            x: B x T x C.
            parts: the level's own norms and signals.
            key_padding_mask: B x T, True at padding (self-attention keys).
            causal: decoder self-attention.
            memory_kv: keys/values of the encoder memory from
                :meth:`CrossAttention.project_memory` (decoder blocks only).
            memory_padding_mask: B x S, True at memory padding.
            cache: incremental decoding state, shared by all levels; this level's entries
                are prefixed by ``cache_key``.
        """
        norms = parts.norms if parts.norms is not None else self.norms
        x = self._sublayer(
            x,
            norms[0],
            lambda h: self.self_attn(
                h,
                key_padding_mask=key_padding_mask,
                causal=causal,
                cache=cache,
                cache_key=cache_key,
                **parts.attn_kwargs(h),
            ),
        )
        if self.cross_attn is not None:
            if memory_kv is None:
                raise ValueError("a block with cross-attention needs memory_kv")
            x = self._sublayer(
                x,
                norms[1],
                lambda h: self.cross_attn(h, memory_kv, memory_padding_mask=memory_padding_mask),
            )
        return self._sublayer(x, norms[-1], lambda h: self.ffn(h, **parts.ffn_kwargs(h)))
