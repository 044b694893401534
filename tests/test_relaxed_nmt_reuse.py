"""``scripts/relaxed_nmt.py``'s plan (:mod:`studies.relaxed.study`) without training:
the order of the runs, the lr chosen on validation, reuse of finished runs while their
settings hold, a deadline that leaves the rest pending, and verdicts computed from the
numbers (:mod:`studies.relaxed.report`)."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import pytest

from studies.plan import AGAIN, hypotheses
from studies.relaxed import report as relaxed_report
from studies.relaxed.study import Study
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
    assert "1 run: `teacher`, then the stages planned after them." in page


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
    assert ("Paired bootstrap: 0 of 3 differences reliable (p < 0.05 in every seed), 3 not "
            "(M=1, K=2; M=1, K=4; M=1, K=6).") in page  # the fake's p is 0.5  # fmt: skip
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
    from studies.plan import Run, train_logs
    from studies.relaxed import setup

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
    monkeypatch.setattr(setup, "run_logged", lambda cmd, log: log.write_text("attempt"))
    attempt = Run(run.name, run.settings, body, run.updates)
    with pytest.raises(KeyboardInterrupt):
        Study.execute(study, attempt)
    Study.execute(study, attempt)
    assert seen == [["started.json"], ["checkpoints", "started.json", "train.log"]]
    assert [p.name for p in train_logs(study.out / "teacher")] == ["train-1.log", "train.log"]
    changed = Run(run.name, {**run.settings, "seed": 2}, body, run.updates)
    Study.execute(study, changed)  # other settings: the folder is made anew
    assert seen[-1] == ["started.json"]


def _recorded_study(tmp_path: Path, **changes):
    """A finished fake study whose record (results, p-values, hypotheses) is written as
    scripts/relaxed_nmt.py writes it, and its run directories then removed: a new checkout."""
    from recurnmt.experiments.artifacts import write_json

    record = tmp_path / "docs" / "relaxed_nmt.json"
    study = FakeStudy(_args(tmp_path, record=record, **changes))
    results, pending = study.run()
    record.parent.mkdir()
    made = {h for r in results for h in hypotheses(r)}  # (the fake's T + K points share one)
    assert study.record.keep(results, study.out) == len(made) == len(results)
    assert study.record.keep(results, study.out) == 0  # kept once
    write_json(record, {"results": results, "pending": pending, "bootstrap": {"x": 0.25}})
    shutil.rmtree(study.out)
    return study, results


def test_a_checkout_without_the_run_directories_goes_on_from_the_record(tmp_path, fake):
    first, results = _recorded_study(tmp_path)
    again = FakeStudy(first.args)
    assert again.record.pvalues == {"x": 0.25}
    found, pending = again.run()
    assert pending == [] and again.ran == []  # every run from the record
    assert found == results
    for r in relaxed_report.points(results):  # the hypotheses back in place, as they were
        assert (again.out / r["hyps"]).read_text(encoding="utf-8") == "a b c\n" * 3
    assert json.loads((again.out / "teacher" / "result.json").read_text()) == results[0]
    other = FakeStudy(_args(tmp_path, record=first.args.record, patience=2))
    other.run()  # another teacher: only the runs that do not depend on it are taken
    assert other.ran[0] == "teacher" and not any(n.startswith("scratch/") for n in other.ran)
    fresh = FakeStudy(_args(tmp_path, record=first.args.record, fresh=True))
    fresh.run()
    assert len(fresh.ran) == len(results)  # --fresh: the record is not used either


def test_what_a_later_run_needs_is_made_again_and_the_teacher_checked(tmp_path, fake):
    from recurnmt.cli import UserError

    first, results = _recorded_study(tmp_path)
    again = FakeStudy(first.args)
    again.run()
    converted = []
    again.convert = lambda cell: converted.append((cell.name, again.teacher_checkpoint()))
    cell = again.main[0]
    assert again.conversion(cell) == again.converted_path(cell)
    # the teacher's checkpoint is missing: trained again, found equal to the record
    checkpoint = again.teacher_dir / "checkpoints" / "checkpoint_best.pt"
    assert again.ran == ["teacher"] and converted == [(cell.name, checkpoint)]
    BLEU["teacher"] += 1  # a teacher trained again that is not the recorded one
    try:
        with pytest.raises(UserError, match="is not the recorded one .* --fresh redoes"):
            again.teacher_checkpoint()
    finally:
        BLEU["teacher"] -= 1
    assert again.teacher_result() == results[0]  # the recorded result is kept


def test_p_values_are_kept_in_the_record_and_missing_hypotheses_named(tmp_path):
    study = FakeStudy(_args(tmp_path, record=tmp_path / "none.json"))
    refs = ["a b c"] * 3
    a = {"run": "a", "hyps": "a/hyp.txt", "bleu": 1.0, "seconds": 3.0}
    b = {"run": "b", "hyps": "b/hyp.txt", "bleu": 2.0, "seconds": 4.0}
    assert relaxed_report.paired_bootstrap(study, a, b, refs) is None  # nothing to resample
    study.record.pvalues[relaxed_report.bootstrap_key(a, b)] = 0.125
    assert relaxed_report.paired_bootstrap(study, a, b, refs) == 0.125
    for r, text in ((a, "a b c\na b\na b c\n"), (b, "a b c\na b c\na b c\n")):
        (study.out / r["run"]).mkdir(parents=True)
        (study.out / r["hyps"]).write_text(text, encoding="utf-8")
    c = {**a, "seconds": 5.0}  # run again: another key, resampled
    p = relaxed_report.paired_bootstrap(study, c, b, refs)
    assert 0.0 <= p <= 1.0 and study.record.pvalues[relaxed_report.bootstrap_key(c, b)] == p


def test_the_page_says_which_p_values_are_missing(tmp_path, monkeypatch):
    monkeypatch.setattr(relaxed_report, "paired_bootstrap", lambda *a: None)
    study = FakeStudy(_args(tmp_path))
    results, _ = study.run()
    page = relaxed_report.markdown(results, [], study, "cmd", tmp_path / "p.png")
    assert page.count(relaxed_report.NOT_KEPT) == 2  # under both tables with a p
    assert (
        "Paired bootstrap: 0 of 3 differences reliable (p < 0.05 in every seed), 3 untested "
        "(hypotheses not kept)." in page
    )
    assert "| 2 | 1 | 4 | scratch K | 1 | 21.00 | 15.00 | - |" in page


def test_a_verdict_counts_a_difference_reliable_only_where_every_seed_separates_it(
    tmp_path, monkeypatch
):
    # K=2: p 0.001 in both seeds; K=4: one seed 0.3; K=6: a seed without its hypotheses
    p = {(2, 1): 0.001, (2, 2): 0.001, (4, 1): 0.001, (4, 2): 0.3, (6, 1): 0.01, (6, 2): None}
    monkeypatch.setattr(relaxed_report, "paired_bootstrap", lambda s, a, b, r: p[a["k"], a["seed"]])
    study = FakeStudy(_args(tmp_path))
    results, _ = study.run()
    rows = [r for r in relaxed_report.comparisons(results, study) if r["control"] == "scratch K"]
    assert relaxed_report.reliability(rows, study, []) == (
        "Paired bootstrap: 1 of 3 differences reliable (p < 0.05 in every seed: conversion "
        "ahead at M=1, K=2), 1 not (M=1, K=4), 1 untested (hypotheses not kept)."
    )


def test_teacher_free_runs_what_does_not_need_the_teacher_and_leaves_the_rest(tmp_path, fake):
    first, results = _recorded_study(tmp_path)
    record = json.loads(first.args.record.read_text(encoding="utf-8"))
    record["results"] = [r for r in record["results"] if not r["run"].endswith("/s2")]
    first.args.record.write_text(json.dumps(record), encoding="utf-8")
    study = FakeStudy(_args(tmp_path, record=first.args.record, teacher_free=True))
    found, pending = study.run()
    assert study.ran and all(n.startswith(("scratch/", "total/")) for n in study.ran)
    assert "total/m1-r4/s2" in study.ran and "teacher" not in study.ran  # not trained again
    left = [n for n in pending if n != "(later stages)"]
    assert left and all(n.startswith(("tune/", "rewarmed/")) for n in left)
    assert len(found) + len(left) == len(results)
    with_distill = FakeStudy(_args(tmp_path, record=first.args.record, teacher_free=True,
                                   distill=True))  # fmt: skip
    assert with_distill.needs_teacher(with_distill.scratch_run(1, "4", 2, 2))
    assert not study.needs_teacher(study.scratch_run(1, "4", 2, 2))
    assert not study.needs_teacher(study.teacher_run())


def test_recover_hypotheses_makes_the_untested_runs_again_and_keeps_only_what_reproduces(
    tmp_path, fake, capsys
):
    first, results = _recorded_study(tmp_path)
    kept = first.record.hyps_dir
    for tuned in (kept / "tune").rglob("*.gz"):  # fine-tunings finished before hypotheses were kept
        tuned.unlink()
    args = _args(tmp_path, record=first.args.record, recover_hypotheses=True)
    study = FakeStudy(args)
    found, pending = study.run()
    # the fine-tunings the comparisons use (at the chosen lr; the T + K runs' are kept)
    compared = {f"tune/m1-stepwise-r4/k{k}/lr0.001/s{s}" for k in (2, 4, 6) for s in (1, 2)}
    assert pending == [] and set(study.ran) == compared  # no bootstrap in the record: all of them
    assert all(r["reproduced"] for r in found if r["run"] in compared)
    assert [{k: v for k, v in r.items() if k not in AGAIN} for r in found] == results
    assert all((study.out / r["hyps"]).exists() for r in found if r["run"] in compared)
    out = capsys.readouterr().out
    assert "equal to the recorded run: its hypotheses kept" in out
    made = [r for r in found if r["run"] in compared]  # the log: the recorded and the new time
    assert all(f"{r['seconds']:.0f} s; made again in {r['seconds_again']:.0f} s)" in out
               for r in made)  # fmt: skip
    again = FakeStudy(args)
    assert again.run()[1] == [] and again.ran == []  # here now: nothing made again
    BLEU["fine-tuned"] += 1  # a fine-tuning that does not reproduce its record
    try:
        shutil.rmtree(args.out)
        other = FakeStudy(args)
        found, _ = other.run()
    finally:
        BLEU["fine-tuned"] -= 1
    assert set(other.ran) == compared
    assert "is not the recorded run (bleu: 22.0 against 21.0)" in capsys.readouterr().out
    tuned = [r for r in found if r["run"] in compared]
    assert all(r["bleu"] == 21.0 and r["reproduced"] is False for r in tuned)  # the record stands
    assert not any((other.out / r["hyps"]).exists() for r in tuned)
    assert FakeStudy(args).run() and FakeStudy(args).ran == []  # not made again and again
    late = FakeStudy(_args(tmp_path, record=first.args.record, recover_hypotheses=True))
    shutil.rmtree(args.out)
    found, pending = late.run(deadline=0.0)  # no time: the recorded results, nothing pending
    assert late.ran == [] and pending == [] and len(found) == len(results)


def test_the_other_conversions_at_the_middle_k_run_before_the_main_cells_later_seeds(
    tmp_path, fake
):
    study = FakeStudy(_args(tmp_path, inits=["stepwise", "average"]))
    assert study.run()[1] == []
    ran = study.ran
    other = [n for n in ran if n.startswith("tune/m1-average-r4/")]
    assert [n.split("/")[2] for n in other] == ["k4", "k2", "k6"]  # the middle K first
    middle = ran.index("tune/m1-average-r4/k4/lr0.001/s1")
    assert ran.index("total/m1-r4/s1") < middle  # after the main cells' first seed
    assert middle < min(ran.index(n) for n in ran if n.endswith("/s2"))  # before their second
    assert ran.index("tune/m1-average-r4/k2/lr0.001/s1") > ran.index("total/m1-r4/s2")


def test_the_page_says_where_the_teacher_plateaued_from_its_continued_training(tmp_path, fake):
    study = FakeStudy(_args(tmp_path))
    results, _ = study.run()
    page = relaxed_report.markdown(results, [], study, "cmd", tmp_path / "p.png")
    assert ("it moves by +0.10 sacreBLEU and -1.00 validation perplexity "
            "(K=2: 20.10, 10.00; K=4: 20.10, 10.00; K=6: 20.10, 10.00): by the test the teacher "
            "is at its plateau at T") in page  # fmt: skip
    teacher = {"bleu": 20.0, "valid_ppl": 10.0}
    moving = [{"kind": "teacher continued", "k": 2, "bleu": 20.7, "valid_ppl": 9.5}]
    assert "still moving at T" in relaxed_report.continued_note(teacher, moving)
    assert relaxed_report.continued_note(teacher, []) == ""  # before the runs


def test_a_verdict_says_where_conversion_wins_and_on_which_side_the_bootstrap_separates(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(relaxed_report, "paired_bootstrap", lambda *a: 0.001)
    study = FakeStudy(_args(tmp_path))
    results, _ = study.run()
    for r in results:  # from scratch for T + K loses at K=6 only
        if r["kind"] == "scratch T+K":
            r["points"] = {k: {**v, "bleu": 20.0 if k == "6" else v["bleu"]}
                           for k, v in r["points"].items()}  # fmt: skip
    found = relaxed_report.points(results)
    total = [v for v in relaxed_report.verdicts(relaxed_report.comparisons(found, study), found,
                                                study) if "equal total" in v][0]  # fmt: skip
    assert ("beat only in places the same architecture trained from scratch: higher mean "
            "sacreBLEU in 1 of 3 comparisons, at M=1, K=6 only (") in total  # fmt: skip
    assert ("3 of 3 differences reliable (p < 0.05 in every seed: conversion ahead at M=1, K=6, "
            "conversion behind at M=1, K=2; M=1, K=4).") in total  # fmt: skip


def test_a_teacher_recorded_on_another_machine_is_refused_before_it_is_trained(tmp_path, fake):
    from recurnmt.cli import UserError
    from studies.plan import machine

    first, results = _recorded_study(tmp_path)
    assert all(r["machine"] == machine() for r in results)  # every result says where it ran
    record = json.loads(first.args.record.read_text(encoding="utf-8"))
    record["results"][0]["machine"] = {**machine(), "cpu": "Another CPU", "kernels": "AVX512"}
    first.args.record.write_text(json.dumps(record), encoding="utf-8")
    again = FakeStudy(first.args)
    found, pending = again.run()  # what is recorded is still reused, wherever it was made
    assert pending == [] and again.ran == []
    shown = "trained on another machine .*cpu Another CPU there.*--teacher-free runs the others"
    with pytest.raises(UserError, match=shown):
        again.teacher_checkpoint()
    assert again.ran == []  # refused before training
