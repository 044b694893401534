"""Every console script that setup.cfg declares is installed and answers --help."""

from __future__ import annotations

import configparser
import importlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SETUP = Path(__file__).resolve().parents[1] / "setup.cfg"
parser = configparser.ConfigParser()
parser.read(SETUP)
SCRIPTS = dict(
    line.split(" = ")
    for line in parser["options.entry_points"]["console_scripts"].strip().splitlines()
)


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_console_script_resolves_and_is_installed(name):
    module, func = SCRIPTS[name].split(":")
    assert callable(getattr(importlib.import_module(module), func))
    # installed beside this interpreter (its environment's bin/), wherever that environment is
    beside = Path(sys.executable).parent / name
    installed = str(beside) if beside.exists() else shutil.which(name)
    assert installed, f"{name} is not installed"
    result = subprocess.run([installed, "--help"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "usage" in result.stdout.lower()
