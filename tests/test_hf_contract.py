"""The ``transformers`` model contract of an exported recurnmt model, through the public API.

What transformers users call on a seq2seq model: ``output_hidden_states`` (per side the
embedding output and every level's output, levels + 1 states, the last equal to the side's
last hidden state, after its final norm, as transformers 5 ties it), ``output_attentions``
(every level's self- and cross-attention probabilities, B x H x T x S, computed explicitly only
when asked for and equal to the fused path), ``return_dict=False`` (the output's ``to_tuple()``),
the base model under ``base_model_prefix``, and the embedding accessors and resizing, which keep
tied weights one tensor and the tokenizer in step. Older exports (weights named without the base
model's prefix) keep loading.
"""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModel, AutoModelForSeq2SeqLM

import recurnmt.hf  # noqa: F401  (registers the model type)
from recurnmt.export import convert, generation_config
from recurnmt.hf import RecurnmtForConditionalGeneration, RecurnmtModel, RecurnmtTokenizer
from tests.nmt_helpers import DICT, batch, build, train_signals
from tests.test_compat_fixtures import FIXTURES, made

ATOL = 1e-5
# (arch, flags, levels per side): shared/tied embeddings, a per-side embedding and an untied
# head with a bias, positions at every level (UT), a final norm (pre-LN sret), 6 levels
MODELS = {
    "ringformer": ("ringformer_tiny", ["--share-all-embeddings"], 3),
    "ut": ("universal_transformer_tiny", [], 3),
    "sret": ("sret_tiny", ["--share-encoder-decoder-embeddings", "--output-projection-bias"], 0),
    "six_levels": (
        "recurrent_transformer_tiny",
        ["--encoder-layers", "6", "--decoder-layers", "6"],
        6,
    ),
}


def exported(name: str) -> RecurnmtForConditionalGeneration:
    arch, flags, _ = MODELS[name]
    model, args, _ = build(arch, *flags)
    train_signals(model)
    hf = convert(model.eval(), args, arch)
    hf.generation_config = generation_config(hf, beam=4, lenpen=1.0, max_len_b=8)
    return hf


def levels(hf: RecurnmtForConditionalGeneration, side: str) -> int:
    """The levels a pass of ``side`` runs (its configuration's)."""
    return getattr(hf.config, f"{side}_levels") or getattr(hf.config, f"{side}_stack")["num_levels"]


def inputs(seed: int = 0) -> dict[str, torch.Tensor]:
    src, _, prev = batch(seed)  # the second source is left-padded
    return dict(input_ids=src, attention_mask=src.ne(DICT.pad()).long(), decoder_input_ids=prev)


@pytest.mark.parametrize("name", MODELS)
def test_hidden_states_are_the_embedding_output_and_every_level(name):
    hf = exported(name)
    with torch.no_grad():
        out = hf(**inputs(), output_hidden_states=True)
    for side, states, last in (
        ("encoder", out.encoder_hidden_states, out.encoder_last_hidden_state),
        ("decoder", out.decoder_hidden_states, None),
    ):
        assert len(states) == levels(hf, side) + 1, side
        if MODELS[name][2]:
            assert len(states) == MODELS[name][2] + 1
        assert all(s.shape == states[0].shape for s in states)
        if last is not None:
            assert states[-1] is last  # after the final norm, as transformers 5 ties it
    logits = hf.lm_head(out.decoder_hidden_states[-1])
    torch.testing.assert_close(logits, out.logits, atol=0, rtol=0)
    assert out.encoder_attentions is out.decoder_attentions is out.cross_attentions is None


@pytest.mark.parametrize("name", ["ringformer", "ut", "six_levels"])
def test_attentions_are_every_levels_probabilities_and_change_nothing(name):
    hf = exported(name)
    x = inputs()
    b, s = x["input_ids"].shape
    t = x["decoder_input_ids"].size(1)
    heads = hf.config.encoder_stack["num_heads"]
    with torch.no_grad():
        fused = hf(**x, output_hidden_states=True)
        explicit = hf(**x, output_attentions=True, output_hidden_states=True)
    for field, shape, side in (
        ("encoder_attentions", (b, heads, s, s), "encoder"),
        ("decoder_attentions", (b, heads, t, t), "decoder"),
        ("cross_attentions", (b, heads, t, s), "decoder"),
    ):
        weights = getattr(explicit, field)
        assert len(weights) == levels(hf, side), field
        for w in weights:
            assert w.shape == shape, field
            torch.testing.assert_close(w.sum(-1), torch.ones(shape[:-1]), atol=1e-6, rtol=0)
    pad = ~x["attention_mask"].bool()  # B x S: no weight on source padding
    assert all(
        w[pad[:, None, None, :].expand_as(w)].abs().max() == 0 for w in explicit.cross_attentions
    )
    future = torch.ones(t, t, dtype=torch.bool).triu(1)  # causal: none on later targets
    assert all(w[..., future].abs().max() == 0 for w in explicit.decoder_attentions)
    torch.testing.assert_close(explicit.logits, fused.logits, atol=ATOL, rtol=0)
    for a, b_ in zip(explicit.encoder_hidden_states, fused.encoder_hidden_states, strict=True):
        torch.testing.assert_close(a, b_, atol=ATOL, rtol=0)


def _same(a, b) -> None:
    if isinstance(a, tuple):
        assert isinstance(b, tuple) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same(x, y)
    elif isinstance(a, torch.Tensor):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    else:
        assert type(a) is type(b)


def test_return_dict_false_gives_the_outputs_to_tuple(tmp_path):
    hf = exported("ringformer")
    x = inputs()
    labels = x["decoder_input_ids"][:, 1:]
    flags = dict(output_attentions=True, output_hidden_states=True, use_cache=False)
    with torch.no_grad():
        out = hf(**x, **flags)
        as_tuple = hf(**x, **flags, return_dict=False)
        source = {k: v for k, v in x.items() if k != "decoder_input_ids"}
        with_loss = hf(**source, labels=labels, return_dict=False)
        base = hf.base_model(**x, **flags, return_dict=False)
    assert isinstance(as_tuple, tuple)
    _same(as_tuple, out.to_tuple())
    assert len(as_tuple) == 7  # logits, 3 decoder tuples, encoder state, 2 encoder tuples
    assert with_loss[0].ndim == 0 and with_loss[1].shape[:2] == labels.shape
    _same(base[1:], out.to_tuple()[1:])  # the base model's: its last state, then the same
    hf.config.return_dict = False  # the configuration's default, as transformers reads it
    with torch.no_grad():
        assert isinstance(hf(**x), tuple)


def test_the_base_model_is_the_encoder_decoder_under_base_model_prefix(tmp_path):
    hf = exported("ringformer")
    assert hf.base_model_prefix == "model"
    assert isinstance(hf.base_model, RecurnmtModel) and hf.base_model is hf.model
    assert hf.get_encoder() is hf.base_model.encoder and hf.get_decoder() is hf.base_model.decoder
    hf.save_pretrained(tmp_path)
    base = AutoModel.from_pretrained(tmp_path).eval()  # the base model of a full checkpoint
    assert type(base) is RecurnmtModel
    x = inputs()
    with torch.no_grad():
        full = hf(**x, output_hidden_states=True)
        states = base(**x).last_hidden_state
    torch.testing.assert_close(states, full.decoder_hidden_states[-1], atol=0, rtol=0)
    torch.testing.assert_close(hf.lm_head(states), full.logits, atol=0, rtol=0)


def test_an_export_written_before_the_base_model_loads_and_computes_the_same():
    """The compatibility fixture is an export made by earlier code: its weights have no
    ``model.`` prefix; the full and the base model load it and compute what it computed."""
    folder = FIXTURES / "hf" / made.HF_ARCH
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        keys = list(f.keys())
    assert keys and not any(k.startswith("model.") for k in keys)
    saved = torch.load(folder / "expected.pt", weights_only=True)
    x = dict(
        input_ids=saved["src"],
        attention_mask=saved["src"].ne(1),
        decoder_input_ids=saved["prev"],
    )
    full = AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
    base = AutoModel.from_pretrained(folder).eval()
    with torch.no_grad():
        logits = full(**x).logits
        states = base(**x).last_hidden_state
    torch.testing.assert_close(logits, saved["logits"], atol=ATOL, rtol=0)
    torch.testing.assert_close(full.lm_head(states), logits, atol=0, rtol=0)


@pytest.mark.parametrize("name", ["ringformer", "ut", "sret"])
def test_resizing_keeps_the_old_rows_and_every_tie(name, tmp_path):
    hf = exported(name)
    vocab = hf.config.vocab_size
    x = {k: v.clamp(max=vocab - 4) for k, v in inputs().items()}  # ids the cut keeps
    shared = {p.data_ptr() for p in hf.parameters()}
    before = {k: v.clone() for k, v in hf.state_dict().items() if v.size(0) == vocab}
    with torch.no_grad():
        logits = hf(**x).logits
    for size in (vocab + 5, vocab - 3):
        embedding = hf.resize_token_embeddings(size)
        assert embedding is hf.get_input_embeddings()
        assert hf.config.vocab_size == size == hf.lm_head.out_features
        rows = min(vocab, size)
        for key, old in before.items():
            new = hf.state_dict()[key]
            assert new.size(0) == size, key
            torch.testing.assert_close(new[:rows], old[:rows], atol=0, rtol=0)
        assert len({p.data_ptr() for p in hf.parameters()}) == len(shared)  # ties kept
    emb = hf.get_input_embeddings().weight
    assert (hf.decoder.embed.embed_tokens.weight is emb) is hf.config.share_input_embeddings
    if hf.config.tie_output_projection:
        assert hf.lm_head.weight is hf.decoder.embed.embed_tokens.weight
    hf.resize_token_embeddings(vocab)
    hf.save_pretrained(tmp_path)
    again = AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        kept = again(**x).logits
    # the rows after the cut came back newly initialised; the first vocab - 3 are the same
    torch.testing.assert_close(kept[..., : vocab - 3], logits[..., : vocab - 3], atol=ATOL, rtol=0)
    assert kept.size(-1) == vocab


def test_set_input_embeddings_moves_every_tie():
    hf = exported("ringformer")
    new = torch.nn.Embedding(hf.config.vocab_size, hf.config.d_model, padding_idx=DICT.pad())
    hf.set_input_embeddings(new)
    assert hf.get_input_embeddings() is new
    assert hf.decoder.embed.embed_tokens is new and hf.lm_head.weight is new.weight


def test_a_resized_model_reads_the_tokens_added_to_its_tokenizer(tmp_path):
    from data_prep.embedded import SHIPPED_DIR

    hf = exported("ringformer")
    vocab = tmp_path / "fairseq_dict.txt"
    vocab.write_text("".join(f"{s}\n" for s in DICT.symbols), encoding="utf-8")
    tok = RecurnmtTokenizer(str(vocab), spm_file=str(SHIPPED_DIR / "spm.model"))
    assert len(tok) == hf.config.vocab_size
    tok.add_tokens(["<term>"])
    assert len(tok) == hf.config.vocab_size + 1
    hf.resize_token_embeddings(len(tok))
    tok.save_pretrained(tmp_path / "out")
    hf.save_pretrained(tmp_path / "out")
    tok = RecurnmtTokenizer.from_pretrained(tmp_path / "out")
    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "out").eval()
    ids = tok("<term>", return_tensors="pt")
    assert ids["input_ids"].tolist() == [[len(DICT), DICT.eos()]]
    assert loaded.config.vocab_size == len(tok)
    with torch.no_grad():
        out = loaded.generate(**ids, num_beams=2, max_new_tokens=4)
    assert out.max() < len(tok)


@pytest.mark.parametrize("beam", [1, 4])
def test_generate_gives_the_same_tokens_when_it_returns_the_states(beam):
    hf = exported("ringformer")
    src, _, _ = batch(seed=1, bsz=4)
    mask = src.ne(DICT.pad()).long()
    with torch.no_grad():
        plain = hf.generate(input_ids=src, attention_mask=mask, num_beams=beam)
        full = hf.generate(
            input_ids=src,
            attention_mask=mask,
            num_beams=beam,
            return_dict_in_generate=True,
            output_attentions=True,
            output_hidden_states=True,
        )
    assert torch.equal(full.sequences, plain)
    assert len(full.encoder_hidden_states) == levels(hf, "encoder") + 1
    assert len(full.encoder_attentions) == levels(hf, "encoder")
    steps = full.sequences.size(1) - 1
    assert len(full.decoder_hidden_states) == len(full.cross_attentions) == steps
    assert all(len(step) == levels(hf, "decoder") for step in full.cross_attentions)


def test_the_documented_example_runs(tmp_path, capsys):
    """``docs/export.md``'s example of hidden states and attentions, on a tiny export."""
    import re

    from data_prep.embedded import SHIPPED_DIR
    from tests.test_docs import REPO

    page = (REPO / "docs" / "export.md").read_text(encoding="utf-8")
    example = re.search(r"```python\n(.*?)```", page, re.S).group(1)
    hf = exported("ringformer")
    vocab = tmp_path / "fairseq_dict.txt"
    vocab.write_text("".join(f"{s}\n" for s in DICT.symbols), encoding="utf-8")
    RecurnmtTokenizer(str(vocab), spm_file=str(SHIPPED_DIR / "spm.model")).save_pretrained(
        tmp_path / "hf_model"
    )
    hf.save_pretrained(tmp_path / "hf_model")
    exec(example.replace('"hf_model"', repr(str(tmp_path / "hf_model"))), {})
    heads = hf.config.encoder_stack["num_heads"]
    printed = capsys.readouterr().out.strip().splitlines()[-1]
    assert re.fullmatch(rf"torch\.Size\(\[1, {heads}, 1, \d+\]\)", printed), printed


def test_sliced_group_attention_refuses_to_show_weights_it_has_no_map_of():
    model, args, _ = build("sret_tiny", "--encoder-attn-groups", "1,2")
    hf = convert(model.eval(), args, "sret_tiny")
    with torch.no_grad():
        hf(**inputs())  # runs as ever without them
        with pytest.raises(ValueError, match="sliced group attention .* cannot be recorded"):
            hf(**inputs(), output_attentions=True)
