"""recurnmt.experiments.artifacts: committed documents hold no absolute path of the machine that made
them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from recurnmt.experiments.artifacts import portable, write_json

ROOT = Path(__file__).resolve().parents[1]


def test_paths_under_the_repository_become_relative_and_others_their_names():
    root = Path("/home/someone/recurnmt")
    doc = {
        "command": f"{root}/.venv/bin/fairseq-generate data-bin/x --user-dir {root}/user_dir "
        f"--path={root}/work/c/checkpoint_last.pt --json /tmp/out/p.json",
        "root": str(root),
        "runs": [Path(f"{root}/work/a"), 3, None, "see https://example.org/a/b"],
    }
    assert portable(doc, root) == {
        "command": ".venv/bin/fairseq-generate data-bin/x --user-dir user_dir "
        "--path=work/c/checkpoint_last.pt --json p.json",
        "root": ".",
        "runs": ["work/a", 3, None, "see https://example.org/a/b"],
    }


def test_write_json_writes_the_portable_document(tmp_path):
    out = tmp_path / "sub" / "doc.json"
    write_json(out, {"data": str(ROOT / "data-bin" / "x")})
    assert json.loads(out.read_text()) == {"data": "data-bin/x"}


@pytest.mark.parametrize(
    "path", sorted(p.relative_to(ROOT) for p in (ROOT / "docs").rglob("*.json")), ids=str
)
def test_committed_documents_hold_no_absolute_path(path):
    doc = json.loads((ROOT / path).read_text(encoding="utf-8"))
    assert portable(doc) == doc, (
        f"{path}: absolute paths (rewrite with recurnmt.experiments.artifacts)"
    )
