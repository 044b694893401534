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

from collections.abc import Mapping
from types import MappingProxyType

from torch import Tensor, nn
from torch.nn.modules import module as _module

from recurnmt.modules.attention import (
    AttentionTerms,
    LinearReplacement,
    MemoryKV,
    add_to_memory,
)
from recurnmt.modules.level_embedding import sinusoidal_level_embedding
from recurnmt.modules.level_lora import LINEARS, LevelLoRA
from recurnmt.modules.level_signals import LowRankSignal
from recurnmt.modules.sliced_attention import SlicedGroups

NOTHING: Mapping[str, LinearReplacement] = MappingProxyType({})  # no linear folded


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

    def fold_linears(self, block: nn.Module) -> dict[str, LinearReplacement]:
        """The weights and biases this level runs in place of its block's linears, with its
        low-rank signals (RingFormer eq. 5-7, :meth:`LowRankSignal.folded_weight`) and its LoRA
        and bias deltas (Relaxed Recursive Transformers eq. 3, :meth:`LowRankDelta.folded`)
        folded in: the same linear maps, one matrix product each. Keyed as
        :data:`~recurnmt.modules.level_lora.LINEARS`; a linear that is not a plain
        ``nn.Linear`` (a quantized one) or that has forward hooks is left out, and the level
        computes its terms beside it. Made when a decoding session starts, from the weights as
        they are then (:mod:`recurnmt.modules.decoding.session`); nothing here is kept."""
        # the LoRA first: a signal on the FFN's input also reaches the LoRA's input,
        # (W + B A)(I + S), where a signal after the projection only adds, W + B A + S
        sources: dict[str, list[tuple[nn.Module, bool]]] = {}
        for name, delta in (self.lora or {}).items():
            if name != "cross_kv":  # the memory's keys/values: once per sentence already
                sources[name] = [(delta, False)]
        if isinstance(self.attn_signal, LowRankSignal):
            sources.setdefault("qkv", []).append((self.attn_signal, self.attn_place == "before"))
        if isinstance(self.ffn_signal, LowRankSignal):
            sources.setdefault("ffn_up", []).append((self.ffn_signal, self.ffn_place == "input"))
        folded = {}
        for name, terms in sources.items():
            linear = block.get_submodule(LINEARS[name][0])
            if not _plain(linear):
                continue
            weight, bias = linear.weight, linear.bias
            for term, into_input in terms:
                if isinstance(term, LowRankSignal):
                    weight = term.folded_weight(weight, into_input)
                else:
                    weight, bias = term.folded(weight, bias)
            folded[name] = (weight, bias)
        return folded

    def attention_terms(
        self, h: Tensor, folded: Mapping[str, LinearReplacement] = NOTHING
    ) -> AttentionTerms | None:
        """This level's terms for the self-attention on h (B x T x C): Q/K/V signals
        (RingFormer eq. 6), the LoRA on Q/K/V and on the output (Relaxed Recursive
        Transformers eq. 3) and group slicing (SReT sec. 4); a linear in ``folded``
        (:meth:`fold_linears`) carries its terms in its weights."""
        qkv, out = folded.get("qkv"), folded.get("out")
        qkv_delta = qkv_input_delta = out_delta = None
        if qkv is None:
            if self.attn_signal is not None:
                delta = self.attn_signal(h)  # B x T x 3C
                if self.attn_place == "after":
                    qkv_delta = delta
                else:
                    qkv_input_delta = delta.unflatten(-1, (3, h.size(-1)))
            if self.lora is not None:
                lora = self.lora["qkv"](h)
                qkv_delta = lora if qkv_delta is None else qkv_delta + lora
        if out is None and self.lora is not None:
            out_delta = self.lora["out"]
        if qkv is qkv_delta is qkv_input_delta is out is out_delta is self.slicing is None:
            return None
        return AttentionTerms(
            qkv_delta=qkv_delta,
            qkv_input_delta=qkv_input_delta,
            qkv_linear=qkv,
            out_delta=out_delta,
            out_linear=out,
            slicing=self.slicing,
        )

    def cross_attention_terms(
        self, h: Tensor, folded: Mapping[str, LinearReplacement] = NOTHING
    ) -> AttentionTerms | None:
        """This level's terms for the cross-attention from h (B x T x C): the LoRA on the
        query and output projections (Relaxed Recursive Transformers eq. 3), folded into
        them where ``folded`` has them; its keys and values come from :meth:`level_memory`."""
        if self.lora is None or "cross_q" not in self.lora:
            return None
        q, out = folded.get("cross_q"), folded.get("cross_out")
        return AttentionTerms(
            q_delta=self.lora["cross_q"](h) if q is None else None,
            q_linear=q,
            out_delta=self.lora["cross_out"] if out is None else None,
            out_linear=out,
        )

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

    def ffn_deltas(
        self, h: Tensor, folded: Mapping[str, LinearReplacement] = NOTHING
    ) -> dict[str, object]:
        """FFN keyword arguments carrying this level's FFN signal (RingFormer eq. 7) and its
        LoRA on the two projections (Relaxed Recursive Transformers eq. 3), as replaced
        weights where ``folded`` has them."""
        deltas: dict[str, object] = {}
        up, down = folded.get("ffn_up"), folded.get("ffn_down")
        if up is not None or down is not None:
            deltas["linears"] = {k: v for k, v in (("up", up), ("down", down)) if v is not None}
        if up is None:
            if self.ffn_signal is not None:
                key = "input_delta" if self.ffn_place == "input" else "hidden_delta"
                deltas[key] = self.ffn_signal(h)
            if self.lora is not None and "ffn_up" in self.lora:
                deltas["up_delta"] = self.lora["ffn_up"]
        if down is None and self.lora is not None and "ffn_down" in self.lora:
            deltas["down_delta"] = self.lora["ffn_down"]
        return deltas


def _plain(linear: nn.Module) -> bool:
    """``linear`` is an ``nn.Linear`` (not a subclass: a quantized or wrapped linear keeps its
    own forward) with no forward hook of its own or global: a replacement would skip both."""
    hooks = (linear._forward_hooks, linear._forward_pre_hooks)
    global_hooks = (_module._global_forward_hooks, _module._global_forward_pre_hooks)
    return type(linear) is nn.Linear and not any(hooks) and not any(global_hooks)
