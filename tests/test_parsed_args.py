"""fairseq's parser gives every recurnmt architecture the model arguments it gave when the
fixture was written (names and defaults): a renamed or re-defaulted flag fails here first.

After an intended change, write the fixture again and review its diff:
``RECURNMT_WRITE_FIXTURES=1 .venv/bin/python -m pytest tests/test_parsed_args.py``.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from recurnmt.nmt.build import arch_train_args
from recurnmt.nmt.defaults import ARCHS
from recurnmt.nmt.model import RecurrentTransformerModel

FIXTURE = Path(__file__).parent / "fixtures" / "parsed_args.json"


def _model_args() -> list[str]:
    """The arguments the model's parser group declares (fairseq's transformer's and ours)."""
    parser = argparse.ArgumentParser()
    RecurrentTransformerModel.add_args(parser)
    return sorted({a.dest for a in parser._actions if a.dest != "help"})


def _parsed() -> dict:
    """``{argument: value}`` where every architecture agrees, else ``{value: [archs]}``."""
    names = _model_args()
    values: dict[str, dict[str, list[str]]] = {}
    for arch in ARCHS:
        args = vars(arch_train_args(arch, []))
        for name in names:
            values.setdefault(name, {}).setdefault(repr(args.get(name)), []).append(arch)
    return {
        name: next(iter(by)) if len(by) == 1 else {v: sorted(a) for v, a in sorted(by.items())}
        for name, by in sorted(values.items())
    }


def test_every_architecture_parses_as_the_fixture_says():
    parsed = _parsed()
    if os.environ.get("RECURNMT_WRITE_FIXTURES"):
        FIXTURE.write_text(json.dumps(parsed, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    expected = json.loads(FIXTURE.read_text(encoding="utf-8"))
    assert set(parsed) == set(expected), set(parsed) ^ set(expected)
    changed = {k: (expected[k], parsed[k]) for k in parsed if parsed[k] != expected[k]}
    assert not changed, changed
