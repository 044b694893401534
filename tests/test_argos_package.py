"""``recurnmt-export-ct2 --argos``: the package's layout and metadata as Argos Translate 1.11
reads them, and what it refuses (word-piece data, a name that is no ``.argosmodel``) in one line.
Installing and translating with Argos itself is ``tests/test_argos_e2e.py``."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from recurnmt.nmt import argos_package, ct2_export, sentence_splitter


def test_the_package_is_one_folder_with_what_argos_reads(tmp_path):
    ct2 = tmp_path / "ct2"
    ct2.mkdir()
    for name in ("model.bin", "config.json", "shared_vocabulary.json"):
        (ct2 / name).write_text(name, encoding="utf-8")
    spm = tmp_path / "spm.model"
    spm.write_bytes(b"spm")
    meta = argos_package.metadata("de", "en", from_name="German", to_name="English")
    out = argos_package.write(tmp_path / "pkg" / "translate-de_en-1_0.argosmodel", ct2, spm, meta)
    with zipfile.ZipFile(out) as archive:
        names = sorted(archive.namelist())
        top = "translate-de_en-1_0/"
        assert {n.split("/")[0] for n in names} == {top.rstrip("/")}
        assert names == sorted(
            [f"{top}{n}" for n in ("metadata.json", "sentencepiece.model", "minisbd/de.onnx")]
            + [f"{top}model/{n}" for n in ("model.bin", "config.json", "shared_vocabulary.json")]
        )
        assert json.loads(archive.read(f"{top}metadata.json")) == {
            "type": "translate", "package_version": "1.0", "argos_version": "1.11",
            "from_code": "de", "from_name": "German", "to_code": "en", "to_name": "English",
        }  # fmt: skip
        assert archive.read(f"{top}minisbd/de.onnx") == sentence_splitter.model_bytes("de")
        assert archive.read(f"{top}sentencepiece.model") == b"spm"


def test_a_given_minisbd_model_is_carried_in_place_of_the_rule_based_one(tmp_path):
    ct2, spm, onnx = tmp_path / "ct2", tmp_path / "spm.model", tmp_path / "de.onnx"
    ct2.mkdir()
    spm.write_bytes(b"spm")
    onnx.write_bytes(b"learned")
    out = argos_package.write(
        tmp_path / "p.argosmodel", ct2, spm, argos_package.metadata("de", "en"), splitter=onnx
    )
    with zipfile.ZipFile(out) as archive:
        assert archive.read("p/minisbd/de.onnx") == b"learned"


def test_the_splitters_metadata_is_what_minisbd_reads():
    meta = sentence_splitter.metadata("de")
    vocab = json.loads(meta["vocab"])
    assert vocab["_id2unit"][:2] == ["<PAD>", "<UNK>"]  # MiniSBD's ids 0 and 1
    assert vocab["_unit2id"] == {u: i for i, u in enumerate(vocab["_id2unit"])}
    assert json.loads(meta["config"])["feat_funcs"] == [] and meta["lexicon"] == "null"
    assert sentence_splitter.model_bytes("de").startswith(b"\x08\x07")  # ModelProto.ir_version 7


def _fake_load(data: Path):
    task = SimpleNamespace(cfg=SimpleNamespace(data=str(data), source_lang="de", target_lang="en"))

    def load(checkpoint, data_arg=None):
        return object(), task

    return load


def test_word_piece_data_is_refused_in_one_line_before_anything_is_written(
    tmp_path, capsys, monkeypatch
):
    pytest.importorskip("ctranslate2")
    monkeypatch.delenv("RECURNMT_TRACEBACK", raising=False)
    data = tmp_path / "bibert"
    (data / "tokenizer").mkdir(parents=True)
    (data / "tokenizer" / "vocab.txt").write_text("[PAD]\n", encoding="utf-8")
    monkeypatch.setattr(ct2_export, "load", _fake_load(data))
    out, package = tmp_path / "ct2", tmp_path / "p.argosmodel"
    assert ct2_export.cli([str(tmp_path / "m.pt"), str(out), "--argos", str(package)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "BiBERT word pieces (tokenizer/vocab.txt), which Argos Translate cannot tokenize" in err
    assert not out.exists() and not package.exists()


def test_a_package_name_that_is_no_argosmodel_is_refused_in_one_line(tmp_path, capsys, monkeypatch):
    pytest.importorskip("ctranslate2")
    monkeypatch.delenv("RECURNMT_TRACEBACK", raising=False)
    argv = [str(tmp_path / "m.pt"), str(tmp_path / "ct2"), "--argos", str(tmp_path / "p.zip")]
    assert ct2_export.cli(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "is NAME.argosmodel" in err
