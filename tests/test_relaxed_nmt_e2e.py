"""``scripts/relaxed_nmt.py`` end to end at a tiny size: teacher, conversion, fine-tuning (on
the teacher's translations), training from scratch, the table, the verdict and the plot; a
second run reuses every finished run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests import nmt_fixtures
from tests.test_cli_e2e import ENV, ROOT

data = nmt_fixtures.data  # the shared fixture, found by pytest under this name

pytestmark = pytest.mark.e2e

TINY = [
    "--embed-dim", "32", "--ffn-dim", "64", "--heads", "2", "--levels", "2",
    "--max-update", "3", "--finetune-updates", "2", "--unique", "1", "--ranks", "4",
    "--nproc", "1", "--max-tokens", "1024", "--warmup", "1", "--distill",
]  # fmt: skip


def driver(*args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "scripts/relaxed_nmt.py", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=ENV,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout


def test_the_experiment_runs_writes_its_report_and_reuses_finished_runs(data, tmp_path):
    doc = tmp_path / "docs" / "relaxed_nmt.md"
    args = ["--data", str(data), "--out", str(tmp_path / "runs"), "--doc", str(doc), *TINY]
    out = driver(*args)
    assert "[distilled] 1,500 training pairs" in out
    results = json.loads(doc.with_suffix(".json").read_text(encoding="utf-8"))
    kinds = [r["kind"] for r in results]
    assert kinds == ["teacher", "converted", "fine-tuned", "from scratch"]
    assert [r["updates"] for r in results] == [3, 3, 5, 5]
    assert results[0]["p_star"] > results[1]["p_star"] == results[3]["p_star"]
    assert all(r["valid_ppl"] > 0 and r["chrf"] >= 0 for r in results)
    text = doc.read_text(encoding="utf-8")
    assert "| fine-tuned | 1 | 4 |" in text and "the teacher's translations" in text
    assert "At equal total updates (5), the converted and fine-tuned models" in text
    assert "higher sacreBLEU in" in text and doc.with_suffix(".png").stat().st_size > 0
    again = driver(*args)
    assert again.count("reusing") == 4 and "training" not in again
