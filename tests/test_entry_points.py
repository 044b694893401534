"""Every console script that setup.cfg declares resolves to a command that answers --help under
the script's name, and the installed ones are setup.cfg's where the installed recurnmt is this
checkout (``make setup`` refreshes the install when setup.cfg changes)."""

from __future__ import annotations

import configparser
import importlib
import json
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

REPO = Path(__file__).resolve().parents[1]
parser = configparser.ConfigParser()
parser.read(REPO / "setup.cfg")
SCRIPTS = dict(
    line.split(" = ")
    for line in parser["options.entry_points"]["console_scripts"].strip().splitlines()
)


def editable_checkout() -> Path | None:
    """The folder an editable install of recurnmt points at (None: not an editable install)."""
    text = metadata.distribution("recurnmt").read_text("direct_url.json")
    if not text:
        return None
    info = json.loads(text)
    if not info.get("dir_info", {}).get("editable"):
        return None
    return Path(unquote(urlparse(info["url"]).path)).resolve()


def installed_here() -> bool:
    """The installed recurnmt (and so its console scripts) is this checkout's."""
    checkout = editable_checkout()
    return checkout is None or checkout == REPO


def installed_script(name: str) -> Path | None:
    """The console script beside this interpreter (its environment's bin/), else on PATH."""
    beside = Path(sys.executable).parent / name
    found = beside if beside.exists() else shutil.which(name)
    return Path(found) if found else None


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_console_script_resolves_to_a_callable(name):
    module, func = SCRIPTS[name].split(":")
    assert callable(getattr(importlib.import_module(module), func))


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_console_script_answers_help_under_its_own_name(name, monkeypatch, capsys):
    """Its target as the console script calls it: no arguments, ``sys.argv`` as the shell sets."""
    module, func = SCRIPTS[name].split(":")
    monkeypatch.setattr(sys, "argv", [name, "--help"])
    with pytest.raises(SystemExit) as exit_:
        getattr(importlib.import_module(module), func)()
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: {name} ")


def test_the_installed_console_scripts_are_setup_cfgs():
    checkout = editable_checkout()
    if not installed_here():
        pytest.skip(
            f"the installed recurnmt is the editable install of {checkout}, not of this "
            f"checkout ({REPO}): its console scripts are that checkout's"
        )
    dist = metadata.distribution("recurnmt")
    installed = {ep.name: ep.value for ep in dist.entry_points if ep.group == "console_scripts"}
    assert installed == SCRIPTS, "the install predates setup.cfg: `make setup` refreshes it"
    missing = [name for name in SCRIPTS if not installed_script(name)]
    assert not missing, f"not installed beside {sys.executable}: {missing}"
    # one of them as a process of its own (a light one: the others import fairseq or torch)
    light = installed_script("recurnmt-plot-lrc")
    result = subprocess.run([str(light), "--help"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.startswith("usage: recurnmt-plot-lrc ")
