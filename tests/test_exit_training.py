"""recurnmt-exits (issue 74 item 2): the classifier test's units trained on CALM's oracle labels,
a threshold calibrated on valid against full-depth decoding, and the tests' own cost.

The model is an untrained recurrent_transformer whose levels after the first are quiet (their
residual branches scaled down, as tests/test_speculative.py's drafts), over sentences of four
words: level 1's argmax is mostly the full depth's, and where it is not depends on the decoder's
input in a way a linear unit can read, so the labels are learnable.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch

from recurnmt.analysis.exit_calibration import Point, agreement, choose
from recurnmt.analysis.exit_training import ALWAYS, auc, score_units, train_units
from recurnmt.analysis.exits import cli, main
from recurnmt.analysis.nmt_inputs import load_nmt_models, translation_batches
from recurnmt.modules.decoding.exits import ExitClassifier
from tests.nmt_helpers import DICT, build, train_signals
from tests.test_bad_checkpoints import run_fairseq
from tests.test_depth_map import SMALL
from tests.test_speculative import _quiet_deep_levels

REPO = Path(__file__).resolve().parents[1]
WORDS = 4
SPLITS = {"train": (80, 1), "valid": (16, 2), "test": (6, 3)}  # sentences, seed


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Binarized train, valid and test subsets of random sentences over four words."""
    from fairseq.data import indexed_dataset

    root = tmp_path_factory.mktemp("exits_data")
    for lang in ("src", "tgt"):
        DICT.save(str(root / f"dict.{lang}.txt"))
    for split, (sentences, seed) in SPLITS.items():
        g = torch.Generator().manual_seed(seed)
        for lang in ("src", "tgt"):
            stem = str(root / f"{split}.src-tgt.{lang}")
            builder = indexed_dataset.make_builder(stem + ".bin", "mmap", vocab_size=len(DICT))
            for _ in range(sentences):
                length = int(torch.randint(3, 9, (1,), generator=g))
                words = torch.randint(DICT.nspecial, DICT.nspecial + WORDS, (length,), generator=g)
                builder.add_item(torch.cat([words, torch.tensor([DICT.eos()])]))
            builder.finalize(stem + ".idx")
    return root


def save_checkpoint(path: Path, data: Path, arch: str = "recurrent_transformer_tiny",
                    *flags: str, quiet: float | None = 0.6) -> Path:  # fmt: skip
    """An untrained checkpoint in fairseq's format, its levels after the first quiet."""
    torch.manual_seed(0)
    model, args, _ = build(arch, *SMALL, *(flags or ("--decoder-layers", "3")))
    train_signals(model)
    if quiet is not None:
        _quiet_deep_levels(model, 1, quiet)
    args.data = str(data)
    history = [{"criterion_name": "x", "optimizer_name": "x", "lr_scheduler_state": {}}]
    state = {"args": args, "model": model.state_dict(), "optimizer_history": history}
    torch.save({**state, "extra_state": {"epoch": 1}}, path)
    return path


@pytest.fixture(scope="module")
def checkpoint(data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_checkpoint(tmp_path_factory.mktemp("exits_model") / "m.pt", data)


@pytest.fixture(scope="module")
def units_file(checkpoint: Path, data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("exits_units") / "units.pt"
    main(["train", str(checkpoint), "--data", str(data), "--out", str(out), "--epochs", "10",
          "--lr", "0.1", "--max-tokens", "200"])  # fmt: skip
    return out


# ------------------------------------------------------------------------------ the pieces


def test_auc_is_the_share_of_positive_negative_pairs_ranked_right():
    g = torch.Generator().manual_seed(0)
    scores = torch.randint(0, 5, (40,), generator=g).float()  # ties
    labels = torch.rand(40, generator=g) < 0.4
    pos, neg = scores[labels].tolist(), scores[~labels].tolist()
    slow = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg) / (len(pos) * len(neg))
    assert auc(scores, labels) == pytest.approx(slow)
    assert math.isnan(auc(scores, torch.ones(40, dtype=torch.bool)))


def test_agreement_is_position_by_position_over_the_full_depths_tokens():
    full = {0: [5, 6, 7, 2], 1: [8, 2], 2: [4, 4, 2]}
    hyps = {0: [5, 6, 9, 2], 1: [8, 2], 2: [4, 2]}  # one token off; identical; shorter
    tokens, identical = agreement(hyps, full)
    assert tokens == pytest.approx((3 + 2 + 1) / 9)
    assert identical == pytest.approx(1 / 3)
    assert agreement(full, full) == (1.0, 1.0)


def test_choose_takes_the_cheapest_threshold_meeting_the_agreement():
    points = [Point(0.9, 1.0, 1.0, 2.8, 1), Point(0.5, 0.995, 0.9, 2.1, 1),
              Point(0.3, 0.97, 0.5, 1.4, 1)]  # fmt: skip
    assert choose(points, 0.99) is points[1]
    assert choose(points, 0.9) is points[2]
    assert choose(points, 1.0) is points[0]
    assert choose(points[2:], 0.99) is None


def test_the_units_separate_agreeing_tokens_on_held_out_data(checkpoint, data):
    models, _, task = load_nmt_models([checkpoint], data, torch.device("cpu"))
    model = models[0]
    for p in model.parameters():
        p.requires_grad_(False)
    train = translation_batches(task, "train", None, max_tokens=200)
    valid = translation_batches(task, "valid", None, 64)
    pad = task.target_dictionary.pad()
    units = train_units(model, train, pad, epochs=10, lr=0.1, seed=1)
    again = train_units(model, train, pad, epochs=10, lr=0.1, seed=1)
    assert torch.equal(units.weight, again.weight)  # deterministic for a seed
    assert units.bias[-1] == ALWAYS and not units.weight[-1].any()  # level N: always exits
    scores = score_units(model, units, valid, pad)
    assert 0.5 < scores.agreement[0] < 0.95  # both labels occur: not vacuous
    assert all(a > 0.75 for a in scores.auc), scores.auc  # chance is 0.5
    assert scores.accuracy[0] > scores.agreement[0]  # better than always saying "exit"


# ------------------------------------------------------------------------------ the command


@pytest.mark.e2e
def test_train_writes_units_that_fairseq_generate_decodes_with(
    units_file, checkpoint, data, monkeypatch, capsys
):
    units, about = ExitClassifier.load(units_file)
    assert units.num_levels == about["levels"] == 3 and about["embed_dim"] == 16
    assert about["checkpoint"] == str(checkpoint) and about["subset"] == "train"
    assert [row["level"] for row in about["per_level"]] == [1, 2]
    assert all(0 <= row["accuracy"] <= 1 for row in about["per_level"])
    capsys.readouterr()
    argv = [str(data), "--path", str(checkpoint), "--user-dir", str(REPO / "user_dir"),
            "--gen-subset", "valid", "--beam", "2", "--max-len-b", "10", "--cpu",
            "--task", "speculative_translation", "--exit-test", "classifier",
            "--exit-classifier", str(units_file), "--exit-threshold", "0.5"]  # fmt: skip
    assert run_fairseq("fairseq-generate", argv, monkeypatch) == 0
    out = capsys.readouterr()
    assert len(re.findall(r"^H-\d+\t", out.out, flags=re.M)) == SPLITS["valid"][0]


@pytest.mark.e2e
def test_calibrate_meets_the_agreement_on_valid(units_file, checkpoint, data, tmp_path, capsys):
    out = tmp_path / "cal"
    report = main(["calibrate", str(checkpoint), "--data", str(data), "--exit-test",
                   "classifier", "--exit-classifier", str(units_file), "--agreement", "0.9",
                   "--beam", "2", "--max-len-b", "10", "--thresholds", "0.5", "0.9999", "0.99",
                   "--out", str(out)])  # fmt: skip
    written = json.loads((out / "calibration.json").read_text(encoding="utf-8"))
    assert written == json.loads(json.dumps(report))
    assert [p["threshold"] for p in written["points"]] == [0.9999, 0.99, 0.5]  # conservative first
    assert written["full_depth"]["mean_levels"] == 3 and written["subset"] == "valid"
    chosen = written["chosen_threshold"]
    assert chosen is not None
    point = next(p for p in written["points"] if p["threshold"] == chosen)
    assert point["agreement"] >= 0.9
    assert all(p["mean_levels"] >= point["mean_levels"] for p in written["points"]
               if p["agreement"] >= 0.9)  # fmt: skip
    assert all(1 <= p["mean_levels"] <= 3 and 0 <= p["identical"] <= 1 for p in written["points"])
    assert set(written["cost"]["tests"]) == {"margin", "saturation", "classifier"}
    for cost in written["cost"]["tests"].values():
        assert cost["mean_levels"] == 3 and cost["test_calls"] > 0  # +inf: nobody exits
    assert (out / "calibration.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| threshold | agreement |" in (out / "calibration.md").read_text(encoding="utf-8")
    printed = capsys.readouterr().out
    assert f"--exit-test classifier --exit-threshold {chosen:g}" in printed


@pytest.mark.e2e
def test_calibrate_the_margin_test_on_its_own_grid(checkpoint, data, tmp_path):
    report = main(["calibrate", str(checkpoint), "--data", str(data), "--exit-test", "margin",
                   "--agreement", "0.99", "--beam", "1", "--max-len-b", "8", "--max-sentences",
                   "6", "--no-cost", "--out", str(tmp_path)])  # fmt: skip
    thresholds = [p["threshold"] for p in report["points"]]
    assert thresholds == sorted(thresholds, reverse=True) and len(thresholds) > 5
    assert report["cost"] is None and report["sentences"] == 6
    # the loosest margin lets rows go at level 1 more often than the strictest
    assert report["points"][-1]["mean_levels"] <= report["points"][0]["mean_levels"]


# ------------------------------------------------------------------------------ refusals


def _one_line_error(capsys, argv: list[str]) -> str:
    assert cli(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("recurnmt-exits: error: "), err
    return err[0]


def test_calibrating_on_the_test_set_is_refused(checkpoint, data, capsys):
    line = _one_line_error(capsys, ["calibrate", str(checkpoint), "--data", str(data),
                                    "--exit-test", "margin", "--subset", "test"])  # fmt: skip
    assert "--subset test: a threshold is never calibrated on the test set" in line


def test_bad_inputs_are_refused_in_one_line(checkpoint, data, tmp_path, capsys):
    (tmp_path / "units.pt").write_text("not units\n", encoding="utf-8")
    good = checkpoint.read_bytes()
    (tmp_path / "cut.pt").write_bytes(good[: len(good) // 2])
    train = ["train", "--data", str(data), "--out", str(tmp_path / "u.pt")]
    cal = ["calibrate", str(checkpoint), "--data", str(data)]
    for argv, says in (
        ([*train, str(tmp_path / "gone.pt")], "gone.pt does not exist"),
        ([*train, str(tmp_path / "cut.pt")], "cut.pt"),
        ([*train, str(checkpoint), "--subset", "test"], "--subset test"),
        ([*train, str(checkpoint), "--epochs", "0"], "--epochs 0"),
        ([*cal, "--exit-test", "classifier", "--exit-classifier", str(tmp_path / "units.pt")],
         "--exit-classifier"),
        ([*cal, "--exit-test", "classifier"], "needs --exit-classifier"),
        ([*cal, "--exit-test", "patience"], "--exit-test patience"),
        ([*cal, "--exit-test", "margin", "--min-exit-level", "3"], "--min-exit-level"),
        ([*cal, "--exit-test", "margin", "--thresholds", "1.5"], "--thresholds 1.5"),
        ([*cal, "--exit-test", "margin", "--agreement", "0"], "--agreement 0"),
    ):  # fmt: skip
        line = _one_line_error(capsys, argv)
        assert says in line, (argv, line)


def test_a_classifier_of_another_depth_is_refused(checkpoint, data, tmp_path, capsys):
    ExitClassifier(5, 16).save(tmp_path / "five.pt", levels=5)
    line = _one_line_error(capsys, ["calibrate", str(checkpoint), "--data", str(data),
                                    "--exit-test", "classifier", "--exit-classifier",
                                    str(tmp_path / "five.pt")])  # fmt: skip
    assert "--exit-classifier" in line and "units for 5 levels, the decoder has 3" in line


@pytest.mark.parametrize(
    "arch, flags, says",
    [
        ("universal_transformer_act_tiny", (), "ACT (--act on)"),
        ("transformer", ("--decoder-layers", "2"), "not a recurnmt recurrent decoder"),
    ],
)
def test_act_and_other_decoders_are_refused(data, tmp_path, capsys, arch, flags, says):
    path = save_checkpoint(tmp_path / "m.pt", data, arch, *flags, quiet=None)
    line = _one_line_error(capsys, ["train", str(path), "--data", str(data), "--out",
                                    str(tmp_path / "u.pt")])  # fmt: skip
    assert says in line and "exit units" in line
    assert not (tmp_path / "u.pt").exists()
