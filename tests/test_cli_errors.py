"""User errors at the command line end in one line naming the setting (recurnmt.cli)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from recurnmt.cli import run_cli

REPO = Path(__file__).resolve().parents[1]


def failing(exc: BaseException):
    def main(argv: list[str]) -> None:
        raise exc

    return main


@pytest.mark.parametrize(
    ("exc", "message"),
    [
        (
            ValueError("rank=300 is larger than the width 256"),
            "rank=300 is larger than the width 256",
        ),
        (KeyError("unknown vision model 'vit_xl'"), "unknown vision model 'vit_xl'"),
        (FileNotFoundError("best.pt does not exist"), "best.pt does not exist"),
    ],
)
def test_user_errors_print_one_line_and_exit_2(capsys, monkeypatch, exc, message):
    monkeypatch.delenv("RECURNMT_TRACEBACK", raising=False)
    assert run_cli(failing(exc), "prog", []) == 2
    assert capsys.readouterr().err == f"prog: error: {message}\n"


def test_traceback_on_request_and_for_other_errors(monkeypatch):
    monkeypatch.setenv("RECURNMT_TRACEBACK", "1")
    with pytest.raises(ValueError):
        run_cli(failing(ValueError("x")), "prog", [])
    monkeypatch.delenv("RECURNMT_TRACEBACK")
    with pytest.raises(RuntimeError):  # not a user error: keep the traceback
        run_cli(failing(RuntimeError("CUDA error")), "prog", [])
    assert run_cli(lambda argv: None, "prog", []) == 0


def test_vision_train_names_an_unknown_model(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "recurnmt.vision.train", "--model", "vit_xl"]
        + ["--output", str(tmp_path / "run")],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("python -m recurnmt.vision.train: error: unknown vision model")
