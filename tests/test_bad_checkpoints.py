"""Every command that reads a checkpoint, given one that cannot serve, says so in one line.

The commands are setup.cfg's console scripts and the ``python -m recurnmt...`` entry points
(found as ``tests/test_command_errors.py`` finds them), ``scripts/export_equivalence.py``, and
fairseq's own ``fairseq-train``, ``-generate``, ``-validate`` and ``-interactive`` with the
plugin (:mod:`recurnmt.nmt.fairseq_commands`). Each one either says in :data:`READS` where a
checkpoint goes on its command line and which kind it reads, or in :data:`NO_CHECKPOINT` why it
reads none: a new command fails :func:`test_every_command_says_whether_it_reads_a_checkpoint`
until it does. The bad inputs are a missing file, a real checkpoint cut in half, a text file,
and a real checkpoint of the other kind (an image model's where a translation model belongs,
and the other way round; the compatibility fixtures). Each run must end with exit code 2 and a
single stderr line ``PROG: error: ...`` naming the file, and no traceback.

fairseq's commands must also refuse an impossible recurnmt setting before they read any data
(their data directory here does not exist): :func:`test_an_impossible_setting_ends_a_fairseq_command_before_its_data`.

The commands run in this process, as their console scripts or ``python -m`` would run them
(for fairseq's, ``cli_main`` with what the interpreter does with an exception it ends on:
``sys.excepthook``); two real processes check fairseq-train's exit code and
``RECURNMT_TRACEBACK`` end to end.
"""

from __future__ import annotations

import importlib
import logging
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from recurnmt.checkpoint_files import FAIRSEQ, IMAGE
from recurnmt.nmt.quiet import quiet_env
from tests.test_command_errors import console_scripts, discover_commands, run_in_process

REPO = Path(__file__).resolve().parents[1]
COMPAT = REPO / "tests" / "fixtures" / "compat"
REAL = {
    FAIRSEQ: COMPAT / "nmt" / "ringformer_tiny.pt",
    IMAGE: COMPAT / "vision" / "ringformer_vit_mini_patch4.pt",
}
USER_DIR = str(REPO / "user_dir")
FAIRSEQ_COMMANDS = ("fairseq-train", "fairseq-generate", "fairseq-validate", "fairseq-interactive")

# how a command is given a checkpoint: (its file, a scratch folder) -> its arguments
Argv = Callable[[Path, Path], list[str]]


def _scoring(ckpt: Path, tmp: Path) -> list[str]:
    (tmp / "gen.txt").write_text("H-0\t-0.1\thello\nD-0\t-0.1\thello\n", encoding="utf-8")
    (tmp / "ref.txt").write_text("hello\n", encoding="utf-8")
    return [str(tmp / "gen.txt"), "--reference", str(tmp / "ref.txt"), "--checkpoint", str(ckpt),
            "--data", str(tmp)]  # fmt: skip


def _evaluation(ckpt: Path, tmp: Path) -> list[str]:
    return ["--save-dir", str(tmp), "--data", str(tmp), "--dataset", "iwslt14",
            "--average-last", "1", "--checkpoint", str(ckpt)]  # fmt: skip


def _translation_cka(ckpt: Path, tmp: Path) -> list[str]:
    return ["--reference", str(ckpt), str(ckpt), "--data", str(tmp)]


def _image_cka(ckpt: Path, tmp: Path) -> list[str]:
    return ["--vision", "--reference", str(ckpt), str(ckpt), "--data", "digits"]


def _depth_map(ckpt: Path, tmp: Path) -> list[str]:
    return [str(ckpt), "--data", str(tmp)]


def _exits(ckpt: Path, tmp: Path) -> list[str]:
    return ["train", str(ckpt), "--data", str(tmp), "--out", str(tmp / "units.pt")]


def _attention_distance(ckpt: Path, tmp: Path) -> list[str]:
    return ["--checkpoint", str(ckpt), "--no-progress"]


def _to(out: str) -> Argv:
    """``CHECKPOINT OUT``."""
    return lambda ckpt, tmp: [str(ckpt), str(tmp / out)]


def _alone(ckpt: Path, tmp: Path) -> list[str]:
    return [str(ckpt)]


def _vision_train(option: str) -> Argv:
    return lambda ckpt, tmp: [option, str(ckpt), "--output", str(tmp / "run"), "--epochs", "1",
                              "--no-progress", "--no-tensorboard"]  # fmt: skip


def _fairseq(*flags: str) -> Argv:
    """A fairseq command on a data directory that does not exist (the checks come first)."""
    return lambda ckpt, tmp: [str(tmp / "no-data"), "--user-dir", USER_DIR, *flags, str(ckpt)]


_TRAIN = ("--arch", "ringformer_tiny", "--task", "translation", "--cpu", "--max-tokens", "100",
          "--criterion", "recurrent_label_smoothed_cross_entropy", "--teacher-distill", "0.5",
          "--teacher-checkpoint")  # fmt: skip

# command -> {variant: (the kind it reads, its arguments)}
READS: dict[str, dict[str, tuple[str, Argv]]] = {
    "recurnmt-cka": {"translation": (FAIRSEQ, _translation_cka), "--vision": (IMAGE, _image_cka)},
    "recurnmt-attention-distance": {"": (IMAGE, _attention_distance)},
    "recurnmt-depth-map": {"": (FAIRSEQ, _depth_map)},
    "recurnmt-exits": {"": (FAIRSEQ, _exits)},
    "recurnmt-evaluate-nmt": {"": (FAIRSEQ, _evaluation)},
    "recurnmt-convert": {"": (FAIRSEQ, _to("out.pt"))},
    "recurnmt-export-ct2": {"": (FAIRSEQ, _to("ct2"))},
    "python -m recurnmt.analysis.cka": {"": (FAIRSEQ, _translation_cka)},
    "python -m recurnmt.analysis.attention_distance": {"": (IMAGE, _attention_distance)},
    "python -m recurnmt.analysis.depth_map": {"": (FAIRSEQ, _depth_map)},
    "python -m recurnmt.analysis.exits": {"": (FAIRSEQ, _exits)},
    "python -m recurnmt.experiments.averaging": {
        "": (FAIRSEQ, lambda ckpt, tmp: ["--inputs", str(ckpt), "--output", str(tmp / "avg.pt")])
    },
    "python -m recurnmt.experiments.evaluation": {"": (FAIRSEQ, _evaluation)},
    "python -m recurnmt.experiments.scoring": {"": (FAIRSEQ, _scoring)},
    "python -m recurnmt.export": {"": (FAIRSEQ, _to("hf"))},
    "python -m recurnmt.nmt.convert": {"": (FAIRSEQ, _to("out.pt"))},
    "python -m recurnmt.nmt.ct2_export": {"": (FAIRSEQ, _to("ct2"))},
    "python -m recurnmt.vision.convert": {"": (IMAGE, _to("out.pt"))},
    "python -m recurnmt.vision.training.evaluate": {"": (IMAGE, _alone)},
    "python -m recurnmt.vision.training.budget": {"": (IMAGE, _alone)},
    "python -m recurnmt.vision.training.train": {
        "--finetune": (IMAGE, _vision_train("--finetune")),
        "--teacher": (IMAGE, _vision_train("--teacher")),
    },
    "python scripts/export_equivalence.py": {
        "": (FAIRSEQ, lambda ckpt, tmp: [str(ckpt), "--data", str(tmp)])
    },
    "fairseq-train": {"--teacher-checkpoint": (FAIRSEQ, _fairseq(*_TRAIN))},
    "fairseq-generate": {"": (FAIRSEQ, _fairseq("--path"))},
    "fairseq-validate": {
        "": (FAIRSEQ, _fairseq("--task", "translation", "--max-tokens", "100", "--path"))
    },  # fmt: skip
    "fairseq-interactive": {"": (FAIRSEQ, _fairseq("--path"))},
}
NO_CHECKPOINT: dict[str, str] = {
    "recurnmt-params": "architecture names",
    "recurnmt-plot-lrc": "a training log or tensorboard folder",
    "recurnmt-train-nmt": "starts fairseq-train, whose checkpoint options fairseq-train's row covers",
    "recurnmt-run-nmt-recipe": "recipe files; its steps are fairseq's commands and ours",
    "recurnmt-results-nmt": "result.json files",
    "python -m recurnmt.analysis.params": "architecture names",
    "python -m recurnmt.analysis.plot_lrc": "a training log or tensorboard folder",
    "python -m recurnmt.experiments.launch": "starts fairseq-train",
    "python -m recurnmt.experiments.recipe": "recipe files",
    "python -m recurnmt.experiments.results": "result.json files",
}


def former_name(command: str) -> str | None:
    """The command a former ``python -m`` name runs (:func:`recurnmt.cli.run_former_name`)."""
    kind, target = discover_commands().get(command, ("", ""))
    if kind != "module":
        return None
    path = REPO / Path(*target.split("."))
    path = path.with_suffix(".py") if path.with_suffix(".py").is_file() else path / "__main__.py"
    source = path.read_text(encoding="utf-8")
    found = re.search(r'run_former_name\(\s*"[\w.]+",\s*"([\w.]+)"', source)
    return f"python -m {found.group(1)}" if found else None


def commands() -> list[str]:
    """Every command this walk must classify."""
    ours = [
        *console_scripts(),
        *(c for c in discover_commands() if c.startswith("python -m recurnmt")),
    ]
    return [*ours, "python scripts/export_equivalence.py", *FAIRSEQ_COMMANDS]


def test_every_command_says_whether_it_reads_a_checkpoint():
    """A command is in READS or NO_CHECKPOINT (a former name: its new name is walked)."""
    found = [c for c in commands() if former_name(c) is None]
    assert len(found) > 20
    missing = sorted(set(found) - set(READS) - set(NO_CHECKPOINT))
    assert not missing, f"say where these commands read a checkpoint (READS) or why none: {missing}"
    stale = sorted((set(READS) | set(NO_CHECKPOINT)) - set(found))
    assert not stale, f"READS / NO_CHECKPOINT name commands that no longer exist: {stale}"
    assert not set(READS) & set(NO_CHECKPOINT)
    for old in (c for c in commands() if former_name(c)):
        assert former_name(old) in READS or former_name(old) in NO_CHECKPOINT, old


BAD_INPUTS = ("missing", "truncated", "text", "wrong kind")
OTHER = {FAIRSEQ: IMAGE, IMAGE: FAIRSEQ}


def bad_checkpoint(bad: str, kind: str, tmp: Path) -> Path:
    """A checkpoint that cannot serve a command reading ``kind``; its name is in the error."""
    if bad == "missing":
        return tmp / "missing.pt"
    if bad == "truncated":  # a real checkpoint of the kind, cut short (a copy that stopped)
        data = REAL[kind].read_bytes()
        (tmp / "truncated.pt").write_bytes(data[: len(data) // 2])
        return tmp / "truncated.pt"
    if bad == "text":
        (tmp / "notes.pt").write_text("not a checkpoint\n", encoding="utf-8")
        return tmp / "notes.pt"
    return Path(shutil.copy(REAL[OTHER[kind]], tmp / "other_kind.pt"))


def run_fairseq(command: str, argv: list[str], monkeypatch: pytest.MonkeyPatch) -> object:
    """``fairseq-TOOL argv`` as its console script runs it: ``cli_main()``, and an exception
    it ends on handed to ``sys.excepthook`` as the interpreter would; returns the exit code.
    The fairseq command modules it imports are forgotten after it: an imported
    ``fairseq_cli.train`` is how the plugin knows a process trains (recurnmt-train-nmt runs
    fairseq's training in its own process), and the tests after it in this worker do not."""
    imported = set(sys.modules)
    try:
        return _run_fairseq(command, argv, monkeypatch)
    finally:
        for name in set(sys.modules) - imported:
            if name.startswith("fairseq_cli"):
                del sys.modules[name]


def _run_fairseq(command: str, argv: list[str], monkeypatch: pytest.MonkeyPatch) -> object:
    module = importlib.import_module(f"fairseq_cli.{command.removeprefix('fairseq-')}")
    monkeypatch.setattr(sys, "argv", [command, *argv])
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        module.cli_main()
    except SystemExit as exit_:
        return exit_.code
    except BaseException:
        try:
            sys.excepthook(*sys.exc_info())
        except SystemExit as exit_:
            return exit_.code
        return 1  # the interpreter's code after a traceback
    finally:  # fairseq's commands configure the root logger
        root.handlers[:], root.level = handlers, level
    return 0


def run(command: str, argv: list[str], monkeypatch: pytest.MonkeyPatch) -> object:
    if command in FAIRSEQ_COMMANDS:
        return run_fairseq(command, argv, monkeypatch)
    return run_in_process(command, argv, monkeypatch)


def assert_one_line(code: object, err: str, named: str) -> None:
    assert code == 2, f"exit code {code!r}, stderr:\n{err}"
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert re.match(r"[\w./ -]+: error: \S", lines[0]), lines[0]  # PROG: error: MESSAGE
    assert named in lines[0], f"the error does not name {named!r}: {lines[0]}"


CASES = [
    pytest.param(command, variant, bad, id=f"{command}{f' {variant}' if variant else ''}-{bad}")
    for command, variants in READS.items()
    for variant in variants
    for bad in BAD_INPUTS
]


@pytest.mark.parametrize(("command", "variant", "bad"), CASES)
def test_a_checkpoint_that_cannot_serve_ends_in_one_line(
    command, variant, bad, tmp_path, monkeypatch, capsys
):
    monkeypatch.delenv("RECURNMT_TRACEBACK", raising=False)
    kind, argv = READS[command][variant]
    ckpt = bad_checkpoint(bad, kind, tmp_path)
    code = run(command, argv(ckpt, tmp_path), monkeypatch)
    assert_one_line(code, capsys.readouterr().err, ckpt.name)


def _generate(*flags: str) -> list[str]:
    return ["no-data", "--user-dir", USER_DIR, "--path", str(REAL[FAIRSEQ]), *flags]


SPECULATIVE = ("--task", "speculative_translation")
IMPOSSIBLE = [  # (command, arguments, what the error names)
    ("fairseq-train", ["--decoder-levels", "0"], "--decoder-levels=0"),
    ("fairseq-train", ["--encoder-unique-layers", "5", "--encoder-levels", "3"],
     "--encoder-unique-layers=5"),
    ("fairseq-train", ["--level-signal-rank", "-1"], "--level-signal-rank=-1"),
    ("fairseq-train", ["--checkpoint-segment", "2"], "--checkpoint-segment"),
    ("fairseq-train", ["--criterion", "recurrent_label_smoothed_cross_entropy",
                       "--teacher-distill", "1.5"], "--teacher-distill=1.5"),
    ("fairseq-generate", _generate("--model-overrides", "{'decoder_levels': 0}"),
     "--decoder-levels=0"),
    ("fairseq-generate", _generate(*SPECULATIVE, "--draft-levels", "5", "--beam", "1"),
     "--draft-levels=5"),
    ("fairseq-generate", _generate(*SPECULATIVE, "--draft-levels", "1"), "--beam 5"),
    ("fairseq-generate", _generate(*SPECULATIVE, "--draft-levels", "1", "--beam", "1",
                                   "--draft-tokens", "0"), "--draft-tokens=0"),
    ("fairseq-generate", _generate(*SPECULATIVE, "--draft-levels", "1", "--static-decoding"),
     "--static-decoding"),
    ("fairseq-validate", _generate("--task", "translation", "--max-tokens", "100",
                                   "--model-overrides", "{'encoder_levels': 7}"),
     "--encoder-levels=7"),
    ("fairseq-interactive", _generate("--model-overrides", "{'level_signal_rank': -1}"),
     "--level-signal-rank=-1"),
]  # fmt: skip
_TRAIN_BASE = ["no-data", "--user-dir", USER_DIR, "--arch", "ringformer_tiny", "--task",
               "translation", "--cpu", "--max-tokens", "100"]  # fmt: skip


@pytest.mark.parametrize(
    ("command", "argv", "named"), IMPOSSIBLE, ids=[f"{c} {named}" for c, _, named in IMPOSSIBLE]
)
def test_an_impossible_setting_ends_a_fairseq_command_before_its_data(
    command, argv, named, tmp_path, monkeypatch, capsys
):
    """The data directory does not exist: a check that came after the data would not be
    reached (fairseq's FileNotFoundError and its traceback instead)."""
    monkeypatch.delenv("RECURNMT_TRACEBACK", raising=False)
    monkeypatch.chdir(tmp_path)
    argv = [*_TRAIN_BASE, *argv] if command == "fairseq-train" else argv
    code = run_fairseq(command, argv, monkeypatch)
    assert_one_line(code, capsys.readouterr().err, named)


def _real_fairseq_train(tmp: Path, env_extra: dict[str, str]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "RECURNMT_TRACEBACK"}
    env = quiet_env({**env, **env_extra, "PYTHONPATH": str(REPO)})  # torch's import notice
    script = Path(sys.executable).parent / "fairseq-train"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "fairseq_cli.train"]
    return subprocess.run(
        [*command, *_TRAIN_BASE, "--decoder-levels", "0"],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_real_fairseq_train_exits_2_and_shows_the_traceback_on_request(tmp_path):
    plain = _real_fairseq_train(tmp_path, {})
    assert plain.returncode == 2, plain.stderr
    assert plain.stderr == "fairseq-train: error: --decoder-levels=0: must be a positive integer\n"
    traced = _real_fairseq_train(tmp_path, {"RECURNMT_TRACEBACK": "1"})
    assert traced.returncode == 1 and "Traceback" in traced.stderr
    assert "ConfigError: --decoder-levels=0" in traced.stderr


def _refused_object(path: Path) -> None:
    import argparse

    import torch

    torch.save({"parser": argparse.ArgumentParser}, path)  # a class weights-only refuses


def _bare_dict(path: Path) -> None:
    import torch

    torch.save({"weights": torch.zeros(2)}, path)


@pytest.mark.parametrize(
    ("make", "kind", "message"),
    [
        (lambda p: p.mkdir(), FAIRSEQ, "is a directory, not a checkpoint file"),
        (lambda p: p.write_bytes(b""), IMAGE, "is not an image model's checkpoint: an empty file"),
        (lambda p: p.write_bytes(b"\x00\x01garbage"), None,
         "is not a checkpoint: not a file torch.save wrote"),
        (_refused_object, FAIRSEQ, "holds an object of argparse.ArgumentParser, which recurnmt "
         "does not unpickle"),
        (_bare_dict, FAIRSEQ, "is not a fairseq checkpoint: it holds a dict of weights"),
    ],
    ids=["directory", "empty", "binary", "refused object", "no configuration"],
)  # fmt: skip
def test_the_reader_says_what_a_file_is(make, kind, message, tmp_path):
    from recurnmt.checkpoint_files import CheckpointError, read_checkpoint_file

    path = tmp_path / "file.pt"
    make(path)
    with pytest.raises(CheckpointError) as err:
        read_checkpoint_file(path, kind, mmap=True)
    assert str(err.value).startswith(f"{path} {message}")
    assert read_checkpoint_file(REAL[FAIRSEQ], FAIRSEQ, mmap=True)["args"].arch == "ringformer_tiny"
