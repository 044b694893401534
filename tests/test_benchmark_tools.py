"""recurnmt.analysis.benchmark: the table and worker plumbing of the benchmark scripts."""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path

import pytest

from recurnmt.analysis.benchmark import (
    Column,
    WorkerError,
    forward_flags,
    ratio_table,
    run_workers,
)


def test_ratio_table_divides_by_the_first_row():
    rows = [
        {"arch": "base", "speed": 100.0, "params": 2e6},
        {"arch": "ours", "speed": 150.0, "params": 1e6},
    ]
    table = ratio_table(
        rows,
        "arch",
        [
            Column("speed", "speed", ".0f"),
            Column("params", "params", ".1f", ratio=False, scale=1e6, suffix="M"),
        ],
    )
    header, rule, base, ours = table.splitlines()
    assert header.split() == ["arch", "speed", "ratio", "params"]
    assert len(rule) == len(header)
    assert base.split() == ["base", "100", "1.00", "2.0M"]
    assert ours.split() == ["ours", "150", "1.50", "1.0M"]


def test_workers_run_in_their_own_processes(tmp_path: Path):
    script = tmp_path / "worker.py"
    script.write_text(
        textwrap.dedent(
            """
            import os, sys
            from recurnmt.analysis.benchmark import emit
            name = sys.argv[2]
            if name == "bad":
                sys.exit("no such model")
            emit({"name": name, "pid": os.getpid(), "flag": sys.argv[3]})
            """
        )
    )
    flags = forward_flags(argparse.Namespace(embed_dim=8), ["embed_dim"])
    assert flags == ["--embed-dim=8"]
    cwd = Path(__file__).resolve().parents[1]
    a, b = run_workers(script, "--model", ["a", "b"], flags, cwd)
    assert (a["name"], b["name"], a["flag"]) == ("a", "b", "--embed-dim=8")
    assert a["pid"] != b["pid"]
    with pytest.raises(WorkerError, match="worker bad failed.*\n.*no such model"):
        run_workers(script, "--model", ["bad"], flags, cwd)
