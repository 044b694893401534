"""A Transformer block whose weights may serve many levels, and the parts each level owns.

A recurrent stack runs one :class:`TransformerBlock` at several levels. What differs between
levels lives in that level's :class:`LevelParts` and is handed to the block at call time:

* layer norms, when every level owns its own (RingFormer sec. 3.2, "unique layer
  normalization"); otherwise the block owns them and all its levels share them;
* RingFormer level signals (eq. 5-7): on Q, K and V of the self-attention and on the FFN
  input, never on cross-attention (RingFormer sec. 3.2.2, last paragraph);
* SReT's non-linear projection layer after the block (SReT eq. 5-6), never shared.

The block itself may receive an FFN built elsewhere (One Wide FFN: one FFN object shared by
every block of a stack) and carries SReT's learnable residual coefficients (eq. 9).
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
from recurnmt.modules.nll import NonLinearProjection
from recurnmt.modules.residual import ResidualCoefficients


def num_sublayers(cfg: StackConfig) -> int:
    """Residual sub-layers of a block: self-attention, cross-attention?, FFN?."""
    return 1 + int(cfg.cross_attention) + int(cfg.ffn_sharing != "none")


def build_ffn(cfg: StackConfig) -> FeedForward:
    return FeedForward(cfg.embed_dim, cfg.ffn_dim, cfg.activation, cfg.activation_dropout, cfg.bias)


class LevelParts(nn.Module):
    """The parameters one level owns: norms, level signals and an NLL (each optional)."""

    def __init__(self, cfg: StackConfig) -> None:
        super().__init__()
        c, sig = cfg.embed_dim, cfg.signal
        self.norms = (
            nn.ModuleList(nn.LayerNorm(c, eps=cfg.norm_eps) for _ in range(num_sublayers(cfg)))
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
        self.nll = (
            NonLinearProjection(c, cfg.nll_ratio, cfg.activation, cfg.lrc, cfg.norm_eps)
            if cfg.nll_ratio > 0
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

    Post-LN: ``x = LN(skip * x + main * Dropout(f(x)))``; pre-LN:
    ``x = skip * x + main * Dropout(f(LN(x)))``, where skip = main = 1 unless learnable
    residual coefficients are on (SReT eq. 9).

    Args:
        cfg: the stack configuration.
        ffn: an FFN to use (shared with other blocks, One Wide FFN); built here when None
            and the configuration asks for a per-block FFN.
    """

    def __init__(self, cfg: StackConfig, ffn: FeedForward | None = None) -> None:
        super().__init__()
        c = cfg.embed_dim
        self.self_attn = SelfAttention(c, cfg.num_heads, cfg.attention_dropout, cfg.bias)
        self.cross_attn = (
            CrossAttention(c, cfg.num_heads, dropout=cfg.attention_dropout, bias=cfg.bias)
            if cfg.cross_attention
            else None
        )
        if ffn is None and cfg.ffn_sharing == "block":
            ffn = build_ffn(cfg)
        self.ffn = ffn
        n = num_sublayers(cfg)
        self.norms = (
            None
            if cfg.norms_per_level
            else nn.ModuleList(nn.LayerNorm(c, eps=cfg.norm_eps) for _ in range(n))
        )
        self.lrc = ResidualCoefficients(n, cfg.lrc)
        self.dropout = nn.Dropout(cfg.dropout)
        self.normalize_before = cfg.normalize_before

    def _sublayer(
        self,
        x: Tensor,
        index: int,
        norm: nn.Module,
        fn: Callable[[Tensor], Tensor],
        drop_path: float,
    ) -> Tensor:
        if self.normalize_before:
            branch = self.dropout(fn(norm(x)))
            return self.lrc(x, _drop_path(branch, drop_path, self.training), index)
        branch = self.dropout(fn(x))
        return norm(self.lrc(x, _drop_path(branch, drop_path, self.training), index))

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
        attn_groups: int = 1,
        attn_permute: bool = True,
        drop_path: float = 0.0,
        cross_weights: dict[str, Tensor] | None = None,
        attn_bias: Tensor | None = None,
        attn_logits: list[Tensor] | None = None,
        ffn_context: Callable[[Tensor, nn.Module], tuple[Tensor, Tensor]] | None = None,
    ) -> Tensor:
        """Runs the block at one level, followed by the level's NLL if it has one.

        Args:
            x: B x T x C.
            parts: the level's own norms, signals and NLL.
            key_padding_mask: B x T, True at padding (self-attention keys).
            causal: decoder self-attention.
            memory_kv: keys/values of the encoder memory from
                :meth:`CrossAttention.project_memory` (decoder blocks only).
            memory_padding_mask: B x S, True at memory padding.
            cache: incremental decoding state, shared by all levels; this level's entries
                are prefixed by ``cache_key``.
            attn_groups: sliced group self-attention groups at this level (SReT sec. 4).
            attn_permute: permute tokens before slicing (else contiguous slices).
            drop_path: stochastic depth rate of this level's residual branches.
            cross_weights: if given, receives the cross-attention probabilities averaged
                over heads under ``"attn"`` (B x T x S).
            attn_bias: added to the self-attention logits, B x H x T x T (DVT eq. 9).
            attn_logits: if given, receives this level's self-attention logits.
            ffn_context: DVT eq. 5, ``MLP(LN(Concat(x, E)))``: called as
                ``ffn_context(x, norm)`` in place of ``norm(x)`` before the FFN, it returns
                the normalised input (B x T x C) and a term added to the FFN's hidden
                pre-activation (B x T x FF, the context's columns of the first layer).
        """
        norms = parts.norms if parts.norms is not None else self.norms
        reuse = {}
        if attn_bias is not None:
            reuse["attn_bias"] = attn_bias
        if attn_logits is not None:
            reuse["logits_out"] = attn_logits
        x = self._sublayer(
            x,
            0,
            norms[0],
            lambda h: self.self_attn(
                h,
                key_padding_mask=key_padding_mask,
                causal=causal,
                cache=cache,
                cache_key=cache_key,
                groups=attn_groups,
                permute=attn_permute,
                **reuse,
                **parts.attn_kwargs(h),
            ),
            drop_path,
        )
        index = 1
        if self.cross_attn is not None:
            if memory_kv is None:
                raise ValueError("a block with cross-attention needs memory_kv")
            x = self._sublayer(
                x,
                index,
                norms[index],
                lambda h: self.cross_attn(
                    h,
                    memory_kv,
                    memory_padding_mask=memory_padding_mask,
                    weights_out=cross_weights,
                ),
                drop_path,
            )
            index += 1
        if self.ffn is not None and ffn_context is None:
            x = self._sublayer(
                x, index, norms[index], lambda h: self.ffn(h, **parts.ffn_kwargs(h)), drop_path
            )
        elif self.ffn is not None:
            if not self.normalize_before:
                raise ValueError("ffn_context needs a pre-LN block")
            norm = norms[index]

            def ffn(h: Tensor) -> Tensor:
                h, delta = ffn_context(h, norm)
                return self.ffn(h, **_with_hidden_delta(parts.ffn_kwargs(h), delta))

            x = self._sublayer(x, index, nn.Identity(), ffn, drop_path)
        if parts.nll is not None:
            x = parts.nll(x)
        return x


def _with_hidden_delta(kwargs: dict[str, Tensor], delta: Tensor) -> dict[str, Tensor]:
    """FFN keyword arguments with ``delta`` added to the hidden pre-activation."""
    if "hidden_delta" in kwargs:
        delta = kwargs["hidden_delta"] + delta
    return {**kwargs, "hidden_delta": delta}


def _drop_path(x: Tensor, p: float, training: bool) -> Tensor:
    """Drops the whole branch of a sample with probability p, rescaling the rest (B x ...)."""
    if p == 0.0 or not training:
        return x
    keep = x.new_empty((x.size(0),) + (1,) * (x.dim() - 1)).bernoulli_(1.0 - p)
    return x * keep / (1.0 - p)
