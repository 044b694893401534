"""``scripts/relaxed_nmt.py``'s plan (:mod:`recurnmt.runs.relaxed_study`) without training:
the order of the runs, the lr chosen on validation, reuse of finished runs while their
settings hold, a deadline that leaves the rest pending, and verdicts computed from the
numbers (:mod:`recurnmt.runs.relaxed_report`)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from recurnmt.runs import relaxed_report
from recurnmt.runs.relaxed_study import Study
from tests.script_modules import load_script

# the BLEU each kind of run gets in the fake study: conversion wins at equal uptraining
# budget (K) and loses at equal total budget (T + K)
BLEU = {"teacher": 20.0, "converted": 5.0, "fine-tuned": 21.0, "scratch K": 15.0,
        "scratch T+K": 22.0, "teacher continued": 20.1, "teacher re-warmed": 19.5,
        "fine-tuned + KD": 21.5}  # fmt: skip


class FakeStudy(Study):
    """Every run's result made up from its name instead of trained (what ran is recorded)."""

    def __init__(self, args):
        super().__init__(args)
        self.ran: list[str] = []

    def execute(self, run):
        self.ran.append(run.name)
        made_up = type(run)(run.name, run.settings, lambda _: fake_body(self, run), run.updates)
        return super().execute(made_up)

    def train(self, arch, flags, run_dir, data=None):
        raise AssertionError("the fake study trains nothing")


def fake_body(study: FakeStudy, run):
    """A result for ``run`` from its name: the lr 1e-3 has the lowest perplexity."""
    kind = run.name.split("/")[0]
    kinds = {"teacher": "teacher", "convert": "converted", "tune": "fine-tuned",
             "tune-kd": "fine-tuned + KD",
             "scratch": "scratch K", "total": "scratch T+K", "continued": "teacher continued",
             "rewarmed": "teacher re-warmed"}  # fmt: skip
    kind = kinds[kind]
    s = run.settings
    lr = s.get("lr")
    run_dir = study.out / run.name
    (run_dir / "hyp.txt").write_text("a b c\n" * 3, encoding="utf-8")
    found = {"bleu": BLEU[kind], "chrf": 40.0, "valid_ppl": 10.0 + (lr == 3e-3),
             "hyps": str((run_dir / "hyp.txt").relative_to(study.out)),
             "bleu_signature": "sig"}  # fmt: skip
    cell = {"unique": 1, "init": "stepwise", "rank": "4", "p_star": 1000}
    if kind == "teacher":
        return {"kind": kind, "p_star": 2000, "updates": 4, "best_valid_loss": 2.0,
                "stopped_at": 6, "curve": [[2, 3.0], [4, 2.0], [6, 2.1]], **found}  # fmt: skip
    if kind == "converted":
        return {"kind": kind, **cell, "updates": 0, "max_logit_difference": 1.0,
                "energy_kept": 0.5, **found}  # fmt: skip
    if kind == "scratch T+K":
        points = {str(k): found for k in study.args.budgets}
        return {"kind": kind, **cell, "seed": s["seed"], "teacher_updates": 4, "points": points}
    kd = {"teacher_distill": s["teacher_distill"]} if "teacher_distill" in s else {}
    return {"kind": kind, **cell, "k": s["k"], "lr": lr, "seed": s.get("seed", 1),
            "updates": s["k"], **found, **kd}  # fmt: skip


def _args(tmp_path: Path, **changes) -> argparse.Namespace:
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    (data / "test.raw.en").write_text("a b c\n" * 3, encoding="utf-8")
    values = dict(
        embed_dim=32, ffn_dim=64, heads=2, levels=2, max_tokens=1024, beam=4, lenpen=1.0,
        nproc=1, data=data, langs=("de", "en"), out=tmp_path / "runs", fresh=False,
        unique=[1], inits=["stepwise"], ranks=["4"], main_init="stepwise", main_rank="4",
        budgets=[2, 4, 6], seeds=[1, 2], tune_lrs=[3e-3, 1e-3], tune_warmup=1, distill=False,
        teacher_distill=0.5,
        lr=3e-3, warmup=1, dropout=0.1, patience=1, max_update=6, interval=2,
    )  # fmt: skip
    return argparse.Namespace(**(values | changes))


@pytest.fixture
def fake(monkeypatch):
    """No bootstrap over the made-up hypotheses."""
    monkeypatch.setattr(relaxed_report, "paired_bootstrap", lambda *a: 0.5)


def test_the_plan_runs_in_order_chooses_the_lr_and_reuses_finished_runs(tmp_path, fake):
    study = FakeStudy(_args(tmp_path))
    results, pending = study.run()
    assert pending == []
    assert study.ran[:6] == ["teacher", "convert/m1-stepwise-r4", "tune/m1-stepwise-r4/k2/lr0.003/s1",
                             "tune/m1-stepwise-r4/k2/lr0.001/s1",
                             # with the teacher's distribution in the loss, at the middle K
                             "tune-kd/m1-stepwise-r4/k4/lr0.001/w0.5/s1",
                             "tune/m1-stepwise-r4/k4/lr0.001/s1"]  # fmt: skip
    assert study.chosen_lr() == 1e-3  # the lower validation perplexity
    assert study.ran[6:9] == ["scratch/m1-r4/k4/s1", "rewarmed/k4/lr0.001/s1", "continued/k4"]
    assert "total/m1-r4/s2" in study.ran and "continued/k2" in study.ran
    assert not any("lr0.003" in name for name in study.ran[3:])  # only in the selection
    assert len(study.ran) == len(set(study.ran)) == len(results)  # the shared run once
    again = FakeStudy(_args(tmp_path))
    assert again.run()[1] == [] and again.ran == []  # everything reused
    other = FakeStudy(_args(tmp_path, patience=2))  # another teacher: all of it anew
    other.run(deadline=0.0)
    assert other.ran == []  # a deadline passed: nothing starts
    assert other.run(deadline=None)[1] == [] and other.ran[0] == "teacher"
    scratch = [name for name in study.ran if name.startswith("scratch/")]
    assert len(scratch) == 6  # 3 budgets x 2 seeds, independent of the teacher: reused
    assert sorted(other.ran) == sorted(set(study.ran) - set(scratch))


def test_a_deadline_leaves_the_rest_pending_and_the_page_says_so(tmp_path, fake):
    study = FakeStudy(_args(tmp_path))
    results, pending = study.run(deadline=0.0)
    assert results == [] and pending == ["teacher", "(later stages)"]
    page = relaxed_report.markdown(results, pending, study, "cmd", tmp_path / "p.png")
    assert "1 runs: `teacher`, then the stages planned after them." in page


def test_an_unfinished_stage_starts_nothing_after_it_but_its_finished_runs_are_shown(
    tmp_path, fake
):
    study = FakeStudy(_args(tmp_path))
    done, _ = study.run()
    kd = "tune-kd/m1-stepwise-r4/k4/lr0.001/w0.5/s1"
    (study.out / kd / "result.json").unlink()  # say, the plan gained this stage
    again = FakeStudy(_args(tmp_path))
    results, pending = again.run(deadline=0.0)
    assert pending == [kd] and again.ran == []
    assert [r["run"] for r in results] == [r["run"] for r in done if r["run"] != kd]
    assert "total/m1-r4/s2" in [r["run"] for r in results]  # from the stages after it


def test_the_verdicts_follow_the_numbers(tmp_path, fake):
    study = FakeStudy(_args(tmp_path))
    results, _ = study.run()
    page = relaxed_report.markdown(results, [], study, "cmd", tmp_path / "p.png")
    assert ("At equal uptraining budget (K updates after the teacher, which is a sunk cost), "
            "converted and fine-tuned models beat the same architecture trained from scratch: "
            "higher mean sacreBLEU in 3 of 3 comparisons") in page  # fmt: skip
    assert "At equal total budget (the teacher's T updates + K), converted and fine-tuned "
    assert (
        "did not beat the same architecture trained from scratch: higher mean sacreBLEU in 0 of 3"
        in page
    )
    assert "K=2: re-warmed 19.50 against continued 20.10" in page
    assert "21.00 ± 0.00 (2)" in page  # two seeds of the main cell
    assert "0.001 | 10.00" in page and "0.003 | 11.00" in page  # the lr selection
    assert "training stopped at update 6 (the cap, --max-update)" in page
    assert "W = 0.5 (word-level knowledge distillation" in page
    assert "It helped: higher sacreBLEU in 1 of 1 comparisons" in page
    assert "| 4 | 1 | stepwise | 4 | 1 | 21.00 | 21.50 |" in page
    relaxed_report.plot(results, study, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 0


def test_impossible_settings_are_refused_naming_the_option(tmp_path):
    script = load_script("relaxed_nmt")
    for argv, named in ((["--budgets", "300"], "--budgets 300"), (["--ranks", "x"], "--ranks x"),
                        (["--unique", "7"], "--unique 7"), (["--hours", "0"], "--hours 0"),
                        (["--teacher-distill", "2"], "--teacher-distill 2.0: a weight")):  # fmt: skip
        args = script.build_parser().parse_args(argv)
        with pytest.raises(Exception, match=named):
            script.check(args)


def test_an_interrupted_run_goes_on_in_its_folder_and_keeps_its_logs(tmp_path, fake, monkeypatch):
    from recurnmt.runs import relaxed_study
    from recurnmt.runs.relaxed_study import Run, train_logs

    study = FakeStudy(_args(tmp_path))
    run = study.teacher_run()
    seen = []

    def body(run_dir: Path) -> dict:
        seen.append(sorted(p.name for p in run_dir.iterdir()))
        study.train("transformer", [], run_dir)
        if len(seen) == 1:  # the first attempt stops with a checkpoint written
            (run_dir / "checkpoints").mkdir()
            (run_dir / "checkpoints" / "checkpoint_last.pt").write_text("", encoding="utf-8")
            raise KeyboardInterrupt
        return fake_body(study, run)

    monkeypatch.setattr(FakeStudy, "train", Study.train)
    monkeypatch.setattr(relaxed_study, "run_logged", lambda cmd, log: log.write_text("attempt"))
    attempt = Run(run.name, run.settings, body, run.updates)
    with pytest.raises(KeyboardInterrupt):
        Study.execute(study, attempt)
    Study.execute(study, attempt)
    assert seen == [["started.json"], ["checkpoints", "started.json", "train.log"]]
    assert [p.name for p in train_logs(study.out / "teacher")] == ["train-1.log", "train.log"]
    changed = Run(run.name, {**run.settings, "seed": 2}, body, run.updates)
    Study.execute(study, changed)  # other settings: the folder is made anew
    assert seen[-1] == ["started.json"]
