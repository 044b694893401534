"""tests/timm_peer/test_models.py is timm's own test file, unchanged: byte for byte the team's
copy in ../shared/peer-tests/timm where that folder exists (a clean clone elsewhere has only
ours)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OURS = ROOT / "tests" / "timm_peer" / "test_models.py"
SHARED = ROOT.parent / "shared" / "peer-tests" / "timm" / "test_models.py"


def test_timms_test_file_is_unchanged():
    if not SHARED.exists():
        pytest.skip(f"no shared copy at {SHARED} on this machine")
    assert OURS.read_bytes() == SHARED.read_bytes(), "tests/timm_peer/test_models.py was edited"


def test_the_copy_is_the_one_the_conftest_names():
    """The conftest states the commit; the file is the one recorded with it (its digest)."""
    digest = hashlib.sha256(OURS.read_bytes()).hexdigest()
    assert digest == DIGEST, f"tests/timm_peer/test_models.py changed (sha256 {digest})"


DIGEST = "625daf18e03209aa781e00a44716da26b371d812cabd6b46bb368d01a4b90a95"  # commit aa4b585
