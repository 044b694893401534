"""scripts/deploy_bench.py end to end on the tiny corpus: two tiny models trained by
scripts/speculative.py, exported and measured in PyTorch and CTranslate2, the page written."""

from __future__ import annotations

import json

import pytest

from tests import nmt_fixtures
from tests.script_modules import load_script

pytest.importorskip("ctranslate2")  # the [deploy] extra: in the locked .venv

data = nmt_fixtures.data  # the shared fixture

pytestmark = pytest.mark.e2e


def test_measure_writes_the_page(data, tmp_path):
    runs = tmp_path / "runs"
    models = ["transformer", "ringformer"]
    train = ["train", "--data", str(data), "--out", str(runs), "--models", *models,
             "--embed-dim", "16", "--ffn-dim", "32", "--heads", "2", "--levels", "2",
             "--max-update", "4", "--nproc", "1"]  # fmt: skip
    assert load_script("speculative").main(train) == 0
    bench = load_script("deploy_bench")
    argv = ["--data", str(data), "--runs", str(runs), "--out", str(tmp_path / "out"),
            "--doc", str(tmp_path / "d.md"), "--models", *models, "--sentences", "4",
            "--rounds", "1"]  # fmt: skip
    assert bench.main(argv) == 0
    results = json.loads((tmp_path / "d.json").read_text())
    for model in models:
        row = results["models"][model]
        assert row["identical_greedy"]["same"] == row["identical_greedy"]["of"] == 24
        assert set(row["bleu"]) == {f"{e}, beam {b}" for e in ("pytorch", "ct2 float32",
                                                            "ct2 int8") for b in (1, 4)}  # fmt: skip
        assert len(row["speed"]) == 12 and row["sizes"]["int8_mib"] < row["sizes"]["float32_mib"]
    shared, unshared = results["storage"].values()
    assert shared["model_bin_mib"] < 0.6 * unshared["model_bin_mib"]
    page = (tmp_path / "d.md").read_text()
    assert "## Speed (tokens/s)" in page and "![tokens/s by engine](d.png)" in page
    assert (tmp_path / "d.png").exists()
    assert str(tmp_path) not in (tmp_path / "d.json").read_text()  # portable paths only
