"""The plugin can be imported under several names without duplicate registrations, and its
import leaves out what only some commands use (``torch._dynamo``: about a second of start-up)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = """
import argparse, sys
import recurnmt.nmt
from fairseq import utils
from fairseq.models import ARCH_MODEL_REGISTRY
utils.import_user_module(argparse.Namespace(user_dir="user_dir"))
utils.import_user_module(argparse.Namespace(user_dir="recurnmt/nmt"))
sys.path.insert(0, "recurnmt")
import nmt  # the package again under another module name
assert "ringformer_wmt_en_de" in ARCH_MODEL_REGISTRY
# torch.nn.attention.bias imports torch._dynamo; recurnmt imports it where a bias is made
assert "torch._dynamo" not in sys.modules, "the plugin imported torch._dynamo"
print("ok")
"""


@pytest.mark.smoke
def test_installed_package_and_user_dir_together():
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("ok")
