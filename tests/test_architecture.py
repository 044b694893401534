"""The shape of the shared library (issue 11): small signatures, no front-end code below."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

from torch import nn

import recurnmt.modules

MODULES = Path(recurnmt.modules.__file__).parent


def _module_classes() -> list[type]:
    classes = []
    for info in pkgutil.iter_modules([str(MODULES)]):
        mod = importlib.import_module(f"recurnmt.modules.{info.name}")
        classes += [
            c for _, c in inspect.getmembers(mod, inspect.isclass) if c.__module__ == mod.__name__
        ]
    return classes


def test_no_forward_in_the_shared_library_takes_more_than_six_arguments():
    wide = {}
    for cls in _module_classes():
        for name in ("forward", "__call__"):
            fn = cls.__dict__.get(name)
            if fn is None:
                continue
            params = [p for p in inspect.signature(fn).parameters if p != "self"]
            if len(params) > 6:
                wide[f"{cls.__name__}.{name}"] = params
    assert not wide, wide
    assert any(issubclass(c, nn.Module) for c in _module_classes())


def test_the_shared_library_imports_no_front_end():
    """recurnmt.modules is below the front ends: no fairseq, nmt, vision or analysis import."""
    banned = ("fairseq", "recurnmt.nmt", "recurnmt.vision", "recurnmt.analysis", "timm")
    found = []
    for path in MODULES.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            found += [f"{path.name}: {n}" for n in names if n.startswith(banned)]
    assert not found, found


def test_paper_extensions_of_one_front_end_live_with_it():
    """MRLA's token-grid layer attention and DVT's reuse are image-only: under vision/."""
    assert not (MODULES / "layer_attention.py").exists()
    from recurnmt.vision.layers import layer_attention, reuse

    assert issubclass(layer_attention.LayerAttentionHook, recurnmt.modules.LevelHook)
    assert issubclass(reuse.ReuseHook, recurnmt.modules.LevelHook)


def test_no_module_of_the_package_the_scripts_or_the_studies_is_over_600_lines():
    """Each module says one thing: a file past 600 lines is a sign that it says several, and is
    split by what its parts do (the stack's part configs, the vision trainer, the GPU check,
    the relaxed study's settings, runs and plan were), never squeezed under the number by
    moving lines that belong together."""
    root = MODULES.parents[1]
    long = {
        str(path.relative_to(root)): n
        for folder in ("recurnmt", "scripts", "studies")
        for path in sorted((root / folder).rglob("*.py"))
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > 600
    }
    assert not long, long
