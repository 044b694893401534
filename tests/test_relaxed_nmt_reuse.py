"""``scripts/relaxed_nmt.py`` reuses a finished run while the settings it depends on are unchanged:
the teacher does not depend on the fine-tuning settings or on distillation, the other runs do."""

from __future__ import annotations

import argparse
from pathlib import Path

from tests.script_modules import load_script


def _script():
    return load_script("relaxed_nmt")


def _args(tmp_path: Path, **changes) -> argparse.Namespace:
    values = dict(
        embed_dim=32, ffn_dim=64, heads=2, levels=2, max_tokens=1024, seed=1, warmup=1, lr=0.003,
        max_update=3, finetune_updates=2, init="stepwise", distill=False, beam=4, lenpen=1.0,
        nproc=1, data=tmp_path / "data", out=tmp_path / "runs", fresh=False,
    )  # fmt: skip
    return argparse.Namespace(**(values | changes))


def test_the_teacher_is_reused_by_a_distillation_run_and_the_others_are_not(tmp_path):
    script = _script()
    calls = []

    def body(run_dir: Path) -> dict:
        calls.append(run_dir.name)
        return {"bleu": 1.0, "chrf": 2.0, "valid_ppl": 3.0}

    plain = _args(tmp_path)
    script.run("teacher", plain, body, free=script.TEACHER_FREE)
    script.run("student", plain, body)
    distill = _args(tmp_path, distill=True, finetune_updates=7)
    script.run("teacher", distill, body, free=script.TEACHER_FREE)  # reused
    script.run("student", distill, body)  # redone: its targets and updates changed
    assert calls == ["teacher", "student", "student"]
    script.run("teacher", _args(tmp_path, max_update=4), body, free=script.TEACHER_FREE)
    assert calls[-1] == "teacher"  # the teacher's own updates changed: trained anew
