"""scripts/: no script touches ``sys.path`` (but a study's, which puts the checkout's root first
for ``studies/``, not installed), none is a thin wrapper of a package command, and the ones
that run before anything is installed run with a bare Python (issue 27, item 6)."""

from __future__ import annotations

import ast
import configparser
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((REPO / "scripts").rglob("*.py"))
# the two-line wrappers that were scripts, and the console scripts that replaced them
FORMER_WRAPPERS = {
    "train_nmt.py": "recurnmt-train-nmt",
    "run_nmt_recipe.py": "recurnmt-run-nmt-recipe",
    "evaluate_nmt.py": "recurnmt-evaluate-nmt",
    "results_nmt.py": "recurnmt-results-nmt",
}
# run before recurnmt is installed (make setup, make compat, make gpu-wheels, make gpu-check),
# possibly by another Python: the command the Makefile runs, with --help
BOOTSTRAP = {
    "setup_env": ["scripts/setup_env.py"],
    "compat": ["scripts/compat.py"],
    "gpu_wheels": ["scripts/gpu_wheels.py"],
    "gpu_check": ["-m", "scripts.gpu_check"],
}


def sys_path_uses(path: Path) -> list[str]:
    """``line: code`` of every use of ``sys.path`` or ``site`` in the file's code (its strings,
    such as a probe program run in another interpreter, are not code)."""
    source = path.read_text(encoding="utf-8")
    found = []
    for node in ast.walk(ast.parse(source)):
        uses = (
            isinstance(node, ast.Attribute)
            and node.attr == "path"
            and isinstance(node.value, ast.Name)
            and node.value.id == "sys"
        )
        if isinstance(node, ast.ImportFrom):
            uses = (node.module == "sys" and any(a.name == "path" for a in node.names)) or (
                node.module == "site"
            )
        if isinstance(node, ast.Import):
            uses = any(a.name == "site" for a in node.names)
        if uses:
            found.append(f"{node.lineno}: {ast.get_source_segment(source, node)}")
    return found


# the one use of sys.path a script may make: a script that drives a study of studies/ (the
# checkout's own, not installed) puts the checkout's root first, once, before importing it
STUDIES_ROOT = "sys.path.insert(0, str(Path(__file__).resolve().parents[1]))"


def imports_studies(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module or ""]
        if any(n == "studies" or n.startswith("studies.") for n in names):
            return True
    return False


def allowed_sys_path(path: Path) -> set[int]:
    """The lines of the statements :data:`STUDIES_ROOT` at the top level of a script that
    imports ``studies``."""
    if not imports_studies(path):
        return set()
    body = ast.parse(path.read_text(encoding="utf-8")).body
    return {n.lineno for n in body if isinstance(n, ast.Expr) and ast.unparse(n) == STUDIES_ROOT}


def test_the_check_finds_what_it_looks_for(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import sys\nimport site\nfrom sys import path\n"
        "sys.path.insert(0, '..')\nPROBE = 'import sys; print(sys.path)'\n"
    )
    assert [use.split(":")[0] for use in sys_path_uses(bad)] == ["2", "3", "4"]
    study = tmp_path / "study.py"
    study.write_text(f"import sys\n{STUDIES_ROOT}\nsys.path.append('..')\n")
    assert allowed_sys_path(study) == set()  # imports no study: nothing allowed
    study.write_text(study.read_text() + "from studies.plan import Run\n")
    assert allowed_sys_path(study) == {2}


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: str(p.relative_to(REPO)))
def test_no_script_touches_sys_path(path):
    allowed = allowed_sys_path(path)
    assert len(allowed) <= 1, f"{path.relative_to(REPO)}: {STUDIES_ROOT} once"
    uses = [use for use in sys_path_uses(path) if int(use.split(":")[0]) not in allowed]
    assert not uses, (
        f"{path.relative_to(REPO)} touches sys.path ({uses}): run it with the package "
        "installed (make setup), or as python -m scripts.NAME from the repository's root; a "
        f"study's script puts the checkout's root first with {STUDIES_ROOT} alone"
    )


def test_a_study_script_finds_the_studies_without_pythonpath():
    """``python scripts/NAME.py`` from the root, the package installed: scripts/ is its first
    import path and studies/ is not installed, so the script's own line finds it."""
    studies = [p for p in SCRIPTS if imports_studies(p)]
    assert {p.name for p in studies} >= {"relaxed_nmt.py", "speculative.py", "deploy_bench.py"}
    assert all(allowed_sys_path(p) for p in studies)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "scripts/relaxed_nmt.py", "--help"],  # imports studies at its top
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("usage: ")


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: str(p.relative_to(REPO)))
def test_no_script_is_a_thin_wrapper(path):
    """A script defines something of its own; a package command is a console script."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    if path.name == "__init__.py":
        assert len(tree.body) == 1  # the package's docstring alone
        return
    defined = [n for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)]
    assert defined, f"{path.name} only wraps a package command: make it a console script"


def test_the_former_wrappers_are_console_scripts():
    parser = configparser.ConfigParser()
    parser.read(REPO / "setup.cfg")
    lines = parser["options.entry_points"]["console_scripts"].strip().splitlines()
    names = {line.split("=")[0].strip() for line in lines}
    for script, console in FORMER_WRAPPERS.items():
        assert not (REPO / "scripts" / script).exists()
        assert console in names


@pytest.mark.parametrize("name", sorted(BOOTSTRAP))
def test_bootstrap_scripts_run_with_a_bare_python(name):
    """``-S -E``: no site-packages (no installed recurnmt, nor anything else), no PYTHONPATH."""
    cmd = [sys.executable, "-S", "-E", *BOOTSTRAP[name], "--help"]
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: ")
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    assert " ".join(BOOTSTRAP[name]) in makefile  # the command make runs
