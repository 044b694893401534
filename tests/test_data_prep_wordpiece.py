"""``data_prep.wmt14 --tokenizer bibert``: word pieces through transformers, a one-to-one fairseq
dictionary, decoding; on a small local tokenizer in BiBERT's format (the hub is not reachable)."""

from __future__ import annotations

import json
from argparse import Namespace
from pathlib import Path

import pytest

from data_prep import wmt14
from data_prep.errors import PrepError
from data_prep.wordpiece import (
    BIBERT,
    WordPieceSegmenter,
    detokenize_pieces,
    fairseq_symbols,
    load_wordpiece_tokenizer,
    save_tokenizer,
    write_fairseq_dictionary,
)

FIXTURE = Path(__file__).parent / "fixtures" / "data_prep" / "wordpiece" / "bibert_like"
HUB = Path(__file__).parent / "fixtures" / "data_prep" / "hub" / "wmt14"


@pytest.fixture(scope="module")
def tokenizer():
    return load_wordpiece_tokenizer(FIXTURE)


def test_a_roberta_config_beside_vocab_txt_still_gives_the_word_pieces(tokenizer):
    """AutoTokenizer alone builds an empty RoBERTa tokenizer from BiBERT's layout."""
    from transformers import AutoTokenizer

    assert len(AutoTokenizer.from_pretrained(FIXTURE)) < 10
    assert len(tokenizer) == len((FIXTURE / "vocab.txt").read_text().splitlines()) == 400
    assert tokenizer.tokenize("Wählen Sie eine Farbe.")[:2] == ["W", "##äh"]  # cased


def test_the_fairseq_dictionary_is_the_vocabulary_one_to_one(tokenizer, tmp_path):
    from fairseq.data import Dictionary

    dictionary = Dictionary.load(str(write_fairseq_dictionary(tokenizer, tmp_path / "dict.txt")))
    assert len(dictionary) == len(tokenizer)  # nothing added, nothing padded
    assert dictionary.symbols == fairseq_symbols(tokenizer)
    assert len(set(dictionary.symbols)) == len(dictionary)
    inverse = {"<s>": "[CLS]", "<pad>": "[PAD]", "</s>": "[SEP]", "<unk>": "[UNK]"}
    assert sorted(inverse.get(s, s) for s in dictionary.symbols) == sorted(tokenizer.get_vocab())
    for i in range(4, len(tokenizer)):  # BERT's specials come first: the other ids agree
        assert dictionary[i] == tokenizer.convert_ids_to_tokens(i)


def test_decoding_agrees_with_fairseq_bert_decoder(tokenizer, tmp_path):
    from fairseq.data.encoders.hf_bert_bpe import BertBPE

    saved = save_tokenizer(tokenizer, tmp_path / "tokenizer")
    assert load_wordpiece_tokenizer(saved).get_vocab() == tokenizer.get_vocab()
    segmenter = WordPieceSegmenter(saved)
    pieces = segmenter.encode_line("Wählen Sie eine Farbe für das aktuelle Schema aus.")
    fairseq_bpe = BertBPE(Namespace(bpe_vocab_file=str(saved / "vocab.txt"), bpe_cased=True))
    text = detokenize_pieces(tokenizer, pieces)
    assert (
        text == fairseq_bpe.decode(pieces) == "Wählen Sie eine Farbe für das aktuelle Schema aus."
    )
    assert segmenter.encode_line("Ωμέγα") == "<unk>"  # fairseq's unknown symbol


def test_unavailable_tokenizer_without_network_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(PrepError, match=rf"'{BIBERT}' is not available locally.*--tokenizer-path"):
        load_wordpiece_tokenizer(BIBERT, cache_dir=tmp_path)
    with pytest.raises(PrepError, match="holds no loadable tokenizer"):
        load_wordpiece_tokenizer(tmp_path)


def test_tokenizer_and_segmentation_exclude_each_other(tmp_path):
    args = ["--from-local", str(HUB), "--out", str(tmp_path / "out"), "--tokenizer", "bibert"]
    with pytest.raises(PrepError, match="drop --segmentation spm"):
        wmt14.main([*args, "--segmentation", "spm"])


@pytest.mark.e2e
def test_wmt14_with_the_bibert_tokenizer_trains(tmp_path):
    from fairseq.data import Dictionary

    from data_prep.check import smoke_train

    out = tmp_path / "out"
    args = ["--from-local", str(HUB), "--out", str(out), "--cache-dir", str(tmp_path / "cache")]
    args += [
        "--src",
        "de",
        "--tgt",
        "en",
        "--tokenizer",
        "bibert",
        "--tokenizer-path",
        str(FIXTURE),
    ]
    assert wmt14.cli(args) == 0
    stamp = json.loads((out / "prepare.json").read_text())
    assert stamp["segmentation_model"] == "tokenizer"
    assert stamp["stamp"]["tokenizer"] == str(FIXTURE.resolve())
    assert (out / "tokenizer" / "vocab.txt").is_file()
    for lang in ("de", "en"):  # one joined dictionary: the tokenizer's 400 entries
        assert len(Dictionary.load(str(out / f"dict.{lang}.txt"))) == 400
    assert "done training" in smoke_train(out)
