"""Tests of the pieces shared by every ``data_prep`` command."""

from __future__ import annotations

import gzip
import signal
from pathlib import Path

import pytest

from data_prep.atomic import atomic_output_dir
from data_prep.binarize import preprocess_command
from data_prep.checksums import MANIFEST_NAME, sha256_file, verify_manifest, write_manifest
from data_prep.cleaning import FilterStats, PairFilter, filter_pairs
from data_prep.errors import IntegrityError, PrepError
from data_prep.pipeline import PrepareRequest, prepare_binarized
from data_prep.segment import SegmentationSpec
from data_prep.textio import read_lines, write_lines
from recurnmt.cli import run_cli


def test_gzip_text_roundtrip_is_byte_reproducible(tmp_path: Path) -> None:
    lines = ["Grüße", "", "tab\tinside"]
    write_lines(tmp_path / "a.gz", lines)
    write_lines(tmp_path / "b.gz", lines)
    assert read_lines(tmp_path / "a.gz") == lines
    assert sha256_file(tmp_path / "a.gz") == sha256_file(tmp_path / "b.gz")


def test_read_lines_names_an_unreadable_file(tmp_path: Path) -> None:
    bad = tmp_path / "broken.gz"
    bad.write_bytes(gzip.compress(b"ok\n")[:-6])
    with pytest.raises(IntegrityError, match="broken.gz"):
        read_lines(bad)


def test_manifest_detects_corrupt_and_missing_files(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("a\n")
    (tmp_path / "b.txt").write_text("b\n")
    write_manifest(tmp_path, ["a.txt", "b.txt"])
    assert set(verify_manifest(tmp_path)) == {"a.txt", "b.txt"}
    (tmp_path / "b.txt").write_text("B\n")
    with pytest.raises(IntegrityError, match=r"b\.txt: file is corrupt.*fix it"):
        verify_manifest(tmp_path, hint="; fix it")
    (tmp_path / "a.txt").unlink()
    with pytest.raises(IntegrityError, match=r"a\.txt: file is missing"):
        verify_manifest(tmp_path)
    (tmp_path / MANIFEST_NAME).write_text("nonsense\n")
    with pytest.raises(IntegrityError, match="malformed"):
        verify_manifest(tmp_path)


def test_atomic_dir_publishes_only_on_success(tmp_path: Path) -> None:
    final = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt), atomic_output_dir(final) as tmp:
        (tmp / "half.bin").write_text("x")
        raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []
    with atomic_output_dir(final) as tmp:
        (tmp / "done").write_text("1")
    assert (final / "done").read_text() == "1"
    with pytest.raises(FileExistsError), atomic_output_dir(final):
        pass
    with atomic_output_dir(final, replace=True) as tmp:
        (tmp / "done").write_text("2")
    assert (final / "done").read_text() == "2"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_pair_filter_matches_clean_corpus_rules() -> None:
    rule = PairFilter(min_words=1, max_words=5, max_ratio=1.5)
    pairs = [("a b", "c d"), ("a", "b c d"), ("", "x"), ("a " * 6, "b " * 6), ("a b c", "d e")]
    stats = FilterStats()
    assert list(filter_pairs(pairs, rule, stats)) == [("a b", "c d"), ("a b c", "d e")]
    assert stats.as_dict() == {"kept": 2, "empty": 1, "ratio": 1, "too_long": 1}


def test_preprocess_command_uses_joined_dictionary(tmp_path: Path) -> None:
    cmd = preprocess_command({"train": tmp_path / "train"}, tmp_path / "bin", "de", "en", 2)
    assert cmd[1:3] == ["-m", "fairseq_cli.preprocess"] and "--joined-dictionary" in cmd
    assert "--validpref" not in cmd and cmd[cmd.index("--trainpref") + 1] == str(tmp_path / "train")


def test_pipeline_failure_midway_leaves_no_output(tmp_path: Path) -> None:
    def write_inputs(work: Path, out: Path) -> None:
        (out / "test.raw.en").write_text("half-written\n")
        raise PrepError("download interrupted at row 12")

    request = PrepareRequest(out=tmp_path / "bin", src="de", tgt="en",
                             segmentation=SegmentationSpec())  # fmt: skip
    with pytest.raises(PrepError, match="row 12"):
        prepare_binarized(request, write_inputs)
    assert list(tmp_path.iterdir()) == []


def test_run_cli_turns_errors_and_sigterm_into_exit_codes(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RECURNMT_TRACEBACK", raising=False)

    def fails(argv: list[str]) -> None:
        raise IntegrityError("x.gz: file is corrupt")

    def terminated(argv: list[str]) -> None:
        signal.raise_signal(signal.SIGTERM)

    previous = signal.getsignal(signal.SIGTERM)
    try:
        assert run_cli(fails, "tool", []) == 2
        assert capsys.readouterr().err == "tool: error: x.gz: file is corrupt\n"
        assert run_cli(terminated, "tool", []) == 130
        assert "tool: interrupted" in capsys.readouterr().err
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert signal.getsignal(signal.SIGTERM) is previous
