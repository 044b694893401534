"""``scripts/relaxed_nmt.py`` end to end at a tiny size: the teacher to its plateau, a
conversion, the lr selection, fine-tuning (on the teacher's translations), every control
(from scratch for K and for T + K, the teacher continued and re-warmed), fine-tuning with the
teacher's distribution in the loss (``fairseq-train --teacher-checkpoint``), the page with its
verdicts, bootstrap and plot; a second run reuses every finished run, and a third, in a
checkout without the run directories, goes on from the committed record."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from studies.plan import hypotheses
from tests import nmt_fixtures
from tests.test_cli_e2e import ENV, ROOT

data = nmt_fixtures.data  # the shared fixture, found by pytest under this name

pytestmark = pytest.mark.e2e

TINY = [
    "--embed-dim", "32", "--ffn-dim", "64", "--heads", "2", "--levels", "2",
    "--interval", "2", "--max-update", "4", "--patience", "1", "--budgets", "2",
    "--unique", "1", "--inits", "stepwise", "--ranks", "4", "--main-rank", "4",
    "--seeds", "1", "--tune-lrs", "1e-3", "--tune-warmup", "1", "--warmup", "1",
    "--nproc", "1", "--max-tokens", "1024", "--distill",
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


def test_the_study_runs_writes_its_page_and_reuses_finished_runs(data, tmp_path):
    doc = tmp_path / "docs" / "relaxed_nmt.md"
    args = ["--data", str(data), "--out", str(tmp_path / "runs"), "--doc", str(doc), *TINY]
    out = driver(*args)
    assert "[distilled] 1,500 training pairs" in out
    found = json.loads(doc.with_suffix(".json").read_text(encoding="utf-8"))
    assert found["pending"] == []
    kinds = [r["kind"] for r in found["results"]]
    assert kinds == [
        "teacher", "converted", "fine-tuned", "fine-tuned + KD", "scratch K",
        "teacher re-warmed", "teacher continued", "scratch T+K",
    ]  # fmt: skip
    teacher = found["results"][0]
    assert teacher["updates"] in (2, 4) and teacher["stopped_at"] <= 4
    total = found["results"][-1]
    assert total["teacher_updates"] == teacher["updates"] and list(total["points"]) == ["2"]
    assert all((tmp_path / "runs" / r["hyps"]).exists() for r in found["results"] if "hyps" in r)
    kd_log = tmp_path / "runs" / "tune-kd" / "m1-stepwise-r4" / "k2" / "lr0.001" / "w0.5"
    assert "teacher_kl" in (kd_log / "s1" / "train.log").read_text(encoding="utf-8")
    text = doc.read_text(encoding="utf-8")
    assert "## K = 2 updates of uptraining" in text and "| teacher continued |" in text
    assert "At equal uptraining budget" in text and "At equal total budget" in text
    assert "Paired bootstrap" in text and "Still to run" not in text
    assert "## Logit distillation from the teacher" in text
    assert doc.with_suffix(".png").stat().st_size > 0
    again = driver(*args)
    assert "] ..." not in again and "runs to do" not in again  # every run reused
    # a new checkout: the record and the hypotheses committed, the run directories gone, and
    # the plan grown by a run that starts from the teacher and from a conversion
    hyps_dir = doc.parent / "relaxed_nmt_hyps"
    assert sorted(str(p.relative_to(hyps_dir)) for p in hyps_dir.rglob("*.gz")) == sorted(
        f"{h}.gz" for r in found["results"] for h in hypotheses(r)
    )
    shutil.rmtree(tmp_path / "runs")
    record = json.loads(doc.with_suffix(".json").read_text(encoding="utf-8"))
    record["results"] = [r for r in record["results"] if r["kind"] != "fine-tuned + KD"]
    doc.with_suffix(".json").write_text(json.dumps(record), encoding="utf-8")
    third = driver(*args)
    assert "[teacher] its checkpoint is not here: training it again" in third
    assert "[convert/m1-stepwise-r4] its checkpoint is not here: converting again" in third
    started = [line.split("]")[0] + "]" for line in third.splitlines() if "] ... (" in line]
    assert started == ["[tune-kd/m1-stepwise-r4/k2/lr0.001/w0.5/s1]"]
    # the teacher made again is the recorded one, and so is everything after it
    assert doc.read_text(encoding="utf-8") == text
