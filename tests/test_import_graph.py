"""No import cycles: shared pieces live below the commands that use them; the project's own
studies (``studies/``) sit above the installed package, which neither imports nor ships them.

The graph is read from the source with ``ast``, so it covers every file, whatever is
installed: an edge ``a -> b`` for each ``import b`` / ``from b import x`` in ``a`` (also inside
functions: a lazy import is a dependency too), ``from p import m`` naming the submodule
``p.m`` when there is one, relative imports resolved. Imports under ``if TYPE_CHECKING:`` are
left out (they never run). Importing ``p.m`` also runs ``p/__init__.py``; those implicit
edges are left out too, since a package that imports its own submodules would otherwise
always be a cycle.
"""

from __future__ import annotations

import ast
import configparser
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("recurnmt", "data_prep", "studies")


def module_names(package: str) -> dict[str, Path]:
    """``{dotted name: file}`` of every module of ``package``, packages included."""
    found = {}
    for path in sorted((REPO / package).rglob("*.py")):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(node: ast.AST):
    """The import statements under ``node``, skipping ``if TYPE_CHECKING:`` bodies."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for sub in child.orelse:
                yield from _import_nodes_of(sub)
            continue
        yield from _import_nodes_of(child)


def _import_nodes_of(node: ast.AST):
    if isinstance(node, ast.Import | ast.ImportFrom):
        yield node
    yield from _import_nodes(node)


def _known(name: str, modules: dict[str, Path]) -> str | None:
    """``name`` or its longest prefix that is one of ``modules``."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of ``modules`` that ``name`` (the file ``path``) imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in _import_nodes(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            targets.update(filter(None, (_known(a.name, modules) for a in node.names)))
            continue
        base = node.module or ""
        if node.level:  # relative: from . import x, from ..a import b
            parent = package.split(".")
            parent = parent[: len(parent) - (node.level - 1)]
            base = ".".join(parent + ([base] if base else []))
        for alias in node.names:
            target = f"{base}.{alias.name}"
            targets.add(target if target in modules else _known(base, modules) or "")
    targets.discard("")
    targets.discard(name)
    return targets


def import_graph(package: str) -> dict[str, set[str]]:
    modules = module_names(package)
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path ``[a, b, ..., a]``, or ``None`` (iterative DFS)."""
    state: dict[str, str] = {}  # "open": on the current path, "done": fully explored
    for root in sorted(graph):
        if root in state:
            continue
        path, stack = [root], [iter(sorted(graph[root]))]
        state[root] = "open"
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = "done"
                stack.pop()
            elif state.get(nxt) == "open":
                return path[path.index(nxt) :] + [nxt]
            elif nxt not in state:
                state[nxt] = "open"
                path.append(nxt)
                stack.append(iter(sorted(graph.get(nxt, ()))))
    return None


def test_the_graph_sees_lazy_relative_and_submodule_imports(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from . import b\n")
    (pkg / "a.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from pkg import c\n"
        "def f():\n    from pkg.sub import b\n"
    )
    (pkg / "sub" / "b.py").write_text("from ..a import f\nimport pkg.c\n")
    (pkg / "c.py").write_text("from pkg.sub import missing_name\n")
    modules = {
        "pkg": pkg / "__init__.py",
        "pkg.sub": pkg / "sub" / "__init__.py",
        "pkg.a": pkg / "a.py",
        "pkg.sub.b": pkg / "sub" / "b.py",
        "pkg.c": pkg / "c.py",
    }
    graph = {n: imports_of(n, p, modules) for n, p in modules.items()}
    assert graph == {
        "pkg": set(),
        "pkg.sub": {"pkg.sub.b"},
        "pkg.a": {"pkg.sub.b"},  # lazy import counted, TYPE_CHECKING one not
        "pkg.sub.b": {"pkg.a", "pkg.c"},
        "pkg.c": {"pkg.sub"},  # a name of the package: its __init__
    }
    assert find_cycle(graph) == ["pkg.a", "pkg.sub.b", "pkg.a"]
    del graph["pkg.sub.b"]
    assert find_cycle(graph) is None


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycles(package):
    graph = import_graph(package)
    assert len(graph) > 5  # the scan found the package
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_running_experiments_sits_above_the_models():
    """recurnmt.experiments runs the models and reads what they wrote: the model packages never import
    it, and it imports no analysis tool (which may read its logs)."""
    graph = import_graph("recurnmt")
    below = ("recurnmt.modules", "recurnmt.nmt", "recurnmt.vision", "recurnmt.hf")
    upward = [
        f"{name} -> {target}"
        for name, targets in graph.items()
        for target in targets
        if (name.startswith(below) and target.startswith("recurnmt.experiments"))
        or (name.startswith("recurnmt.experiments") and target.startswith("recurnmt.analysis"))
    ]
    assert not upward, upward
    runs = [t for n, ts in graph.items() if n.startswith("recurnmt.experiments") for t in ts]
    assert any(t.startswith("recurnmt.nmt") for t in runs)  # the check sees its imports


def test_the_image_trainer_sits_above_the_image_models():
    """recurnmt.vision.training trains and measures the image models: no model part, registry,
    converter or other package imports it."""
    graph = import_graph("recurnmt")
    upward = [
        f"{name} -> {target}"
        for name, targets in graph.items()
        for target in targets
        if target.startswith("recurnmt.vision.training")
        and not name.startswith("recurnmt.vision.training")
    ]
    assert not upward, upward
    runs = [t for n, ts in graph.items() if n.startswith("recurnmt.vision.training") for t in ts]
    assert any(t.startswith("recurnmt.vision.models") for t in runs)  # the check sees its imports


def imported_names(package: str) -> dict[str, set[str]]:
    """``{module: every absolute module name it imports}`` (lazy imports too, ``TYPE_CHECKING``
    ones left out), for the imports :func:`imports_of` cannot see: those outside ``package``."""
    found = {}
    for name, path in module_names(package).items():
        names = set()
        for node in _import_nodes(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
            elif not node.level and node.module:
                names.add(node.module)
                names.update(f"{node.module}.{a.name}" for a in node.names)
        found[name] = names
    return found


def _top(name: str) -> str:
    return name.partition(".")[0]


def test_the_installed_package_holds_no_study():
    """``studies/`` is the project's own: no module of the package imports it, and setup.cfg's
    packages (``find:`` with its includes) leave it out."""
    importing = {
        f"{module} -> {name}"
        for package in ("recurnmt", "data_prep")
        for module, names in imported_names(package).items()
        for name in names
        if _top(name) == "studies"
    }
    assert not importing, importing
    from setuptools import find_packages

    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    assert cfg["options"]["packages"].strip() == "find:"
    include = cfg["options.packages.find"]["include"].replace(",", " ").split()
    shipped = find_packages(where=str(REPO), include=include)
    assert "recurnmt.experiments" in shipped and "data_prep" in shipped  # the check sees them
    assert not [p for p in shipped if _top(p) in ("studies", "scripts", "tests")], shipped


def test_the_studies_import_recurnmt_as_a_user_does():
    """``studies/`` imports the standard library, third-party packages, ``recurnmt`` by its
    public names and itself: no script, test or other folder of the checkout, no private name
    of recurnmt (``_x``)."""
    checkout = {p.name for p in REPO.iterdir() if p.is_dir() or p.suffix == ".py"} - {
        "recurnmt",
        "studies",
    }
    imports = imported_names("studies")
    found = [
        f"{module} -> {name}"
        for module, names in imports.items()
        for name in names
        if _top(name) in checkout
        or (_top(name) == "recurnmt" and any(p.startswith("_") for p in name.split(".")))
    ]
    assert not found, found
    used = {_top(n) for names in imports.values() for n in names}
    assert {"recurnmt", "studies", "torch"} <= used  # the check sees its imports
    checked = {"scripts", "tests", "data_prep", "user_dir"}
    assert checked <= checkout  # the folders it keeps the studies out of


def test_the_check_of_the_studies_sees_a_private_name(tmp_path, monkeypatch):
    (tmp_path / "studies").mkdir()
    (tmp_path / "studies" / "__init__.py").write_text("")
    (tmp_path / "studies" / "a.py").write_text(
        "def f():\n    from recurnmt.nmt.build import _hidden\n    import scripts.demo_nmt\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    names = imported_names("studies")["studies.a"]
    assert "recurnmt.nmt.build._hidden" in names and "scripts.demo_nmt" in names


def test_the_block_library_calls_no_front_end():
    """recurnmt.modules (decoding included) imports no front end of recurnmt's and neither
    fairseq nor transformers: a decoding loop is handed a DecodingSide, never reaches back."""
    front_ends = ("recurnmt.nmt", "recurnmt.hf", "recurnmt.vision", "recurnmt.experiments")
    graph = import_graph("recurnmt")
    upward = [
        f"{name} -> {target}"
        for name, targets in graph.items()
        if name.startswith("recurnmt.modules")
        for target in targets
        if target.startswith(front_ends)
    ]
    assert not upward, upward
    assert any(n.startswith("recurnmt.modules.decoding.") for n in graph)  # the scan sees it
    outside = [
        str(path.relative_to(REPO))
        for path in (REPO / "recurnmt" / "modules").rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Import | ast.ImportFrom)
        for name in (
            [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
        )
        if name.split(".")[0] in ("fairseq", "transformers")
    ]
    assert not outside, outside
