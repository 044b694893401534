"""Reading LRC coefficients back from fairseq logs and plotting them."""

from __future__ import annotations

import json

import pytest

from recurnmt.analysis.plot_lrc import plot, read_log, read_series

SIMPLE = (
    "2026-11-22 00:21:00 | INFO | train_inner | epoch 001:  2 / 9 loss=9.1, "
    "lrc_enc_b0_self_attn_main=1.002, lrc_enc_b0_self_attn_skip=0.998, num_updates={n}, lr=0.001"
)


def test_simple_and_json_formats(tmp_path):
    log = tmp_path / "train.log"
    record = {"epoch": 1, "loss": "9.0", "lrc_enc_b0_ffn_main": "1.01", "num_updates": "3"}
    log.write_text(
        SIMPLE.format(n=1) + "\n" + SIMPLE.format(n=2) + "\n"
        "2026-11-22 | INFO | valid | epoch 001 | loss 9 | num_updates 2\n"
        f"2026-11-22 | INFO | train_inner | {json.dumps(record)}\n"
    )
    series = read_log(log)
    assert series["lrc_enc_b0_self_attn_main"] == [(1, 1.002), (2, 1.002)]
    assert series["lrc_enc_b0_ffn_main"] == [(3, 1.01)]


def test_plot_writes_a_png(tmp_path):
    out = plot(
        {"lrc_enc_b0_ffn_main": [(1, 1.0), (2, 1.1)], "lrc_enc_b0_ffn_skip": [(1, 1.0), (2, 0.9)]},
        tmp_path / "x.png",
    )
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_log_without_coefficients_is_refused(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("nothing here\n")
    with pytest.raises(ValueError, match="no lrc_"):
        read_series(log)
