"""User errors at the command line end in one line naming the setting (recurnmt.cli)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from recurnmt.cli import UserError, entry_point, run_cli

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
        (
            FileNotFoundError(2, "No such file or directory", "b.pt"),
            "b.pt: No such file or directory",
        ),
        (
            ValueError("refused: --fp16 needs CUDA\n--ddp-backend c10d"),
            "refused: --fp16 needs CUDA",
        ),
    ],
)
def test_user_errors_print_one_line_and_exit_2(capsys, monkeypatch, exc, message):
    monkeypatch.delenv("RECURNMT_TRACEBACK", raising=False)
    assert run_cli(failing(exc), "prog", []) == 2
    first, *more = capsys.readouterr().err.splitlines()
    assert first == f"prog: error: {message}"
    assert all(line.startswith("  ") for line in more)  # further lines: detail, indented


def test_traceback_on_request_and_for_other_errors(monkeypatch):
    monkeypatch.setenv("RECURNMT_TRACEBACK", "1")
    with pytest.raises(ValueError):
        run_cli(failing(ValueError("x")), "prog", [])
    monkeypatch.delenv("RECURNMT_TRACEBACK")
    with pytest.raises(RuntimeError):  # not a user error: keep the traceback
        run_cli(failing(RuntimeError("CUDA error")), "prog", [])
    assert run_cli(lambda argv: None, "prog", []) == 0


def test_exit_status_of_main_and_user_errors_with_detail(capsys, monkeypatch):
    monkeypatch.delenv("RECURNMT_TRACEBACK", raising=False)
    assert run_cli(lambda argv: 3, "prog", []) == 3  # a failed step's status
    assert run_cli(lambda argv: {"top1": 1.0}, "prog", []) == 0

    class Refused(UserError):
        pass

    assert run_cli(failing(Refused("tool refused (exit 1):\nits output")), "prog", []) == 2
    assert capsys.readouterr().err == "prog: error: tool refused (exit 1):\n  its output\n"
    seen = []
    cli = entry_point(lambda argv: seen.append(argv), "prog")
    assert cli(["--x"]) == 0 and seen == [["--x"]]


def test_vision_train_names_an_unknown_model(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "recurnmt.vision.training.train", "--model", "vit_xl"]
        + ["--output", str(tmp_path / "run")],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(
        "python -m recurnmt.vision.training.train: error: unknown vision model"
    )
