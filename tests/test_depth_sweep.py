"""scripts/depth_sweep.py: its table and plot, and both tasks end to end on tiny settings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests import nmt_fixtures
from tests.script_modules import load_script

data = nmt_fixtures.data  # the shared fixture, found by pytest under this name


def _script():
    return load_script("depth_sweep")


REASON = "--encoder-levels=3: this stack's per-level parts are learned"


def _results() -> dict[str, dict]:
    def run(variant: str, scores: dict) -> dict:
        train = {"command": f"fairseq-train ... --mixed-depth {variant}"}
        return {"variant": variant, "train": train, "trained_levels": 2, "scores": scores}

    return {
        "plain": run("off", {"1": {"score": 1.5}, "2": {"score": 9.25}, "3": {"refused": REASON}}),
        "mixed": run("on", {"1": {"score": 6.0}, "2": {"score": 8.0}, "3": {"refused": REASON}}),
    }


def test_table_marks_the_trained_depth_and_explains_refusals():
    sweep = _script()
    text = sweep.markdown("nmt", _results(), 4, "python scripts/depth_sweep.py nmt", "p.png")
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    assert rows[0] == ("| levels K | trained without mixed depth | trained with mixed depth |")
    assert rows[2:] == [
        "| 1 | 1.50 | 6.00 |",
        "| 2 (trained) | 9.25 | 8.00 |",
        "| 3 | refused [1] | refused [1] |",
        "| 4 | - | - |",  # not scored
    ]
    assert f"[1] {REASON}" in text and "![sacreBLEU (test) against levels](p.png)" in text
    assert "`fairseq-train ... --mixed-depth on`" in text


def test_vision_table_gives_the_compute_of_each_depth():
    results = _results()
    results["plain"]["scores"]["1"] = {"score": 90.0, "MMACs": 0.512}
    text = _script().markdown("vision", results, 1, "cmd", "p.png")
    assert "| 1 | 90.00 (0.51 MMACs) | 6.00 |" in text


def test_plot_is_a_png(tmp_path):
    path = tmp_path / "sweep.png"
    _script().plot_sweep("nmt", _results(), path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _sweep(tmp_path: Path, *argv: str) -> dict:
    task = argv[0]
    places = ["--out", str(tmp_path / "runs"), "--doc-dir", str(tmp_path / "docs")]
    _script().main([task, *places, *argv[1:]])  # before the flags passed on after --
    doc = tmp_path / "docs" / f"depth_sweep_{task}.md"
    assert (tmp_path / "docs" / f"depth_sweep_{task}.png").exists()
    assert "| 3 | refused [1] | refused [1] |" in doc.read_text(encoding="utf-8")
    return json.loads(doc.with_suffix(".json").read_text(encoding="utf-8"))


@pytest.mark.e2e
def test_nmt_sweep_end_to_end(data, tmp_path):
    size = ["--embed-dim", "16", "--ffn-dim", "32", "--heads", "2", "--levels", "2"]
    budget = ["--max-update", "3", "--max-levels", "3", "--beam", "1"]
    # an untrained model translates to the length limit: beam 1 keeps that short
    results = _sweep(
        tmp_path, "nmt", "--data", str(data), *size, *budget, "--", "--log-interval", "1"
    )
    for result in results.values():
        scores = result["scores"]
        assert result["trained_levels"] == 2 and set(scores) == {"1", "2", "3"}
        assert all(scores[k]["score"] >= 0 for k in ("1", "2"))
        assert "learned" in scores["3"]["refused"]  # RingFormer's level signals
    assert "--mixed-depth on" in results["mixed"]["train"]["command"]
    log = (tmp_path / "runs" / "nmt" / "mixed" / "train.log").read_text(encoding="utf-8")
    assert '"shallow_loss"' in log  # the shallow branch was trained


@pytest.mark.e2e
def test_vision_sweep_end_to_end(tmp_path):
    train = ["--", "--model-arg", "depth=2", "--limit-train", "64", "--limit-eval", "64"]
    results = _sweep(tmp_path, "vision", "--epochs", "1", "--max-levels", "3", *train)
    scores = results["mixed"]["scores"]
    assert results["mixed"]["trained_levels"] == 2
    assert 0 <= scores["1"]["score"] <= 100 and scores["1"]["MMACs"] < scores["2"]["MMACs"]
    assert "--mixed-depth" in results["mixed"]["train"]["command"]
    assert "--mixed-depth" not in results["plain"]["train"]["command"]
