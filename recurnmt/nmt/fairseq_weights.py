"""fairseq's ``transformer`` weights under the names of recurnmt's ``recurrent_transformer``.

The two compute the same function once the weights are copied across
(``tests/test_fairseq_equivalence.py``). fairseq keeps Q, K and V as three projections where
recurnmt fuses them (``qkv_proj``: Q, then K, then V; a cross-attention's ``kv_proj``: K, then
V); fairseq's ``fc1``/``fc2`` are the FFN's ``up``/``down``; its per-layer norms are the
block's ``norms`` in sub-layer order (self-attention, cross-attention, FFN); its final
``layer_norm`` (pre-LN) is the stack's ``final_norm``. Token and learned position embeddings
move under ``embed``; sinusoidal positions hold no weights.
"""

from __future__ import annotations

import torch
from torch import Tensor

# fairseq's per-layer norm names, in recurnmt's sub-layer order
_NORMS = {
    "encoder": ("self_attn_layer_norm", "final_layer_norm"),
    "decoder": ("self_attn_layer_norm", "encoder_attn_layer_norm", "final_layer_norm"),
}
_SKIPPED = (".version", "._float_tensor")


def _attention(theirs: dict[str, Tensor], src: str, dst: str, names: str) -> dict[str, Tensor]:
    """fairseq's ``{src}.{q,k,v}_proj`` as one fused projection ``dst`` (``names``: which of
    q, k, v it fuses, in order)."""
    out = {}
    for p in ("weight", "bias"):
        parts = [theirs.pop(f"{src}.{n}_proj.{p}") for n in names]
        out[f"{dst}.{p}"] = torch.cat(parts) if len(parts) > 1 else parts[0]
    return out


def _layer(theirs: dict[str, Tensor], side: str, i: int) -> dict[str, Tensor]:
    src, dst = f"{side}.layers.{i}", f"{side}.stack.blocks.{i}"
    ours = _attention(theirs, f"{src}.self_attn", f"{dst}.self_attn.qkv_proj", "qkv")
    if side == "decoder":
        ours |= _attention(theirs, f"{src}.encoder_attn", f"{dst}.cross_attn.q_proj", "q")
        ours |= _attention(theirs, f"{src}.encoder_attn", f"{dst}.cross_attn.kv_proj", "kv")
    attentions = {"self_attn": "self_attn", "encoder_attn": "cross_attn"}
    for theirs_name, our_name in attentions.items():
        for p in ("weight", "bias"):
            key = f"{src}.{theirs_name}.out_proj.{p}"
            if key in theirs:
                ours[f"{dst}.{our_name}.out_proj.{p}"] = theirs.pop(key)
    for j, name in enumerate(_NORMS[side]):
        for p in ("weight", "bias"):
            ours[f"{dst}.norms.{j}.{p}"] = theirs.pop(f"{src}.{name}.{p}")
    for fs, mine in (("fc1", "up"), ("fc2", "down")):
        for p in ("weight", "bias"):
            ours[f"{dst}.ffn.{mine}.{p}"] = theirs.pop(f"{src}.{fs}.{p}")
    return ours


def from_fairseq_transformer(
    state: dict[str, Tensor], encoder_layers: int, decoder_layers: int, tied_head: bool
) -> dict[str, Tensor]:
    """The state dict of fairseq's ``TransformerModel`` under recurnmt's names.

    Args:
        state: fairseq's ``model.state_dict()`` (a checkpoint's ``model``).
        encoder_layers: its encoder layers.
        decoder_layers: its decoder layers.
        tied_head: the output projection is the decoder's embedding (then recurnmt's decoder
            has none of its own).

    Raises:
        ValueError: a weight left over that recurnmt's model would not hold (an option of
            fairseq's transformer that recurnmt does not implement), or one missing (named).
    """
    theirs = {k: v for k, v in state.items() if not k.endswith(_SKIPPED)}
    ours: dict[str, Tensor] = {}
    try:
        for side, layers in (("encoder", encoder_layers), ("decoder", decoder_layers)):
            for i in range(layers):
                ours |= _layer(theirs, side, i)
            for name in ("embed_tokens", "embed_positions", "layernorm_embedding"):
                for key in [k for k in theirs if k.startswith(f"{side}.{name}.")]:
                    ours[f"{side}.embed.{key.removeprefix(side + '.')}"] = theirs.pop(key)
            for p in ("weight", "bias"):
                if f"{side}.layer_norm.{p}" in theirs:
                    ours[f"{side}.stack.final_norm.{p}"] = theirs.pop(f"{side}.layer_norm.{p}")
    except KeyError as err:
        raise ValueError(f"the checkpoint has no weight {err.args[0]}") from None
    head = theirs.pop("decoder.output_projection.weight", None)
    if head is not None and not tied_head:
        ours["decoder.output_projection.weight"] = head
    if theirs:
        raise ValueError(
            f"the checkpoint holds {sorted(theirs)[0]}, which recurnmt's model has no place "
            "for (an option of fairseq's transformer that recurnmt does not implement)"
        )
    return ours
