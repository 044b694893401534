"""scripts/adaptive_depth.py end to end on the tiny corpus: a tiny mixed-depth RingFormer
trained by its ``train`` step, thresholds calibrated on validation, the test-set curves, the
page and its plot, a second run resumed from the JSON."""

from __future__ import annotations

import json

import pytest

from studies.adaptive.measure import GRIDS, agreement, calibrated
from tests import nmt_fixtures
from tests.script_modules import load_script

data = nmt_fixtures.data  # the shared fixture

pytestmark = pytest.mark.e2e


def test_measure_writes_the_page(data, tmp_path):
    runs = tmp_path / "runs"
    script = load_script("adaptive_depth")
    train = ["train", "--data", str(data), "--out", str(runs), "--models", "ringformer-random",
             "--embed-dim", "16", "--ffn-dim", "32", "--heads", "2", "--levels", "3",
             "--max-update", "6", "--nproc", "1"]  # fmt: skip
    assert script.main(train) == 0
    assert (runs / "ringformer-random" / "checkpoints" / "checkpoint_last.pt").exists()
    doc = tmp_path / "a.md"
    flags = ["measure", "--data", str(data), "--out", str(runs), "--doc", str(doc),
             "--sentences", "3", "--batch", "4", "--valid-sentences", "6", "--unit-epochs", "1",
             "--unit-sentences", "20"]  # fmt: skip
    assert script.main(flags) == 0
    before = doc.with_suffix(".json").read_text()
    assert script.main(flags) == 0  # resumed: nothing measured again
    assert doc.with_suffix(".json").read_text() == before
    record = json.loads(before)
    mine = record["results"]["ringformer-random"]
    assert "relaxed_transformer-random" not in record["models"]  # not trained: said, skipped
    assert (runs / "ringformer-random" / "exit_units.pt").exists()  # the classifier's units
    for test in ("saturation", "margin", "classifier"):
        rows = mine["calibration"][test]
        assert [r["threshold"] for r in rows] == list(GRIDS[test])
        assert all(0 <= r["agreement"] <= 1 and 1 <= r["levels"] <= 3 for r in rows)
        assert all(0 <= r["consistency"] <= 1 for r in rows)
    points = mine["points"]
    settings = {p["setting"] for p in points}
    assert settings == {"batch 64 beam 4", "batch 64 greedy", "batch 1 beam 4"}
    for p in points:
        if p["test"] == "full depth":
            assert p["levels"] == 3 and p["agreement"] == 1 and p["p"] is None
        else:
            assert 1 <= p["levels"] <= 3 and 0 <= p["p"] <= 1
    never = [p for p in points if p["calibrated_for"] == "never"]
    assert len(never) == 3 and all(p["levels"] == 3 and p["agreement"] == 1 for p in never)
    floor = [p for p in points if p["calibrated_for"] == "floor"]
    assert len(floor) == 3 and all(p["levels"] == 1 for p in floor)
    curve = [p for p in points if p["setting"] == "batch 64 beam 4" and p["test"] == "margin"]
    assert {p["threshold"] for p in curve} >= set(GRIDS["margin"])
    assert set(mine["time"]) >= {"full depth", "floor"}
    assert all(v["everything else"] >= 0 for v in mine["time"].values())
    page = doc.read_text()
    assert "### Where the time goes" in page
    assert "## ringformer-random" in page and "Verdict at batch 64, beam 4:" in page
    assert "### Calibration (validation, batch 64, beam 4)" in page
    assert (tmp_path / "a.png").exists() and "(a.png)" in page
    assert str(tmp_path) not in before  # portable paths only


def test_agreement_and_calibration():
    import torch

    full = {0: torch.tensor([5, 6, 7, 2]), 1: torch.tensor([8, 2])}
    mine = {0: torch.tensor([5, 9, 7, 2]), 1: torch.tensor([8, 2])}
    assert agreement(full, mine) == (5 / 6, 0.5)
    rows = [{"threshold": 0.9, "consistency": 0.995, "levels": 4.0},
            {"threshold": 0.5, "consistency": 0.97, "levels": 2.5}]  # fmt: skip
    assert calibrated(rows, 0.99) == 0.9 and calibrated(rows, 0.95) == 0.5
    assert calibrated(rows, 0.999) is None


def test_bad_settings_are_refused_naming_the_flag(data, capsys):
    script = load_script("adaptive_depth")
    with pytest.raises(SystemExit):
        script.main(["measure", "--data", str(data), "--agreements", "1.5"])
    assert "--agreements [1.5]: each in (0, 1]" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        script.main(["measure", "--data", str(data), "--max-update", "3"])
    assert "unrecognized arguments: --max-update 3" in capsys.readouterr().err
