"""Tests of ``python -m data_prep.iwslt14`` / ``data_prep.wmt14`` on hub-format fixtures."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from data_prep import hub, iwslt14, wmt14
from data_prep.errors import DownloadError, IntegrityError
from data_prep.hub import HubSource, iter_pairs, load_splits
from data_prep.moses import MosesRecipe, make_processor, remove_non_printing
from data_prep.parallel import imap_ordered

FIXTURES = Path(__file__).parent / "fixtures" / "data_prep" / "hub"


def _args(module, tmp_path: Path, fixture: str, *extra: str) -> list[str]:  # noqa: ANN001
    return [
        "--from-local", str(FIXTURES / fixture), "--out", str(tmp_path / "out"),
        "--cache-dir", str(tmp_path / "cache"), "--vocab-size", "300", *extra,
    ]  # fmt: skip


# --- text processing ----------------------------------------------------------------------------


def test_moses_recipes_match_the_fairseq_scripts() -> None:
    iwslt = make_processor(MosesRecipe("en", tokenize=True, lowercase=True))
    assert iwslt('It\'s a well-known "Test" & more.') == (
        "it &apos;s a well-known &quot; test &quot; &amp; more ."
    )
    wmt = make_processor(
        MosesRecipe("de", normalize_punctuation=True, remove_non_printing=True,
                    aggressive_dashes=True)
    )  # fmt: skip
    assert wmt("„Ein Bindestrich-Wort“\u200b …") == "&quot; Ein Bindestrich @-@ Wort &quot; ..."
    assert remove_non_printing("a\x07b\u200bc") == "a b c"


def test_parallel_tokenization_equals_serial_and_keeps_order() -> None:
    recipe = MosesRecipe("en", tokenize=True, aggressive_dashes=True)
    lines = [f"Line {i}: a well-known test, isn't it?" for i in range(60)]
    serial = list(imap_ordered(make_processor, (recipe,), lines, workers=1))
    assert list(imap_ordered(make_processor, (recipe,), lines, workers=2, chunk_size=7)) == serial
    assert serial[3] == "Line 3 : a well @-@ known test , isn &apos;t it ?"


def test_iwslt_cleaning_and_valid_carving() -> None:
    pairs = [("<url>http://t</url>", "<url>http://t</url>"), ("<title>Titel</title>", "<title>Title</title>"),
             ("<talkid>1</talkid>", "<talkid>1</talkid>"), ("Hallo", "Hello")]  # fmt: skip
    assert list(iwslt14.clean_train_pairs(pairs)) == [("Titel", "Title"), ("Hallo", "Hello")]
    assert iwslt14.clean_eval_text('<seg id="7"> It’s </seg>') == "It's"
    train, valid = iwslt14.carve_valid(range(1, 70))
    assert valid == [23, 46, 69] and len(train) == 66


def test_hub_urls_pin_the_revision() -> None:
    assert wmt14.SOURCE.hub_url("de-en/train-*.parquet") == (
        "hf://datasets/wmt/wmt14@99a5abb5d3d446e54a4cf512c77dc4fd8dc95e42/de-en/train-*.parquet"
    )
    branch = HubSource("a/b", "refs/convert/parquet", {"train": "x"})
    assert branch.hub_url("x") == "hf://datasets/a/b@refs%2Fconvert%2Fparquet/x"


# --- loading and verification --------------------------------------------------------------------


def test_load_local_hub_layout_and_save_to_disk(tmp_path: Path) -> None:
    splits = load_splits(wmt14.SOURCE, FIXTURES / "wmt14", tmp_path / "cache")
    assert {k: len(v) for k, v in splits.items()} == {"train": 40, "validation": 8, "test": 8}
    first = next(iter_pairs(splits["test"], "en", "de"))
    assert first[0] and first[1] and first[0] != first[1]

    import datasets

    saved = tmp_path / "saved"
    datasets.DatasetDict(splits).save_to_disk(str(saved))
    shutil.copy(FIXTURES / "wmt14" / "rows.json", saved / "rows.json")
    again = load_splits(wmt14.SOURCE, saved, tmp_path / "cache")
    assert list(iter_pairs(again["test"], "en", "de"))[0] == first


def test_row_count_mismatch_is_reported(tmp_path: Path) -> None:
    local = Path(shutil.copytree(FIXTURES / "wmt14", tmp_path / "wmt14"))
    (local / "rows.json").write_text(json.dumps({"train": 41, "validation": 8, "test": 8}))
    with pytest.raises(IntegrityError, match=r"split 'train' has 40 rows, expected 41"):
        load_splits(wmt14.SOURCE, local, tmp_path / "cache")


def test_hub_download_failure_says_how_to_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def offline(*args: object, **kwargs: object) -> None:
        raise ConnectionError("Couldn't reach 'wmt/wmt14' on the Hub")

    monkeypatch.setattr(hub, "_load_parquet", offline)
    with pytest.raises(DownloadError, match="run the command again to resume"):
        load_splits(wmt14.SOURCE)


# --- commands: failures leave nothing behind ------------------------------------------------------


def test_corrupt_local_file_fails_cleanly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    local = Path(shutil.copytree(FIXTURES / "iwslt14", tmp_path / "iwslt14"))
    victim = next((local / "data").glob("train-*.parquet"))
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    args = _args(iwslt14, tmp_path, "iwslt14")
    args[1] = str(local)
    assert iwslt14.cli(args) == 2
    err = capsys.readouterr().err
    assert "python -m data_prep.iwslt14: error: cannot load" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_missing_local_split_names_the_pattern(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    local = Path(shutil.copytree(FIXTURES / "wmt14", tmp_path / "wmt14"))
    next((local / "de-en").glob("test-*.parquet")).unlink()
    args = _args(wmt14, tmp_path, "wmt14")
    args[1] = str(local)
    assert wmt14.cli(args) == 2
    assert "de-en/test-*.parquet" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_interrupt_while_processing_leaves_no_partial_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = iwslt14.iter_pairs

    def interrupted(*args: object, **kwargs: object):  # noqa: ANN202
        for number, pair in enumerate(real(*args, **kwargs)):
            if number == 10:
                raise KeyboardInterrupt
            yield pair

    monkeypatch.setattr(iwslt14, "iter_pairs", interrupted)
    assert iwslt14.cli(_args(iwslt14, tmp_path, "iwslt14")) == 130
    assert "python -m data_prep.iwslt14: interrupted" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache"]


# --- end to end: fairseq-train accepts the output ------------------------------------------------


@pytest.mark.e2e
def test_iwslt14_bpe_output_trains(tmp_path: Path) -> None:
    from data_prep.check import smoke_train

    assert iwslt14.cli(_args(iwslt14, tmp_path, "iwslt14")) == 0
    out = tmp_path / "out"
    stamp = json.loads((out / "prepare.json").read_text())
    assert stamp["lines"]["valid.de"] == 2 and stamp["lines"]["train.de"] == 46  # 48 - 48 // 23
    assert (out / "bpe.codes").is_file() and (out / "test.raw.en").is_file()
    tokens = (out / "dict.en.txt").read_text()
    assert "&apos;" in tokens or "&quot;" in tokens or "@@" in tokens
    assert "done training" in smoke_train(out)
    assert iwslt14.cli(_args(iwslt14, tmp_path, "iwslt14")) == 0  # up to date: no-op


@pytest.mark.e2e
@pytest.mark.parametrize("segmentation", ["bpe", "spm"])
def test_wmt14_output_trains(tmp_path: Path, segmentation: str) -> None:
    from data_prep.check import smoke_train

    args = _args(wmt14, tmp_path, "wmt14", "--segmentation", segmentation, "--workers", "2")
    assert wmt14.cli(args) == 0
    out = tmp_path / "out"
    assert (out / "train.en-de.en.bin").is_file() and (out / "test.raw.de").is_file()
    model = "bpe.codes" if segmentation == "bpe" else "spm.model"
    assert (out / model).is_file()
    stamp = json.loads((out / "prepare.json").read_text())
    assert stamp["lines"]["test.de"] == 8 and stamp["train_filter"]["kept"] <= 40
    assert "done training" in smoke_train(out)
