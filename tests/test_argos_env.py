"""``scripts/argos_env.py``: ``.venv-argos`` is reused while its requirements and the project's
environment stay the same, and pip's failures come back as one line that says whether the index
was reached (the Argos end-to-end test skips with it)."""

from __future__ import annotations

import json

from scripts import argos_env

UNREACHABLE = """WARNING: Retrying (Retry(total=1, connect=None, read=None, redirect=None, status=None))
after connection broken by 'NewConnectionError(...: Failed to establish a new connection:
[Errno 111] Connection refused')': /simple/argostranslate/
ERROR: Could not find a version that satisfies the requirement argostranslate==1.11.0 (from versions: none)
ERROR: No matching distribution found for argostranslate==1.11.0
"""


def test_an_unreachable_index_is_said_in_one_line():
    reason = argos_env._reason(UNREACHABLE)
    assert reason == (
        "the package index could not be reached; pip: Could not find a version that satisfies "
        "the requirement argostranslate==1.11.0 (from versions: none)"
    )


def test_another_failure_gives_pips_first_error():
    assert argos_env._reason("Collecting x\nERROR: no space left\nERROR: more\n") == (
        "pip: no space left"
    )


def test_a_built_environment_is_reused_while_nothing_it_was_built_from_changed(tmp_path):
    requirements = tmp_path / "argos.txt"
    requirements.write_text("argostranslate==1.11.0\n", encoding="utf-8")
    venv = tmp_path / "venv"
    venv.mkdir()
    assert not argos_env.is_current(venv, requirements)
    (venv / argos_env.STAMP).write_text(json.dumps(argos_env.stamp(requirements)), "utf-8")
    assert argos_env.is_current(venv, requirements)
    requirements.write_text("argostranslate==1.11.0\nemoji==2.16.0\n", encoding="utf-8")
    assert not argos_env.is_current(venv, requirements)


def test_argos_folders_stay_under_the_given_root(tmp_path):
    settings = argos_env.argos_settings(tmp_path)
    assert set(settings) == {
        "XDG_DATA_HOME",
        "XDG_CONFIG_HOME",
        "XDG_CACHE_HOME",
        "ARGOS_PACKAGES_DIR",
    }
    assert all(value.startswith(str(tmp_path)) for value in settings.values())
