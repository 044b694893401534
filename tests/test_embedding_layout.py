"""The embedding layouts (--share-encoder-decoder-embeddings, --output-projection-bias), the
embedding scaling (--scale-embedding) and the BiBERT recipes that build RingFormer as its
authors' code does and reproduce Table 1's embedding and head counts."""

from __future__ import annotations

import pytest
import torch
from fairseq import tasks

from recurnmt.experiments.recipe import load_recipe, validate
from recurnmt.modules import ConfigError
from recurnmt.nmt.build import toy_dictionary
from recurnmt.parameters import parameter_report
from tests.nmt_helpers import build

# the BiBERT vocabulary (Xu et al. 2021): 52,000 word pieces; data_prep's fairseq dictionary
# holds the same 52,000 entries (its four specials are BERT's [CLS], [PAD], [SEP], [UNK])
BIBERT_VOCAB = 52_000
A1 = ["--share-encoder-decoder-embeddings", "--output-projection-bias"]


@pytest.fixture(scope="module", autouse=True)
def _warm_meta_device():
    """normal_ on the meta device imports torch's reference ops once (~1.5 s)."""
    with torch.device("meta"):
        torch.empty(2).normal_()


def _truncated(count: int) -> str:
    """Millions with two decimals, cut rather than rounded (as RingFormer's text gives them)."""
    return f"{count // 10_000 / 100:.2f}"


@pytest.mark.parametrize(
    ("name", "width", "embeddings", "head", "p_star"),
    [
        ("ringformer_wmt14_bibert_base", 512, "26.62", "26.67", 8.94),
        ("ringformer_wmt14_bibert_big", 1024, "53.24", "53.30", 35.71),
    ],
)
def test_bibert_recipes_reproduce_table1_counts(name, width, embeddings, head, p_star, tmp_path):
    """RingFormer sec. 4.1: "encoder/decoder embeddings have 26.62M parameters, and the
    vocabulary head has 26.67M" (53.24M / 53.30M large): V x H per side, as the authors'
    code builds an embedding for each (model_Ring.py), and V x H + V, for V = 52,000."""
    recipe = load_recipe(name, base_dir=tmp_path)
    assert recipe.preset.name == "wmt14_de_en_bibert"
    args = validate(recipe)
    dictionary = toy_dictionary(BIBERT_VOCAB - 4)  # + fairseq's four specials
    assert len(dictionary) == BIBERT_VOCAB
    task = tasks.get_task("translation")(args, dictionary, dictionary)
    with torch.device("meta"):
        model = task.build_model(args)
    report = parameter_report(model)
    assert model.encoder.embed_tokens is not model.decoder.embed_tokens
    assert report.embeddings == 2 * BIBERT_VOCAB * width  # one matrix per side
    assert report.output_projection == BIBERT_VOCAB * (width + 1)  # its own weight and bias
    assert (_truncated(report.embeddings // 2), _truncated(report.output_projection)) == (
        embeddings,
        head,
    )
    assert _truncated(report.p_star) == f"{p_star:.2f}"  # bias-free blocks: Table 1's P*
    assert (args.block_bias, args.scale_embedding) == ("off", "off")  # the authors' code
    assert model.encoder.embed.embed_scale == model.decoder.embed.embed_scale == 1.0


@pytest.mark.parametrize("arch", ["ringformer_tiny", "universal_transformer_tiny", "sret_tiny"])
def test_the_layout_shares_inputs_and_unties_the_head(arch):
    model, _, _ = build(arch, *A1)
    encoder, decoder = model.encoder, model.decoder
    assert encoder.embed_tokens is decoder.embed_tokens
    head = decoder.output_projection
    assert head is not None and head.weight is not decoder.embed_tokens.weight
    assert head.bias is not None and not head.bias.any()  # starts at zero
    src = torch.tensor([[5, 6, 2]])
    logits, _ = model(src, torch.tensor([3]), torch.tensor([[2, 7]]))
    assert logits.shape == (1, 2, len(decoder.dictionary))


def test_without_the_bias_flag_the_head_has_no_bias():
    model, _, _ = build("ringformer_tiny", "--share-encoder-decoder-embeddings")
    assert model.decoder.output_projection.bias is None


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (
            ["--share-encoder-decoder-embeddings", "--share-all-embeddings"],
            "--share-all-embeddings",
        ),
        (
            ["--share-encoder-decoder-embeddings", "--share-decoder-input-output-embed"],
            "--share-decoder-input-output-embed",
        ),
        (["--output-projection-bias", "--share-all-embeddings"], "--output-projection-bias"),
    ],
)
def test_contradictions_name_the_flag(extra, named):
    with pytest.raises(ConfigError, match=named):
        build("ringformer_tiny", *extra)


def test_separate_dictionaries_are_refused():
    from recurnmt.nmt.build import build_model

    with pytest.raises(ConfigError, match="--share-encoder-decoder-embeddings.*joined"):
        build_model("ringformer_tiny", A1, toy_dictionary(20), toy_dictionary(30))


def test_bibert_recipes_decode_word_pieces(tmp_path):
    from recurnmt.experiments.recipe import generate_flags

    flags = generate_flags(load_recipe("ringformer_wmt14_bibert_base", base_dir=tmp_path))
    assert flags[flags.index("--bpe") + 1] == "bert" and "--post-process" not in flags
    assert flags[flags.index("--bpe-vocab-file") + 1].endswith("tokenizer/vocab.txt")


def test_scale_embedding_off_is_the_authors_embedding():
    """RingFormer's code: nn.Embedding's N(0, 1) (padding row zero), not scaled by sqrt(H)."""
    torch.manual_seed(0)
    model, args, _ = build("ringformer_tiny", "--scale-embedding", "off")
    assert args.scale_embedding == "off"
    for side in (model.encoder, model.decoder):
        weight = side.embed_tokens.weight
        assert side.embed.embed_scale == 1.0
        assert weight.std().item() == pytest.approx(1.0, rel=0.1)
        assert not weight[side.embed_tokens.padding_idx].any()
    src = torch.tensor([[5, 6, 2]])
    x, embedded, _ = model.encoder.embed(src)
    torch.testing.assert_close(embedded, model.encoder.embed_tokens(src))


def test_scale_embedding_on_is_fairseqs():
    model, args, _ = build("ringformer_tiny")
    assert args.scale_embedding == "on" and model.encoder.embed.embed_scale == 8.0  # sqrt(64)
    assert model.encoder.embed_tokens.weight.std().item() == pytest.approx(64**-0.5, rel=0.1)
    # fairseq's own flag drops the factor and keeps fairseq's initialisation
    fairseq_off, _, _ = build("ringformer_tiny", "--no-scale-embedding")
    assert fairseq_off.encoder.embed.embed_scale == 1.0
    assert fairseq_off.encoder.embed_tokens.weight.std().item() == pytest.approx(64**-0.5, rel=0.1)


def test_embedding_files_load_over_the_authors_initialisation(tmp_path):
    path = tmp_path / "vectors.txt"
    path.write_text("2 64\nw0 " + " ".join(["0.5"] * 64) + "\nw1 " + " ".join(["-2"] * 64) + "\n")
    model, _, _ = build(
        "ringformer_tiny",
        "--scale-embedding",
        "off",
        "--encoder-embed-path",
        str(path),
    )
    table, dictionary = model.encoder.embed_tokens.weight, model.encoder.dictionary
    assert (table[dictionary.index("w0")] == 0.5).all()
    assert (table[dictionary.index("w1")] == -2).all()
    assert table[dictionary.index("w2")].std().item() > 0.5  # the rest: N(0, 1)
