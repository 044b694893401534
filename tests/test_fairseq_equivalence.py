"""Our vanilla stack equals fairseq's own transformer, given the same weights.

An independent reference for attention, masks, positions, embedding scaling, incremental
decoding and beam reordering: fairseq's ``transformer`` (post-LN, ReLU) and recurnmt's
``recurrent_transformer`` at the same sizes compute the same function once the weights are
copied across, so their logits and their beam search output must agree.
"""

from __future__ import annotations

import torch
from fairseq.sequence_generator import SequenceGenerator

from tests.nmt_helpers import DICT, batch, build

SIZES = [
    "--encoder-embed-dim", "64", "--decoder-embed-dim", "64",
    "--encoder-ffn-embed-dim", "128", "--decoder-ffn-embed-dim", "128",
    "--encoder-layers", "3", "--decoder-layers", "3",
    "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
]  # fmt: skip


def _copy_attention(src_prefix: str, dst_prefix: str, ours: dict, theirs: dict, cross: bool):
    if cross:
        theirs[f"{dst_prefix}.q_proj.weight"] = ours[f"{src_prefix}.q_proj.weight"]
        theirs[f"{dst_prefix}.q_proj.bias"] = ours[f"{src_prefix}.q_proj.bias"]
        pairs = zip(("k", "v"), ours[f"{src_prefix}.kv_proj.weight"].chunk(2), strict=True)
        bias = dict(zip(("k", "v"), ours[f"{src_prefix}.kv_proj.bias"].chunk(2), strict=True))
    else:
        pairs = zip(("q", "k", "v"), ours[f"{src_prefix}.qkv_proj.weight"].chunk(3), strict=True)
        bias = dict(zip(("q", "k", "v"), ours[f"{src_prefix}.qkv_proj.bias"].chunk(3), strict=True))
    for name, weight in pairs:
        theirs[f"{dst_prefix}.{name}_proj.weight"] = weight
        theirs[f"{dst_prefix}.{name}_proj.bias"] = bias[name]
    for p in ("weight", "bias"):
        theirs[f"{dst_prefix}.out_proj.{p}"] = ours[f"{src_prefix}.out_proj.{p}"]


def fairseq_state_dict(ours: dict, levels: int) -> dict:
    """recurnmt vanilla weights under fairseq's transformer parameter names."""
    theirs: dict = {}
    for side in ("encoder", "decoder"):
        theirs[f"{side}.embed_tokens.weight"] = ours[f"{side}.embed.embed_tokens.weight"]
        norm_names = ["self_attn_layer_norm", "final_layer_norm"]
        if side == "decoder":
            norm_names.insert(1, "encoder_attn_layer_norm")
        for i in range(levels):
            src, dst = f"{side}.stack.blocks.{i}", f"{side}.layers.{i}"
            _copy_attention(f"{src}.self_attn", f"{dst}.self_attn", ours, theirs, cross=False)
            if side == "decoder":
                _copy_attention(f"{src}.cross_attn", f"{dst}.encoder_attn", ours, theirs, True)
            for j, name in enumerate(norm_names):
                for p in ("weight", "bias"):
                    theirs[f"{dst}.{name}.{p}"] = ours[f"{src}.norms.{j}.{p}"]
            for mine, fs in (("up", "fc1"), ("down", "fc2")):
                for p in ("weight", "bias"):
                    theirs[f"{dst}.{fs}.{p}"] = ours[f"{src}.ffn.{mine}.{p}"]
    theirs["decoder.output_projection.weight"] = ours["decoder.output_projection.weight"]
    return theirs


def _pair():
    ours, _, _ = build("recurrent_transformer", *SIZES)
    theirs, _, _ = build("transformer", *SIZES)
    missing, unexpected = theirs.load_state_dict(
        fairseq_state_dict(ours.state_dict(), 3), strict=False
    )
    assert not unexpected and all(k.endswith("version") for k in missing)
    return ours.eval(), theirs.eval()


def test_logits_equal_fairseq_transformer():
    ours, theirs = _pair()
    src, lengths, prev = batch()
    with torch.no_grad():
        a, _ = ours(src, lengths, prev)
        b, _ = theirs(src, lengths, prev)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_beam_search_equals_fairseq_transformer():
    ours, theirs = _pair()
    with torch.no_grad():  # make </s> likely enough that sentences end at different steps
        for model in (ours, theirs):
            model.decoder.output_projection.weight[DICT.eos()] *= 4
    src, lengths, _ = batch(seed=3, bsz=5)

    def run(model):
        gen = SequenceGenerator([model], DICT, beam_size=4, max_len_a=1, max_len_b=2)
        with torch.no_grad():
            hyps = gen.generate([model], {"net_input": {"src_tokens": src, "src_lengths": lengths}})
        return [[(h["tokens"].tolist(), round(h["score"].item(), 4)) for h in s] for s in hyps]

    out = run(ours)
    assert out == run(theirs)
    assert len({len(s[0][0]) for s in out}) > 1  # sentences finish at different steps
