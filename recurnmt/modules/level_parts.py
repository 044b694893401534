"""The parts one level owns, handed to the (possibly shared) block that runs the level.

A recurrent stack runs one block at several levels. What differs between levels lives in
that level's :class:`LevelParts`, each part optional:

* layer norms, when every level owns its own (RingFormer sec. 3.2, "unique layer
  normalization"); otherwise the block owns them and all its levels share them;
* RingFormer level signals (eq. 5-7): on Q, K and V of the self-attention and on the FFN
  input, never on cross-attention (RingFormer sec. 3.2.2, last paragraph);
* a level embedding added to the level's input (Universal Transformer sec. 2.1; RingFormer
  Table 4 "static signal");
* SReT's non-linear projection layer after the block (SReT eq. 5-6), never shared;
* the level's sliced group attention setting (SReT sec. 4: loop r of a block uses its own
  group count) and its stochastic depth rate;
* a relaxed level's own low-rank deltas (LoRA) and bias deltas on every linear of the block
  (Relaxed Recursive Transformers eq. 3, :mod:`recurnmt.modules.level_lora`): on Q/K/V as
  the same additive term as RingFormer's signals, on the attention output, the
  cross-attention's query, keys/values and output, and on the FFN's two projections.

Keeping these out of the block means the block's parameters are registered once, and
"shared across levels" is true by construction (the same module object runs each level).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import Tensor, nn

from recurnmt.modules.attention import (
    AttentionTerms,
    LinearReplacement,
    MemoryKV,
    add_to_memory,
    combine_terms,
)
from recurnmt.modules.level_embedding import sinusoidal_level_embedding
from recurnmt.modules.level_lora import LevelLoRA
from recurnmt.modules.level_signals import LowRankSignal
from recurnmt.modules.sliced_attention import SlicedGroups


class LevelParts(nn.Module):
    """The parameters and settings of one level.

    Args:
        index: the level's index in its stack.
        norms: one layer norm per residual sub-layer of the block (RingFormer); None: the
            block's own.
        attn_signal: Q/K/V level signal, input C -> output 3C (RingFormer eq. 6).
        attn_place: ``after`` the Q/K/V projections (eq. 6) or ``before`` them (Table 4).
        ffn_signal: FFN level signal (eq. 7), on the FFN input or its hidden activation.
        ffn_place: ``input`` (eq. 7) or ``inter`` (Table 4 "inter-FF signal").
        level_embedding: a C-vector added to the level's input (UT; static signal).
        nll: SReT's non-linear projection after the block (eq. 5).
        slicing: the level's sliced group attention (SReT sec. 4); None for global attention.
        drop_path: the stochastic depth rate of the level's residual branches.
        lora: the level's own low-rank and bias deltas on the block's linears (Relaxed
            Recursive Transformers eq. 3); None: the block's weights as they are.
    """

    def __init__(
        self,
        index: int,
        *,
        norms: nn.ModuleList | None = None,
        attn_signal: nn.Module | None = None,
        attn_place: str = "after",
        ffn_signal: nn.Module | None = None,
        ffn_place: str = "input",
        level_embedding: Tensor | None = None,
        nll: nn.Module | None = None,
        slicing: SlicedGroups | None = None,
        drop_path: float = 0.0,
        lora: LevelLoRA | None = None,
    ) -> None:
        super().__init__()
        if attn_place not in ("after", "before"):
            raise ValueError(f"attn_place={attn_place!r}; choose after or before")
        if ffn_place not in ("input", "inter"):
            raise ValueError(f"ffn_place={ffn_place!r}; choose input or inter")
        self.index = index
        self.norms = norms
        self.attn_signal, self.attn_place = attn_signal, attn_place
        self.ffn_signal, self.ffn_place = ffn_signal, ffn_place
        if level_embedding is not None:
            self.register_buffer("level_embedding", level_embedding, persistent=False)
        else:
            self.level_embedding = None
        self.nll = nll
        self.slicing = slicing
        self.drop_path = drop_path
        if lora is not None and attn_signal is not None and attn_place == "before":
            raise ValueError(
                "a level LoRA reads the input of the Q/K/V projection, which an attention "
                "signal placed 'before' changes per projection"
            )
        self.lora = lora

    @property
    def parameter_free(self) -> bool:
        """The level holds no learned parameter, so its parts are defined at any level."""
        return not any(p.requires_grad for p in self.parameters())

    def continued(self, index: int) -> LevelParts:
        """A parameter-free level ``index`` after this one, the last built (elastic depth
        beyond the built levels): the same sinusoidal level embedding at ``index`` (UT
        sec. 2.1 defines it at every step), scaled as this level's."""
        embedding = None
        if self.level_embedding is not None:
            c, n = self.level_embedding.numel(), self.index + 1
            table = sinusoidal_level_embedding(index + 1, c).to(self.level_embedding)
            ref = table[n - 1]
            scale = (self.level_embedding @ ref) / (ref @ ref)
            embedding = scale * table[index]
        return LevelParts(index, level_embedding=embedding)

    def extra_repr(self) -> str:
        return f"index={self.index}, drop_path={self.drop_path}, slicing={self.slicing}"

    def enter(self, x: Tensor) -> Tensor:
        """The level's input: x plus the level embedding, if any (B x T x C)."""
        return x if self.level_embedding is None else x + self.level_embedding

    def leave(self, x: Tensor) -> Tensor:
        """The level's output: the NLL applied to the block output, if any (SReT eq. 6)."""
        return x if self.nll is None else self.nll(x)

    def _folds(self, signal: nn.Module | None) -> bool:
        """In evaluation a low-rank signal is folded into the weight of its projection
        (:meth:`LowRankSignal.fold`), unless the level's LoRA also reads that projection."""
        return isinstance(signal, LowRankSignal) and not self.training and self.lora is None

    @property
    def _folds_lora(self) -> bool:
        """In inference (evaluation, no gradients) a relaxed level runs every linear with its
        LoRA and bias delta folded into the weight and bias (:meth:`LowRankDelta.folded`),
        kept while nothing changes: a decoding step then costs what an unshared layer's
        does, for a copy of the block's weights per level held in memory."""
        return self.lora is not None and not self.training and not torch.is_grad_enabled()

    def _lora_linear(self, name: str) -> LinearReplacement:
        return self.lora[name].folded

    def attention_terms(self, h: Tensor) -> AttentionTerms | None:
        """This level's terms for the self-attention on h (B x T x C): Q/K/V signals
        (RingFormer eq. 6), the LoRA on Q/K/V and on the output (Relaxed Recursive
        Transformers eq. 3) and group slicing (SReT sec. 4)."""
        terms = AttentionTerms(slicing=self.slicing) if self.slicing is not None else None
        if self._folds(self.attn_signal):
            fold = functools.partial(self.attn_signal.fold, into_input=self.attn_place == "before")
            terms = combine_terms(terms, AttentionTerms(qkv_linear=_folded_weight(fold)))
        elif self.attn_signal is not None:
            delta = self.attn_signal(h)  # B x T x 3C
            if self.attn_place == "after":
                signal = AttentionTerms(qkv_delta=delta)
            else:
                signal = AttentionTerms(qkv_input_delta=delta.unflatten(-1, (3, h.size(-1))))
            terms = combine_terms(terms, signal)
        if self._folds_lora:
            lora = AttentionTerms(
                qkv_linear=self._lora_linear("qkv"), out_linear=self._lora_linear("out")
            )
            terms = combine_terms(terms, lora)
        elif self.lora is not None:
            lora = AttentionTerms(qkv_delta=self.lora["qkv"](h), out_delta=self.lora["out"])
            terms = combine_terms(terms, lora)
        return terms

    def cross_attention_terms(self, h: Tensor) -> AttentionTerms | None:
        """This level's terms for the cross-attention from h (B x T x C): the LoRA on the
        query and output projections (Relaxed Recursive Transformers eq. 3); its keys and
        values come from :meth:`level_memory`."""
        if self.lora is None or "cross_q" not in self.lora:
            return None
        if self._folds_lora:
            return AttentionTerms(
                q_linear=self._lora_linear("cross_q"), out_linear=self._lora_linear("cross_out")
            )
        return AttentionTerms(q_delta=self.lora["cross_q"](h), out_delta=self.lora["cross_out"])

    @property
    def relaxes_memory(self) -> bool:
        """The level adds its own term to the memory's keys and values."""
        return self.lora is not None and "cross_kv" in self.lora

    def level_memory(self, kv: MemoryKV, states: Tensor) -> MemoryKV:
        """The block's projected memory ``kv`` as this level reads it: with the level's LoRA
        on the K/V projection applied to the memory ``states`` (B x S x C)."""
        if not self.relaxes_memory:
            return kv
        return add_to_memory(kv, self.lora["cross_kv"](states))  # B x S x 2C

    def ffn_deltas(self, h: Tensor) -> dict[str, object]:
        """FFN keyword arguments carrying this level's FFN signal (RingFormer eq. 7) and its
        LoRA on the two projections (Relaxed Recursive Transformers eq. 3)."""
        deltas: dict[str, object] = {}
        if self._folds(self.ffn_signal):
            into_input = self.ffn_place == "input"
            fold = functools.partial(self.ffn_signal.fold, into_input=into_input)
            deltas["linears"] = {"up": _folded_weight(fold)}
        elif self.ffn_signal is not None:
            key = "input_delta" if self.ffn_place == "input" else "hidden_delta"
            deltas[key] = self.ffn_signal(h)
        if self.lora is not None and "ffn_up" in self.lora:
            if self._folds_lora:
                up, down = self._lora_linear("ffn_up"), self._lora_linear("ffn_down")
                deltas["linears"] = {"up": up, "down": down}
            else:
                deltas["up_delta"] = self.lora["ffn_up"]
                deltas["down_delta"] = self.lora["ffn_down"]
        return deltas


def _folded_weight(fold: Callable[[Tensor], Tensor]) -> LinearReplacement:
    """A replacement of a linear's weight by ``fold(weight)``, its bias kept (a RingFormer
    signal folded into its projection, :meth:`LowRankSignal.fold`)."""
    return lambda linear: (fold(linear.weight), linear.bias)
