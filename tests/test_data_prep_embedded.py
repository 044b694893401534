"""Tests of ``python -m data_prep.embedded`` (the LibreOffice-help German-English corpus)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from data_prep.checksums import MANIFEST_NAME, verify_manifest, write_manifest
from data_prep.embedded import SHIPPED_DIR
from data_prep.embedded.__main__ import cli
from data_prep.embedded.build import write_corpus
from data_prep.embedded.corpus import (
    DEFAULT_FILTER,
    Document,
    SplitCorpus,
    iter_documents,
    split_corpus,
    split_of,
)
from data_prep.embedded.help_html import align_pages, parse_help_page
from data_prep.embedded.prepare import prepare
from data_prep.errors import IntegrityError, PrepError
from data_prep.textio import read_lines

FIXTURES = Path(__file__).parent / "fixtures" / "data_prep" / "lohelp"
MEASUREMENT = "text/shared/guide/measurement_units.html"
SERVER_AUTH = "text/shared/optionen/serverauthentication.html"


def _page(lang_dir: str, rel: str) -> dict[str, str]:
    return parse_help_page((FIXTURES / lang_dir / rel).read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def fixture_documents() -> list[Document]:
    return list(iter_documents(FIXTURES / "de", FIXTURES / "en-US", progress=False))


@pytest.fixture(scope="module")
def tiny_corpus_source(
    tmp_path_factory: pytest.TempPathFactory, fixture_documents: list[Document]
) -> Path:
    """A corpus directory in the shipped format, built from the two fixture pages.

    Pairs are dealt round-robin to the splits (not by page): with two pages a page split would
    leave a split empty, and this corpus only exercises ``prepare``.
    """
    pairs = list(
        dict.fromkeys(
            p for doc in fixture_documents for p in doc.pairs if not DEFAULT_FILTER.reason(*p)
        )
    )
    splits = {"train": [], "valid": [], "test": []}
    for index, pair in enumerate(pairs):
        splits[("test", "valid", "train", "train", "train")[index % 5]].append(pair)
    out = tmp_path_factory.mktemp("tiny") / "corpus"
    out.mkdir()
    names = write_corpus(SplitCorpus(pairs=splits, documents={}), out, vocab_size=120)
    write_manifest(out, names)
    return out


@pytest.fixture
def tiny_corpus(tiny_corpus_source: Path, tmp_path: Path) -> Path:
    """A private copy of the tiny corpus that a test may damage."""
    return Path(shutil.copytree(tiny_corpus_source, tmp_path / "corpus"))


# --- parsing and alignment -------------------------------------------------------------------


def test_parser_aligns_units_by_shared_ids() -> None:
    de, en = _page("de", MEASUREMENT), _page("en-US", MEASUREMENT)
    assert list(de) == list(en)  # same ids, same order
    aligned = {uid: (d, e) for uid, d, e in align_pages(de, en)}
    assert aligned["hd_id3159201"] == ("Maßeinheiten auswählen", "Selecting Measurement Units")
    assert aligned["par_id3150443"] == ("Klicken Sie auf Allgemein.", "Click on General.")


def test_parser_keeps_default_variant_of_inline_switch() -> None:
    # The page's "Choose Tools - Options" has a hidden macOS variant "LibreOffice - Preferences".
    assert _page("en-US", MEASUREMENT)["par_id3153345"] == "Choose Tools - Options."
    assert _page("de", MEASUREMENT)["par_id3153345"] == "Wählen Sie Extras – Optionen…."


def test_parser_strips_markup_unescapes_and_drops_ambiguous_ids() -> None:
    markup = (
        '<div><h2 id="hd_id1">A &amp; B<br>C</h2>'
        '<p id="par_id2">x <span class="switchinline"><span hidden="true" id="MACa">Cmd</span>'
        '<span hidden="true" id="defaulta"><span class="emph">Ctrl</span></span></span>+Z</p>'
        '<p id="bm_module"></p><p id="par_id3">one</p><p id="par_id3">two</p>'
        '<p id="par_id4">same</p><p id="par_id4">same</p></div>'
    )
    assert parse_help_page(markup) == {
        "hd_id1": "A & B C",
        "par_id2": "x Ctrl+Z",
        "par_id4": "same",
    }


def test_iter_documents_skips_pages_missing_in_one_language(tmp_path: Path) -> None:
    shutil.copytree(FIXTURES, tmp_path / "help")
    extra = tmp_path / "help" / "en-US" / "text" / "only_english.html"
    extra.write_text('<p id="par_id1">English only</p>', encoding="utf-8")
    docs = list(iter_documents(tmp_path / "help" / "de", tmp_path / "help" / "en-US", False))
    assert [d.path for d in docs] == [MEASUREMENT, SERVER_AUTH]
    assert len(docs[1].pairs) == 24


# --- cleaning and the document split -----------------------------------------------------------


def test_default_filter_drops_untranslated_and_outliers() -> None:
    assert DEFAULT_FILTER.reason("IMAP", "IMAP") == "identical"
    assert DEFAULT_FILTER.reason("", "Port") == "empty"
    assert DEFAULT_FILTER.reason("Kennwort", "Password") is None
    assert DEFAULT_FILTER.reason("Quotient", "Slash / for quotient set between characters") == (
        "ratio"
    )
    assert DEFAULT_FILTER.reason("wort " * 81, "word " * 81) == "too_long"


def test_split_of_is_a_stable_hash_of_the_path() -> None:
    # Pinned values: changing the hash recipe would silently reshuffle the shipped splits.
    assert split_of(MEASUREMENT, 0.05, 0.05) == "train"
    assert split_of("text/shared/01/05020600.html", 0.5, 0.5) == split_of(
        "text/shared/01/05020600.html", 0.5, 0.5
    )
    shares = [split_of(f"text/page{i}.html", 0.1, 0.2) for i in range(2000)]
    assert 0.15 < shares.count("test") / 2000 < 0.25
    assert 0.06 < shares.count("valid") / 2000 < 0.14


def test_split_never_puts_one_page_in_two_splits(fixture_documents: list[Document]) -> None:
    docs = [
        Document(f"text/p{i}.html", [(f"de {i} {j}", f"en {i} {j}") for j in range(3)])
        for i in range(300)
    ]
    corpus = split_corpus(docs + fixture_documents, valid_share=0.2, test_share=0.2)
    where: dict[str, set[str]] = {}
    for split, pairs in corpus.pairs.items():
        for de, _ in pairs:
            if de.startswith("de "):
                where.setdefault(de.split()[1], set()).add(split)
    assert all(len(splits) == 1 for splits in where.values())
    assert {s for splits in where.values() for s in splits} == {"train", "valid", "test"}
    for split, paths in corpus.documents.items():
        assert all(split_of(p, 0.2, 0.2) == split for p in paths)


def test_split_removes_eval_pairs_whose_side_occurs_in_train() -> None:
    train_path = next(f"p{i}" for i in range(100) if split_of(f"p{i}", 0.0, 0.5) == "train")
    test_path = next(f"p{i}" for i in range(100) if split_of(f"p{i}", 0.0, 0.5) == "test")
    docs = [
        Document(train_path, [("Kennwort", "Password"), ("Port wählen", "Select port")]),
        Document(test_path, [("Kennwort", "Password"), ("Kennwort eingeben", "Enter password"),
                             ("Kennwort eingeben", "Enter password")]),
    ]  # fmt: skip
    corpus = split_corpus(docs, valid_share=0.0, test_share=0.5)
    assert corpus.pairs["test"] == [("Kennwort eingeben", "Enter password")]
    assert corpus.stats["eval_overlap_removed"]["test"] == 1


# --- the shipped corpus -------------------------------------------------------------------------


def test_shipped_corpus_is_intact_and_compact() -> None:
    entries = verify_manifest(SHIPPED_DIR)
    stats = json.loads((SHIPPED_DIR / "stats.json").read_text())
    for split, count in stats["pairs"].items():
        assert len(read_lines(SHIPPED_DIR / f"{split}.de.gz")) == count
        assert len(read_lines(SHIPPED_DIR / f"{split}.en.gz")) == count
    assert 1000 <= stats["pairs"]["valid"] <= 2000 and 1000 <= stats["pairs"]["test"] <= 2000
    assert {"spm.model", "spm.vocab", "train.de.gz", "test.en.gz"} <= set(entries)
    sizes = [p.stat().st_size for p in SHIPPED_DIR.iterdir()]
    assert max(sizes) < 2 * 2**20 and sum(sizes) < 10 * 2**20
    assert "Mozilla Public License" in (SHIPPED_DIR / "LICENSE").read_text()


def test_shipped_splits_share_no_page() -> None:
    pages = json.loads((SHIPPED_DIR / "pages.json").read_text())
    sets = {split: set(paths) for split, paths in pages.items()}
    assert not (sets["train"] & sets["test"] or sets["train"] & sets["valid"])
    assert not sets["valid"] & sets["test"]
    assert all(split_of(p, 0.05, 0.05) == "test" for p in sets["test"])


# --- prepare: verification and atomic output -------------------------------------------------


@pytest.mark.parametrize("damage", ["corrupt", "missing"])
def test_prepare_refuses_damaged_corpus_and_writes_nothing(
    tiny_corpus: Path, tmp_path: Path, damage: str
) -> None:
    target = tiny_corpus / "valid.en.gz"
    if damage == "corrupt":
        target.write_bytes(target.read_bytes()[:-3] + b"xyz")
    else:
        target.unlink()
    out = tmp_path / "bin" / "lohelp"
    with pytest.raises(IntegrityError, match=rf"valid\.en\.gz: file is {damage}"):
        prepare(out, corpus_dir=tiny_corpus)
    assert not (tmp_path / "bin").exists()  # checked before anything is created


def test_prepare_cli_names_the_damaged_file(
    tiny_corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tiny_corpus / "spm.model").write_bytes(b"not a model")
    out = tmp_path / "out"
    code = cli(["prepare", "--out", str(out), "--corpus-dir", str(tiny_corpus)])
    assert code == 2
    err = capsys.readouterr().err
    assert "spm.model: file is corrupt" in err and "Traceback" not in err
    assert not out.exists()


def test_prepare_without_manifest_fails_clearly(tiny_corpus: Path, tmp_path: Path) -> None:
    (tiny_corpus / MANIFEST_NAME).unlink()
    with pytest.raises(IntegrityError, match="manifest is missing"):
        prepare(tmp_path / "out", corpus_dir=tiny_corpus)


def test_prepare_rejects_same_language_twice(tmp_path: Path) -> None:
    with pytest.raises(PrepError, match="de and en"):
        prepare(tmp_path / "out", src="de", tgt="de")


@pytest.mark.e2e
def test_prepare_tiny_corpus_binarizes_and_is_idempotent(tiny_corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "data-bin" / "lohelp_de_en"
    prepare(out, corpus_dir=tiny_corpus)
    names = {p.name for p in out.iterdir()}
    expected = {"dict.de.txt", "dict.en.txt", "spm.model", "prepare.json", "test.raw.en"}
    expected |= {f"{s}.de-en.{lang}.{ext}" for s in ("train", "valid", "test")
                 for lang in ("de", "en") for ext in ("bin", "idx")}  # fmt: skip
    assert expected <= names and "_work" not in names
    assert read_lines(out / "test.raw.en") == read_lines(tiny_corpus / "test.en.gz")
    assert [p.name for p in out.parent.iterdir()] == ["lohelp_de_en"]  # no temp dirs left

    before = (out / "prepare.json").stat().st_mtime_ns
    prepare(out, corpus_dir=tiny_corpus)  # up to date: nothing happens
    assert (out / "prepare.json").stat().st_mtime_ns == before
    with pytest.raises(FileExistsError, match="--force"):
        prepare(out, corpus_dir=tiny_corpus, max_train=5)
    prepare(out, corpus_dir=tiny_corpus, max_train=5, force=True)
    assert len(read_lines(out / "train.raw.de")) == 5


def test_prepare_rejects_a_vocabulary_too_small_to_be_one(tmp_path: Path) -> None:
    with pytest.raises(PrepError, match="--vocab-size must be at least 100 pieces, got 8"):
        prepare(tmp_path / "out", vocab_size=8)
    assert not (tmp_path / "out").exists()


@pytest.mark.e2e
def test_prepare_learns_a_smaller_vocabulary_on_the_training_split(
    tiny_corpus: Path, tmp_path: Path
) -> None:
    import sentencepiece as spm

    out = prepare(tmp_path / "lohelp_de_en", corpus_dir=tiny_corpus, vocab_size=100)
    learned = spm.SentencePieceProcessor(model_file=str(out / "spm.model"))
    shipped = spm.SentencePieceProcessor(model_file=str(tiny_corpus / "spm.model"))
    assert learned.vocab_size() <= 100 < shipped.vocab_size()
    assert json.loads((out / "prepare.json").read_text())["stamp"]["vocab_size"] == 100
    # the raw references are untouched, and the pieces decode back to the text exactly
    # (identity normalisation, as the shipped model)
    refs = read_lines(out / "test.raw.en")
    assert refs == read_lines(tiny_corpus / "test.en.gz")
    assert [learned.decode(learned.encode(r)) for r in refs] == refs
    with pytest.raises(FileExistsError, match="--force"):
        prepare(out, corpus_dir=tiny_corpus)  # another vocabulary is another dataset


@pytest.mark.e2e
def test_prepare_shipped_subset_is_accepted_by_fairseq_train(tmp_path: Path) -> None:
    from data_prep.check import smoke_train

    out = prepare(tmp_path / "lohelp_en_de", src="en", tgt="de", max_train=300)
    assert (out / "train.en-de.en.bin").is_file() and (out / "test.raw.de").is_file()
    assert "done training" in smoke_train(out)
