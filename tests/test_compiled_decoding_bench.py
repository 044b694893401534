"""scripts/compiled_decoding.py end to end on the tiny corpus: two tiny models trained by
scripts/speculative.py's ``train``, measured with and without compiled steps, the page and its
plot written, a second run resumed from the JSON."""

from __future__ import annotations

import json

import pytest

from tests import nmt_fixtures
from tests.script_modules import load_script

data = nmt_fixtures.data  # the shared fixture

pytestmark = pytest.mark.e2e


def test_measure_writes_the_page(data, tmp_path):
    runs = tmp_path / "runs"
    train = ["train", "--data", str(data), "--out", str(runs), "--models", "ringformer-random",
             "transformer", "--embed-dim", "16", "--ffn-dim", "32", "--heads", "2", "--levels",
             "3", "--max-update", "6", "--nproc", "1"]  # fmt: skip
    assert load_script("speculative").main(train) == 0
    script = load_script("compiled_decoding")
    doc = tmp_path / "c.md"
    flags = ["--data", str(data), "--out", str(runs), "--doc", str(doc), "--models",
             "ringformer-random", "transformer", "owf", "--sentences", "4", "--batch", "2",
             "--rounds", "1", "--drafts", "4:2", "1:2"]  # fmt: skip
    assert script.main(flags) == 0
    before = doc.with_suffix(".json").read_text()
    assert script.main(flags) == 0  # resumed: nothing measured again
    assert doc.with_suffix(".json").read_text() == before
    results = json.loads(before)
    rows = {(r["model"], r["search"], r["run"], r["setting"]): r for r in results["rows"]}
    for setting in ("batch 1", "batch 2"):
        for search in ("greedy", "beam 4"):
            compiled = rows[("ringformer-random", search, "compiled", setting)]
            assert compiled["identical"] == compiled["sentences"] == 4  # fairseq's output
            assert compiled["compile_seconds"] > 0
            assert ("transformer", search, "fairseq's search", setting) in rows
            assert ("transformer", search, "compiled", setting) not in rows  # fairseq's model
    # the draft depth is cut to the model's 3 levels; speculation and the eager static
    # search at batch 1 only
    for run in ("no draft", "speculative R=2 K=2", "speculative R=1 K=2"):
        for suffix in ("", ", compiled"):
            assert rows[("ringformer-random", "greedy", run + suffix, "batch 1")]["identical"] == 4
            assert ("ringformer-random", "greedy", run + suffix, "batch 2") not in rows
    assert rows[("ringformer-random", "greedy", "no draft, compiled", "batch 1")]["compile_seconds"]
    assert ("ringformer-random", "beam 4", "static, eager", "batch 2") not in rows
    assert "owf" not in results["models"]  # not trained: said, skipped
    page = doc.read_text()
    assert "## Batch 1" in page and "## Batch 2" in page
    assert "- **batch 1, greedy**, compiled, against fairseq" in page
    assert "- **drafts on top of the compiled loop** (batch 1, greedy" in page
    assert (tmp_path / "c.png").exists() and "(c.png)" in page
    assert str(tmp_path) not in before  # portable paths only


def test_bad_settings_are_refused_naming_the_flag(data, capsys):
    script = load_script("compiled_decoding")
    with pytest.raises(SystemExit):
        script.main(["--data", str(data), "--drafts", "0:3"])
    assert "--drafts 0:3: at least 1 level and 1 token" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        script.main(["--data", str(data), "--drafts", "2"])
    assert "--drafts 2: draft levels:tokens, for example 1:2" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        script.main(["--data", str(data / "missing")])
    assert "no binarized corpus there" in capsys.readouterr().err
