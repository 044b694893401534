"""JSON documents that are committed (``docs/*.json``) or compared across machines, written
without the absolute paths of the machine that made them.

A command line or a checkpoint recorded as ``/home/someone/recurnmt/work/...`` runs nowhere
else. :func:`portable` writes every path under the repository relative to its root (a command
then runs from the repository root, as the docs' commands do) and every other absolute path by
its name alone; :func:`write_json` writes a document so. Standard library only (``make
gpu-check`` imports it before its environment exists).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
# an absolute path inside a string: a slash at its start or after a space, a quote, = or (
_ABSOLUTE = re.compile(r"(?:^|(?<=[\s'\"=(]))/[^\s'\"]+")


def portable(value: Any, root: Path = ROOT) -> Any:
    """``value`` (nested dicts, lists and strings) with the repository root ``root`` cut from
    every path under it and other absolute paths reduced to their names."""
    if isinstance(value, dict):
        return {k: portable(v, root) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [portable(v, root) for v in value]
    if isinstance(value, Path):
        value = str(value)
    if not isinstance(value, str):
        return value
    prefix = str(root).rstrip("/")

    def relative(match: re.Match) -> str:
        path = match.group(0)
        if path == prefix:
            return "."
        if path.startswith(prefix + "/"):
            return path[len(prefix) + 1 :]
        return Path(path).name or path

    return _ABSOLUTE.sub(relative, value)


def write_json(path: Path, document: Any, indent: int = 2) -> None:
    """Writes ``document`` to ``path`` (made portable, :func:`portable`), its folder made."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(portable(document), indent=indent) + "\n", encoding="utf-8")
