"""scripts/ut_table4.py: one setting for every row, the table and plot read from the logs."""

from __future__ import annotations

import json
from pathlib import Path

from tests.script_modules import load_script


def _script():
    return load_script("ut_table4")


def test_rows_share_the_setting_and_differ_only_in_their_own_flags(tmp_path):
    t4 = _script()
    base = t4.command(t4.ROWS[0], tmp_path, tmp_path / "run")
    assert base[base.index("--warmup-updates") + 1] == "400"
    assert base[base.index("--encoder-attention-heads") + 1] == "4"
    assert base[base.index("--max-tokens") + 1] == "4096"
    assert "--encoder-normalize-before" not in base  # post-LN unless a row says otherwise
    for row in t4.ROWS:
        cmd = t4.command(row, tmp_path, tmp_path / "run")
        assert cmd[cmd.index("--arch") + 1] == row.arch
        assert cmd[cmd.index("--max-update") + 1] == str(row.updates)
        tail = cmd[len(cmd) - len(row.flags) :] if row.flags else []
        assert tail == list(row.flags)  # later flags win in fairseq
        rest = cmd[: len(cmd) - len(row.flags)]
        assert [a for a in rest if a not in (row.arch, str(row.updates))] == [
            a for a in base if a not in (t4.ROWS[0].arch, "800")
        ]


def _log(path: Path, ppl: list[float], valid: list[float]) -> None:
    lines = [
        '2026-11-27 00:00:00 | INFO | train_inner | {"epoch": 1, "loss": "9", '
        f'"ppl": "{p}", "num_updates": "{50 * (i + 1)}"}}'
        for i, p in enumerate(ppl)
    ]
    lines += [
        f'2026-11-27 00:00:00 | INFO | valid | {{"epoch": {i + 1}, "valid_ppl": "{v}"}}'
        for i, v in enumerate(valid)
    ]
    path.parent.mkdir(parents=True)
    path.write_text("\n".join([*lines, "done training in 1.0 seconds"]) + "\n")


def test_table_and_plot_from_the_logs(tmp_path, monkeypatch):
    t4 = _script()
    rows = [t4.ROWS[0], t4.ROWS[2], t4.ROWS[4]]
    out = tmp_path / "runs"
    _log(out / rows[0].name / "train.log", [900.0, 300.0], [280.0, 100.0, 50.0])
    _log(out / rows[1].name / "train.log", [950.0, 420.0], [430.0, 380.0, 300.0])
    _log(out / rows[2].name / "train.log", [940.0, 410.0], [400.0, 390.0])
    assert all(t4.finished(out / r.name / "train.log") for r in rows)
    monkeypatch.setattr(t4, "ROWS", tuple(rows))
    doc = tmp_path / "doc" / "t4.md"
    t4.main(["--out", str(out), "--doc", str(doc)])  # every run finished: nothing runs
    text = doc.read_text()
    assert "| fairseq `transformer` | 800 | 280.0 | 100.0 | 50.0 | 1.00 |" in text
    assert "| 800 | 430.0 | 380.0 | 300.0 | 6.00 |" in text
    assert "| 300 | 400.0 | - | 390.0 | - |" in text  # a shorter row: no ratio
    assert "fairseq-train data-bin/lohelp_de_en_spm4000 --user-dir user_dir" in text
    assert doc.with_suffix(".png").stat().st_size > 0
    saved = json.loads(doc.with_suffix(".json").read_text())
    assert saved[0]["train"] == [[50, 900.0], [100, 300.0]]
