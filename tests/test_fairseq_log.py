"""recurnmt.experiments.fairseq_log: one reader for fairseq's json, simple and tqdm log lines;
recurnmt.experiments.commands: the one spelling of fairseq-train / fairseq-generate command lines."""

from __future__ import annotations

import json

from recurnmt.experiments import fairseq_log
from recurnmt.experiments.commands import generate_command, train_command, user_dir

STAMP = "2026-11-23 17:00:00 | INFO"


def _log(tmp_path, *lines: str):
    path = tmp_path / "train.log"
    path.write_text("".join(f"{STAMP} | {line}\n" for line in lines), encoding="utf-8")
    return path


def test_the_three_formats_read_alike(tmp_path):
    train_json = {"epoch": 2, "train_loss": "8.5", "train_wps": "1234.5", "train_wall": "60"}
    log = _log(
        tmp_path,
        'train_inner | {"epoch": 1, "loss": "9.1", "ppl": "300.5", "num_updates": "25"}',
        "train_inner | epoch 001:  2 / 9 loss=9.0, ppl=290.1, num_updates=50, lr=0.001",
        f"train | {json.dumps(train_json)}",
        'valid | {"epoch": 2, "valid_loss": "5.1", "valid_ppl": "15.5"}',
        "valid | epoch 002 | valid on 'valid' subset | loss 5.0 | ppl 14.93 | num_updates 50",
        "fairseq.trainer | not statistics {",
    )
    inner = fairseq_log.log_records(log, "train_inner")
    assert [r["num_updates"] for r in inner] == ["25", "50"]
    assert fairseq_log.train_stats(log) == {"num_updates": 50.0, "loss": 9.0, "ppl": 290.1}
    assert fairseq_log.epoch_stats(log) == {2: {"loss": 8.5, "wps": 1234.5, "wall": 60.0}}
    assert [r["ppl"] for r in fairseq_log.log_records(log, "valid")] == ["15.5", "14.93"]
    assert fairseq_log.valid_ppl(log) == 14.93
    assert fairseq_log.last_valid_stats(log)["num_updates"] == "50"


def test_a_log_without_statistics_reads_as_nothing(tmp_path):
    log = _log(tmp_path, "fairseq_cli.train | done training in 3.0 seconds")
    assert fairseq_log.valid_ppl(log) is None
    assert fairseq_log.train_stats(log) == {} and fairseq_log.epoch_stats(log) == {}
    assert fairseq_log.generation_speed(log) is None


def test_generation_speed(tmp_path):
    log = _log(
        tmp_path,
        "fairseq_cli.generate | Translated 1,555 sentences (33,982 tokens) in 33.6s "
        "(46.22 sentences/s, 1010.01 tokens/s)",
    )
    assert fairseq_log.generation_speed(log) == {
        "sentences": 1555,
        "tokens": 33982,
        "seconds": 33.6,
        "sentences_per_s": 46.22,
        "tokens_per_s": 1010.01,
    }


def test_command_lines_name_the_data_the_plugin_and_the_model_first():
    train = train_command("DATA", "ringformer_tiny", ["--lr", "1"])
    assert "fairseq" in " ".join(train[: train.index("DATA")])
    assert train[train.index("DATA") :] == [
        "DATA", "--user-dir", str(user_dir()), "--arch", "ringformer_tiny", "--lr", "1",
    ]  # fmt: skip
    assert train_command("DATA", "x", start=())[:2] == ["DATA", "--user-dir"]
    generate = generate_command("DATA", "ckpt.pt", ["--beam", "4"])
    assert generate[generate.index("DATA") :] == [
        "DATA", "--user-dir", str(user_dir()), "--path", "ckpt.pt", "--beam", "4",
    ]  # fmt: skip
