"""Every command the documentation shows runs (issue 41, item 6): each command in a shell block
or an inline code span of README.md, docs/, configs/ and the pages the site includes names a
program that exists (a module, a script, a console script, a make target), no path of the
machine that wrote it, and each distinct Python program answers ``--help``. A moved or renamed
module fails here, not in a reader's shell."""

from __future__ import annotations

import configparser
import importlib.util
import re
import shlex
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

from tests.test_docs import INCLUDED, README, REPO

BLOCK = re.compile(r"^```(?:bash|sh|shell|console)?[^\n]*\n(.*?)^```", re.M | re.S)
SPAN = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
INTERPRETERS = ("python", "python3")
LAUNCHERS = (*INTERPRETERS, "torchrun", "make")
CONSOLE_PREFIXES = ("fairseq-", "recurnmt-")
MACHINE_PATHS = re.compile(r"(?<![\w.])/(?:work|home|root|tmp|Users)/")


def pages() -> list[Path]:
    return [
        README,
        *sorted((REPO / "docs").glob("*.md")),
        *sorted((REPO / "configs").rglob("*.md")),
        *(REPO / p for p in INCLUDED),
    ]


def _lines(text: str) -> list[str]:
    """Shell lines of ``text``: continuations joined, comments and prompts dropped."""
    joined = re.sub(r"\s*\\\n\s*", " ", text)
    out = []
    for line in joined.splitlines():
        line = line.strip().removeprefix("$ ")
        line = re.sub(r"\s+#.*$", "", line)
        if line and not line.startswith("#"):
            out.extend(part.strip() for part in re.split(r"\s*(?:&&|\|\||;)\s*", line))
    return out


def commands(path: Path) -> list[str]:
    """The commands ``path`` shows: lines of its shell blocks, and inline spans that start
    with a launcher (``python -m ...``, ``make ...``, ``recurnmt-...``, ``fairseq-...``)."""
    text = path.read_text(encoding="utf-8")
    found = []
    for block in BLOCK.findall(text):
        found += _lines(block)
    prose = BLOCK.sub("", text)
    for span in SPAN.findall(prose):
        if "..." in span or "<" in span or not _program_words(span):
            continue
        if " " not in span.strip() and not span.startswith("recurnmt-"):
            continue  # a name in prose (`fairseq-fixed`, the package), not a command
        found += _lines(span)
    return [c for c in found if _program_words(c)]


def _program_words(command: str) -> list[str]:
    """The command's words from its program on (environment settings, ``.venv/bin/`` and
    ``torchrun``'s own options dropped); [] where it is no command of ours."""
    try:
        words = shlex.split(command)
    except ValueError:
        return []
    while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
        words = words[1:]
    if not words:
        return []
    words[0] = words[0].removeprefix(".venv/bin/")
    if words[0] not in LAUNCHERS and not words[0].startswith(CONSOLE_PREFIXES):
        return []
    if words[0] == "torchrun":
        words = ["python", *words[words.index("-m") :]] if "-m" in words else []
    return words


def program(command: str) -> tuple[str, str] | None:
    """(kind, name) of the program ``command`` runs: a module, a script, a console script, a
    make target; None for a Python command of another kind (``python -c``, a REPL)."""
    words = _program_words(command)
    head = words[0]
    if head in INTERPRETERS:
        if len(words) > 2 and words[1] == "-m":
            return ("module", words[2])
        if len(words) > 1 and words[1].endswith(".py"):
            return ("script", words[1])
        return None
    if head == "make":
        target = next((w for w in words[1:] if not w.startswith("-") and "=" not in w), "")
        return ("make", target)
    return ("console", head)


@cache
def make_targets() -> set[str]:
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    return set(re.findall(r"^([A-Za-z][\w-]*):", makefile, re.M)) | {""}


@cache
def console_scripts() -> set[str]:
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    ours = {
        line.split("=")[0].strip()
        for line in cfg["options.entry_points"]["console_scripts"].splitlines()
        if "=" in line
    }
    return ours | {p.name for p in Path(sys.executable).parent.glob("fairseq-*")}


def _exists(kind: str, name: str) -> bool:
    if kind == "module":
        try:
            return importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:
            return False
    if kind == "script":
        return (REPO / name).is_file()
    if kind == "make":
        return name in make_targets()
    return name in console_scripts()


def shown() -> dict[tuple[str, str], list[str]]:
    """Every program the docs show, with where (page: command)."""
    out: dict[tuple[str, str], list[str]] = {}
    for path in pages():
        for command in commands(path):
            prog = program(command)
            if prog is None:
                continue
            for name in _braces(prog[1]):  # python -m recurnmt.experiments.{recipe,launch}
                out.setdefault((prog[0], name), []).append(f"{path.relative_to(REPO)}: {command}")
    return out


def _braces(name: str) -> list[str]:
    """A shell brace expansion of one ``{a,b}`` group."""
    match = re.search(r"\{([^{}]*)\}", name)
    if not match:
        return [name]
    head, tail = name[: match.start()], name[match.end() :]
    return [head + part + tail for part in match.group(1).split(",")]


def test_every_program_the_docs_show_exists():
    missing = {f"{k} {n}": where[0] for (k, n), where in shown().items() if not _exists(k, n)}
    assert not missing, missing


def test_no_command_carries_a_path_of_the_machine_that_wrote_it():
    found = [
        f"{path.relative_to(REPO)}: {c}"
        for path in pages()
        for c in commands(path)
        if MACHINE_PATHS.search(c)
    ]
    assert not found, found


def test_the_extraction_sees_blocks_spans_and_continuations(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "Run `python -m recurnmt.vision.training.train --help` or `make test`; not `x = 1`.\n"
        "```bash\nCUDA_VISIBLE_DEVICES=0 .venv/bin/python scripts/demo_nmt.py \\\n  --quick\n"
        "torchrun --nproc_per_node 2 -m recurnmt.vision.training.train --output r  # two\n```\n"
    )
    assert commands(page) == [
        "CUDA_VISIBLE_DEVICES=0 .venv/bin/python scripts/demo_nmt.py --quick",
        "torchrun --nproc_per_node 2 -m recurnmt.vision.training.train --output r",
        "python -m recurnmt.vision.training.train --help",
        "make test",
    ]
    assert [program(c) for c in commands(page)] == [
        ("script", "scripts/demo_nmt.py"),
        ("module", "recurnmt.vision.training.train"),
        ("module", "recurnmt.vision.training.train"),
        ("make", "test"),
    ]
    assert not _exists("module", "recurnmt.nmt.launch")
    assert _braces("recurnmt.experiments.{recipe,launch}") == [
        "recurnmt.experiments.recipe",
        "recurnmt.experiments.launch",
    ]


def _python_programs() -> list[tuple[str, str]]:
    return sorted(p for p in shown() if p[0] != "make" and _exists(*p))


@pytest.mark.parametrize("prog", _python_programs(), ids="{0[0]}:{0[1]}".format)
def test_every_program_the_docs_show_answers_help(prog):
    kind, name = prog
    argv = {
        "module": [sys.executable, "-m", name],
        "script": [sys.executable, name],
        "console": [str(Path(sys.executable).parent / name)],
    }[kind]
    done = subprocess.run([*argv, "--help"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{name} --help:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    assert "usage" in (done.stdout + done.stderr).lower()
