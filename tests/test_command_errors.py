"""Every command ends a user error the same way: one ``PROG: error:`` line, exit code 2.

The commands are discovered, not listed: every console script of ``setup.cfg`` and every
``python -m`` entry point (a module of ``recurnmt/`` or ``data_prep/`` with an
``if __name__ == "__main__":`` block, or a package's ``__main__.py``) and every script of
``scripts/`` with such a block (``python scripts/NAME.py``, or ``python -m scripts.NAME`` where
its ``PROG`` says so) or package of ``scripts/`` with a ``__main__.py`` (``python -m
scripts.NAME``). :data:`BAD_INPUTS` gives each a bad setting or a missing file;
a new command without an entry there fails :func:`test_every_command_has_a_bad_input`.

They run in this process (``runpy``, as ``python -m`` and ``python script.py`` would, or the
console-script function), so the whole check takes seconds; two real processes check the exit
code and ``RECURNMT_TRACEBACK`` end to end.
"""

from __future__ import annotations

import ast
import configparser
import importlib
import os
import re
import runpy
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MODULE_ROOTS = ("recurnmt", "data_prep")


def console_scripts() -> dict[str, str]:
    """``{script name: "module:function"}`` from setup.cfg."""
    parser = configparser.ConfigParser()
    parser.read(REPO / "setup.cfg")
    lines = parser["options.entry_points"]["console_scripts"].strip().splitlines()
    return dict(tuple(part.strip() for part in line.split("=", 1)) for line in lines)


def has_main_block(path: Path) -> bool:
    """The file has a top-level ``if __name__ == "__main__":``."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Compare):
            sides = [node.test.left, *node.test.comparators]
            names = {s.id for s in sides if isinstance(s, ast.Name)}
            values = {s.value for s in sides if isinstance(s, ast.Constant)}
            if names == {"__name__"} and values == {"__main__"}:
                return True
    return False


def discover_commands() -> dict[str, tuple[str, str]]:
    """``{command: (kind, target)}``; kinds ``console``, ``module`` and ``script``."""
    commands = {name: ("console", target) for name, target in console_scripts().items()}
    for root in MODULE_ROOTS:
        for path in sorted((REPO / root).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            if path.name == "__main__.py":
                commands[f"python -m {'.'.join(parts[:-1])}"] = ("module", ".".join(parts[:-1]))
            elif path.name != "__init__.py" and has_main_block(path):
                commands[f"python -m {'.'.join(parts)}"] = ("module", ".".join(parts))
    for path in sorted((REPO / "scripts").glob("*/__main__.py")):
        module = f"scripts.{path.parent.name}"
        commands[f"python -m {module}"] = ("module", module)
    for path in sorted((REPO / "scripts").glob("*.py")):
        if has_main_block(path):
            module = f"scripts.{path.stem}"
            if f'PROG = "python -m {module}"' in path.read_text(encoding="utf-8"):
                commands[f"python -m {module}"] = ("module", module)
            else:
                commands[f"python scripts/{path.name}"] = ("script", str(path))
    return commands


# --- a bad setting or a missing file for every command -------------------------------------------
# each entry: tmp_path -> (argv, what the error line must name)

BadInput = Callable[[Path], tuple[list[str], str]]


def _missing(name: str) -> BadInput:
    """A positional path that does not exist."""
    return lambda tmp: ([str(tmp / name)], name)


def _nmt_evaluate(tmp: Path) -> tuple[list[str], str]:
    (tmp / "ref.txt").write_text("a reference\n", encoding="utf-8")
    return [str(tmp / "gen.txt"), "--reference", str(tmp / "ref.txt")], "gen.txt"


def _launch(tmp: Path) -> tuple[list[str], str]:
    return ["--nproc", "0", "--device", "cpu", "--", "DATA"], "--nproc 0"


def _recipe(tmp: Path) -> tuple[list[str], str]:
    return ["show", "no_such_recipe"], "no_such_recipe"


def _evaluation(tmp: Path) -> tuple[list[str], str]:
    return ["--save-dir", str(tmp / "no_checkpoints"), "--dataset", "iwslt14"], "--save-dir"


def _results(tmp: Path) -> tuple[list[str], str]:
    return [str(tmp / "nothing_here")], "nothing_here"


def _params(tmp: Path) -> tuple[list[str], str]:
    return ["no_such_arch"], "no_such_arch"


def _attention_distance(tmp: Path) -> tuple[list[str], str]:
    return ["--checkpoint", str(tmp / "gone.pt"), "--no-progress"], "gone.pt"


def _cka(tmp: Path) -> tuple[list[str], str]:
    return ["--reference", str(tmp / "only.pt"), "--data", str(tmp)], "--reference"


def _depth_map(tmp: Path) -> tuple[list[str], str]:
    return [str(tmp / "gone.pt"), "--data", str(tmp)], "gone.pt does not exist"


def _exits(tmp: Path) -> tuple[list[str], str]:
    return ["train", str(tmp / "gone.pt"), "--data", str(tmp), "--out", str(tmp / "u.pt")], (
        "gone.pt does not exist"
    )


def _convert(tmp: Path) -> tuple[list[str], str]:
    return [str(tmp / "teacher.pt"), str(tmp / "out.pt")], "teacher.pt does not exist"


def _vision_train(tmp: Path) -> tuple[list[str], str]:
    return ["--model", "vit_xl", "--output", str(tmp / "run")], "vit_xl"


def _hub_prep(tmp: Path) -> tuple[list[str], str]:
    return ["--src", "en", "--tgt", "en", "--out", str(tmp / "out")], "--src/--tgt"


BAD_INPUTS: dict[str, BadInput] = {
    # console scripts
    "recurnmt-params": _params,
    "recurnmt-plot-lrc": _missing("train.log"),
    "recurnmt-cka": _cka,
    "recurnmt-attention-distance": _attention_distance,
    "recurnmt-depth-map": _depth_map,
    "recurnmt-exits": _exits,
    "recurnmt-train-nmt": _launch,
    "recurnmt-run-nmt-recipe": _recipe,
    "recurnmt-evaluate-nmt": _evaluation,
    "recurnmt-results-nmt": _results,
    "recurnmt-convert": _convert,
    "recurnmt-export-ct2": _convert,
    # python -m, recurnmt
    "python -m recurnmt.nmt.convert": _convert,
    "python -m recurnmt.nmt.ct2_export": _convert,
    "python -m recurnmt.vision.convert": _convert,
    "python -m recurnmt.analysis.params": _params,
    "python -m recurnmt.analysis.plot_lrc": _missing("train.log"),
    "python -m recurnmt.analysis.cka": _cka,
    "python -m recurnmt.analysis.attention_distance": _attention_distance,
    "python -m recurnmt.analysis.depth_map": _depth_map,
    "python -m recurnmt.analysis.exits": _exits,
    "python -m recurnmt.vision.training.train": _vision_train,
    "python -m recurnmt.vision.training.evaluate": _missing("best.pt"),
    "python -m recurnmt.vision.training.budget": _missing("dvt.pt"),
    "python -m recurnmt.experiments.scoring": _nmt_evaluate,
    "python -m recurnmt.experiments.averaging": lambda tmp: (
        ["--inputs", str(tmp / "c1.pt"), "--output", str(tmp / "avg.pt")],
        "c1.pt",
    ),
    "python -m recurnmt.experiments.evaluation": _evaluation,
    "python -m recurnmt.experiments.results": _results,
    "python -m recurnmt.experiments.recipe": _recipe,
    "python -m recurnmt.experiments.launch": _launch,
    "python -m recurnmt.export": lambda tmp: (
        [str(tmp / "bad_input.py"), str(tmp / "out")],  # an empty file, no checkpoint
        "bad_input.py is not a fairseq checkpoint",
    ),
    # python -m, data_prep
    "python -m data_prep.check": _missing("data-bin"),
    "python -m data_prep.iwslt14": _hub_prep,
    "python -m data_prep.wmt14": _hub_prep,
    "python -m data_prep.embedded": lambda tmp: (
        ["prepare", "--out", str(tmp / "out"), "--corpus-dir", str(tmp / "no_corpus")],
        "no_corpus",
    ),
    "python -m data_prep.imagenet": lambda tmp: (
        ["folder", "--source", str(tmp / "no_src"), "-o", str(tmp / "out"), "--no-progress"],
        "no_src",
    ),
    # scripts
    "python scripts/benchmark_nmt.py": lambda tmp: (["--archs", "no_such_arch"], "no_such_arch"),
    "python scripts/compare_nmt.py": lambda tmp: (["--archs", "no_such_arch"], "no_such_arch"),
    "python scripts/export_equivalence.py": lambda tmp: (
        [str(tmp / "none.pt"), "--data", str(tmp)],
        "none.pt",
    ),
    "python scripts/depth_memory.py": lambda tmp: (["--arch", "no_such_arch"], "no_such_arch"),
    "python scripts/decoding_speed.py": lambda tmp: (["--rounds", "0"], "--rounds"),
    "python scripts/profile_decoding.py": lambda tmp: (["--rounds", "0"], "--rounds"),
    "python scripts/sdpa_first_call.py": lambda tmp: (["--shapes", "0"], "--shapes"),
    "python scripts/depth_sweep.py": lambda tmp: (
        ["nmt", "--arch", "no_such_arch"],
        "no_such_arch",
    ),
    "python scripts/compile_speed.py": lambda tmp: (["--compile", "nope"], "--compile='nope'"),
    "python scripts/benchmark_vision.py": lambda tmp: (["--models", "vit_xl"], "vit_xl"),
    "python scripts/benchmark_data.py": lambda tmp: (
        ["--data-root", str(tmp / "no_images")],
        "no_images",
    ),
    "python scripts/demo_nmt.py": lambda tmp: (["--arch", "no_such_arch"], "no_such_arch"),
    "python scripts/deploy_bench.py": lambda tmp: (["--rounds", "0"], "--rounds"),
    "python -m scripts.gpu_check": lambda tmp: (["--wheels", str(tmp / "no_wheels")], "no_wheels"),
    "python scripts/relaxed_nmt.py": lambda tmp: (["--unique", "0"], "--unique 0"),
    "python scripts/ut_table4.py": lambda tmp: (["--jobs", "0"], "--jobs"),
    "python scripts/setup_env.py": lambda tmp: (
        ["--lock", str(tmp / "no_lock.txt"), "--venv", str(tmp / "venv")],
        "no_lock.txt",
    ),
    "python scripts/argos_env.py": lambda tmp: (
        ["--venv", str(tmp / "bad_input.py")],
        "bad_input.py: not a folder",
    ),
    "python scripts/compat.py": lambda tmp: (["--python", str(tmp / "no_python")], "no_python"),
    "python scripts/gpu_wheels.py": lambda tmp: (
        ["--lock", str(tmp / "no_lock.txt")],
        "no_lock.txt",
    ),
    "python scripts/fairseq_speed.py": lambda tmp: (["--archs", "no_such_arch"], "no_such_arch"),
    "python scripts/compiled_decoding.py": lambda tmp: (
        ["--data", str(tmp / "no_corpus")],
        "no_corpus: no binarized corpus there",
    ),
    "python scripts/speculative.py": lambda tmp: (
        ["measure", "--data", str(tmp / "no_corpus")],
        "no_corpus: no binarized corpus there",
    ),
    "python scripts/adaptive_depth.py": lambda tmp: (
        ["measure", "--data", str(tmp / "no_corpus")],
        "no_corpus: no binarized corpus there",
    ),
    "python scripts/act_rule.py": lambda tmp: (
        ["--checkpoint", str(tmp / "no_model.pt"), "--data", str(tmp)],
        "no_model.pt: no such file",
    ),
    "python scripts/make_compat_fixtures.py": lambda tmp: (
        ["--out", str(tmp / "bad_input.py")],
        "bad_input.py: not a folder",
    ),
    "python scripts/make_vision_fixtures.py": lambda tmp: (
        ["--out", str(tmp / "bad_input.py")],
        "bad_input.py",
    ),
}
COMMANDS = discover_commands()


def run_in_process(command: str, argv: list[str], monkeypatch: pytest.MonkeyPatch) -> object:
    """Runs ``command argv`` as the shell would; returns its exit code. A command that
    leaves torch's autograd switched off fails the test (the tests after it in this process
    would train without gradients)."""
    import torch

    grad = torch.is_grad_enabled()
    try:
        return _run(command, argv, monkeypatch)
    finally:
        left = torch.is_grad_enabled()
        torch.set_grad_enabled(grad)
        assert left == grad, f"{command} left autograd {'on' if left else 'off'}"


def _run(command: str, argv: list[str], monkeypatch: pytest.MonkeyPatch) -> object:
    kind, target = COMMANDS[command]
    monkeypatch.setattr(sys, "argv", [command.split()[-1], *argv])
    monkeypatch.setattr(sys, "path", list(sys.path))  # python script.py puts its folder first
    with warnings.catch_warnings():
        # runpy warns that the module is imported already (the test imported it, or another)
        warnings.simplefilter("ignore", RuntimeWarning)
        try:
            if kind == "console":
                module, function = target.split(":")
                return getattr(importlib.import_module(module), function)()
            if kind == "module":
                runpy.run_module(target, run_name="__main__", alter_sys=True)
            else:  # python script.py puts the script's own directory first on sys.path
                sys.path.insert(0, str(Path(target).parent))
                runpy.run_path(target, run_name="__main__")
        except SystemExit as exit_:
            return exit_.code
    return 0


def test_every_command_has_a_bad_input():
    """A discovered command needs an entry in BAD_INPUTS (and an entry needs a command)."""
    assert len(COMMANDS) > 20  # the discovery found the commands
    missing = sorted(set(COMMANDS) - set(BAD_INPUTS))
    stale = sorted(set(BAD_INPUTS) - set(COMMANDS))
    assert not missing, f"give these commands a bad input in BAD_INPUTS: {missing}"
    assert not stale, f"BAD_INPUTS names commands that no longer exist: {stale}"


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_user_error_is_one_line_and_exit_code_2(command, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("RECURNMT_TRACEBACK", raising=False)
    (tmp_path / "bad_input.py").write_text("")  # a file where a directory belongs
    argv, named = BAD_INPUTS[command](tmp_path)
    code = run_in_process(command, argv, monkeypatch)
    err = capsys.readouterr().err
    assert code == 2, f"{command} {argv}: exit code {code!r}, stderr:\n{err}"
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1, err
    assert named in errors[0], f"the error line does not name {named!r}: {errors[0]}"
    assert re.match(r"[\w./ -]+: error: \S", errors[0]), errors[0]  # PROG: error: MESSAGE


def _real_process(env_extra: dict[str, str]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "RECURNMT_TRACEBACK"}
    env.update(env_extra, PYTHONPATH=str(REPO))
    return subprocess.run(  # data_prep.check: a light import, a fast process
        [sys.executable, "-m", "data_prep.check", str(REPO / "no_such_data_bin")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_real_process_exits_2_and_shows_the_traceback_on_request():
    plain = _real_process({})
    assert plain.returncode == 2
    assert (
        plain.stderr
        == f"python -m data_prep.check: error: {REPO}/no_such_data_bin is not a directory\n"
    )
    traced = _real_process({"RECURNMT_TRACEBACK": "1"})
    assert traced.returncode == 1 and "Traceback" in traced.stderr
    assert "FileNotFoundError" in traced.stderr


def test_data_prep_commands_stay_light():
    """data_prep shares recurnmt.cli, which must not pull torch or fairseq in."""
    code = (
        "import sys, data_prep.errors, data_prep.iwslt14, data_prep.embedded.__main__; "
        "print(sorted(m for m in ('torch', 'fairseq', 'numpy') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
