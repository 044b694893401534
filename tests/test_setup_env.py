"""Packaging: setup.cfg's ranges, the lock of the demo environment, scripts/setup_env.py's
plumbing (installer choice, pip's indexes for uv, the order of the stages) and make compat's
report. Building whole environments is `make setup` (CI) and `make compat` (docs/install.md)."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]


def load(name: str):
    """A script of scripts/ as a module (compat.py imports setup_env as its neighbour)."""
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(REPO / "scripts"))
    return module


setup_env = load("setup_env")
compat = load("compat")


def applies(requirement: Requirement, python: str) -> bool:
    return requirement.marker is None or requirement.marker.evaluate({"python_version": python})


# --- the metadata users install -------------------------------------------------------------


@pytest.mark.smoke
def test_installed_metadata_admits_python_3_11_to_3_13_and_torch_2_11_to_2_14():
    dist = metadata.distribution("recurnmt")
    requires_python = SpecifierSet(dist.metadata["Requires-Python"])
    assert all(Version(v) in requires_python for v in ("3.11.7", "3.12.3", "3.13.0"))
    assert Version("3.14.0") not in requires_python  # not tested there
    requirements = [Requirement(r) for r in dist.requires]
    for python in ("3.11", "3.12", "3.13"):
        (torch,) = [r for r in requirements if r.name == "torch" and applies(r, python)]
        assert Version("2.11.0") in torch.specifier and Version("2.14.1") in torch.specifier
    # no exact pin: every requirement is a range (ruff's is bounded to one minor version)
    assert not [str(r) for r in requirements if any(s.operator == "==" for s in r.specifier)]


LOCK = REPO / "requirements" / "lock.txt"


def test_the_lock_is_inside_the_ranges():
    pins = setup_env.read_lock(LOCK)
    python = re.search(r"^# Python (3\.\d+)", LOCK.read_text(encoding="utf-8"), re.M).group(1)
    groups = setup_env.setup_requirements()
    for requirement in (Requirement(r) for group in groups.values() for r in group):
        if applies(requirement, python):
            name = setup_env.normalize(requirement.name)
            assert Version(pins[name]) in requirement.specifier, (name, pins[name])
    assert not set(pins) & setup_env.NOT_LOCKED


@pytest.mark.skipif(
    Path(sys.prefix).resolve() != (REPO / ".venv").resolve(),
    reason="runs in the locked environment (.venv, make setup) only",
)
def test_the_locked_environment_holds_the_locks_versions():
    pins = setup_env.read_lock(LOCK)
    installed = {
        setup_env.normalize(d.metadata["Name"]): d.version for d in metadata.distributions()
    }
    differ = {n: (v, pins[n]) for n, v in installed.items() if n in pins and pins[n] != v}
    assert not differ
    assert set(pins) <= set(installed)


# --- scripts/setup_env.py -------------------------------------------------------------------


def test_lock_files_are_read_back_and_bad_lines_named(tmp_path):
    lock = tmp_path / "lock.txt"
    lock.write_text(setup_env.lock_text({"Torch": "2.14.1", "numpy": "2.4.6"}, "3.11.7", "cmd"))
    assert setup_env.read_lock(lock) == {"torch": "2.14.1", "numpy": "2.4.6"}
    assert lock.read_text().splitlines()[-2:] == ["numpy==2.4.6", "Torch==2.14.1"]
    lock.write_text("torch==2.14.1\nnumpy>=2\n")
    with pytest.raises(setup_env.SetupError, match=r"line 2: 'numpy>=2' is not NAME==VERSION"):
        setup_env.read_lock(lock)
    with pytest.raises(setup_env.SetupError, match="--lock .*gone.txt"):
        setup_env.read_lock(tmp_path / "gone.txt")


def test_the_first_stage_is_torch_and_numpy_in_their_ranges():
    groups = setup_env.setup_requirements()
    first = setup_env.first_stage(groups, None)
    assert {setup_env.requirement_name(r) for r in first} == {"torch", "numpy"}
    assert any('python_version >= "3.13"' in r for r in first)  # markers kept
    asked = setup_env.first_stage(groups, "2.11.0")
    assert [r for r in asked if r.startswith("torch")] == ["torch==2.11.0"]


PIP_CONFIG = """\
global.cert='/etc/ssl/certs/ca-certificates.crt'
global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'
global.find-links='/opt/wheels'
global.index-url='https://mirror.example/simple'
:env:.find-links='/srv/wheels'
:env:.default-timeout='180'
"""


def test_uv_gets_the_indexes_pip_is_configured_with():
    config = setup_env.parse_pip_config(PIP_CONFIG)
    assert config == {
        "extra-index-url": ["file:///opt/pypi/simple", "file:///opt/pypi-more/simple"],
        "find-links": ["/srv/wheels"],  # PIP_FIND_LINKS overrides pip.conf, as in pip
        "index-url": ["https://mirror.example/simple"],
    }
    flags = setup_env.uv_index_flags(config, {})
    assert flags == [
        "--index-url", "https://mirror.example/simple",
        "--extra-index-url", "file:///opt/pypi/simple",
        "--extra-index-url", "file:///opt/pypi-more/simple",
        "--find-links", "/srv/wheels",
        "--index-strategy", "unsafe-best-match",
    ]  # fmt: skip
    assert setup_env.uv_index_flags(config, {"UV_INDEX_URL": "https://x"}) == []  # uv's own
    assert setup_env.uv_index_flags({}, {}) == []  # pip's defaults: uv's defaults


def test_installer_choice(tmp_path, monkeypatch):
    python = tmp_path / "bin" / "python"
    assert setup_env.choose_installer(python, "pip").name == "pip"
    monkeypatch.setattr(setup_env.shutil, "which", lambda name: "/usr/bin/uv")
    monkeypatch.setattr(setup_env, "pip_config", lambda python: {})
    assert setup_env.choose_installer(python, "auto").uv == "/usr/bin/uv"
    # no uv on PATH, and pip cannot install it: auto falls back to pip, uv says why
    monkeypatch.setattr(setup_env.shutil, "which", lambda name: None)
    failed = subprocess.CompletedProcess([], 1)
    monkeypatch.setattr(setup_env.subprocess, "run", lambda *a, **k: failed)
    assert setup_env.choose_installer(python, "auto").name == "pip"
    with pytest.raises(setup_env.SetupError, match=r"uv==\S+ could not be installed"):
        setup_env.choose_installer(python, "uv")
    # never installed into a user's own environment (--here): pip, or uv from PATH only
    monkeypatch.setattr(setup_env.subprocess, "run", lambda *a, **k: pytest.fail("installed"))
    assert setup_env.choose_installer(python, "auto", bootstrap=False).name == "pip"
    with pytest.raises(setup_env.SetupError, match="no uv on PATH"):
        setup_env.choose_installer(python, "uv", bootstrap=False)


def test_commands_of_both_installers(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(
        setup_env.subprocess, "run",
        lambda cmd, **kw: calls.append(cmd) or subprocess.CompletedProcess(cmd, 0),
    )  # fmt: skip
    python, lock = tmp_path / "python", tmp_path / "lock.txt"
    setup_env.Installer(python, "uv", ["--find-links", "/w"]).install(
        ["torch"], constraints=lock, lowest=True
    )
    setup_env.Installer(python).install([], editable=".[vision]", constraints=lock)
    assert calls[0] == [
        "uv", "pip", "install", "--python", str(python), "--find-links", "/w",
        "--resolution", "lowest-direct", "--compile-bytecode", "--no-build-isolation", "torch",
        "-c", str(lock),
    ]  # fmt: skip
    assert calls[1] == [
        str(python), "-m", "pip", "install", "--quiet", "--no-build-isolation",
        "-e", ".[vision]", "-c", str(lock),
    ]  # fmt: skip


def test_impossible_settings_fail_at_once(tmp_path, capsys):
    venv = tmp_path / "venv"
    assert setup_env.main(["--venv", str(venv), "--lowest", "--installer", "pip"]) == 2
    assert "--lowest needs uv" in capsys.readouterr().err
    lock = str(REPO / "requirements" / "lock.txt")
    assert setup_env.main(["--venv", str(venv), "--lock", lock, "--torch", "2.5.1"]) == 2
    assert "--lock fixes every version" in capsys.readouterr().err
    bad = tmp_path / "lock.txt"
    bad.write_text("torch>=2\n")
    assert setup_env.main(["--venv", str(venv), "--lock", str(bad)]) == 2
    assert "is not NAME==VERSION" in capsys.readouterr().err
    assert not venv.exists()  # refused before anything was made
    assert setup_env.main(["--venv", str(venv), "--python", str(tmp_path / "nopython")]) == 2
    assert "nopython" in capsys.readouterr().err
    assert setup_env.main(["--here", "--lock", lock]) == 2  # it would replace your torch
    assert "--here keeps your environment's versions" in capsys.readouterr().err


def test_an_environment_of_another_python_is_refused(tmp_path):
    fake = tmp_path / "venv" / "bin" / "python"
    fake.parent.mkdir(parents=True)
    fake.write_text('#!/bin/sh\necho \'{"python": "3.9.18", "prefix": "/x", "packages": {}}\'\n')
    fake.chmod(0o755)
    with pytest.raises(
        setup_env.SetupError, match=r"holds Python 3\.9\.18, not 3\.1\d.*make clean"
    ):
        setup_env.ensure_venv(sys.executable, tmp_path / "venv")


def test_a_torchaudio_that_does_not_load_is_found(tmp_path):
    fake = tmp_path / "bin" / "python"  # an interpreter whose torchaudio fails on import
    fake.parent.mkdir()
    fake.write_text(
        "#!/bin/sh\necho 'OSError: undefined symbol: aoti_torch_abi_version' >&2\nexit 1\n"
    )
    fake.chmod(0o755)
    assert setup_env.torchaudio_error(fake) == "OSError: undefined symbol: aoti_torch_abi_version"
    assert setup_env.torchaudio_error(Path(sys.executable)) is None  # this one's loads


def test_kept_constraints_name_the_environments_torch_and_its_torchaudio(tmp_path):
    path = setup_env.kept_constraints({"torch": "2.11.0+cu130", "numpy": "2.5.2"}, tmp_path)
    assert path.read_text() == "torch==2.11.0+cu130\n"  # torchaudio: the newest fits
    # below torch 2.11 the newest torchaudio (2.11.0, no torch requirement) does not load
    path = setup_env.kept_constraints({"torch": "2.6.0+cu124"}, tmp_path)
    assert path.read_text() == "torch==2.6.0+cu124\ntorchaudio==2.6.0\n"
    installed = {"torch": "2.9.1", "torchvision": "0.24.1", "torchaudio": "2.9.1"}
    path = setup_env.kept_constraints(installed, tmp_path)  # an image's own are kept
    assert path.read_text() == "torch==2.9.1\ntorchvision==0.24.1\ntorchaudio==2.9.1\n"


# --- make compat ----------------------------------------------------------------------------


def test_compat_rows_show_versions_result_and_times():
    result = {
        "name": "py3.12-torch2.11.0", "date": "2026-11-26 20:00 UTC", "resolution": "newest",
        "python": "3.12.1", "versions": {"torch": "2.11.0", "numpy": "2.5.5", "timm": "1.0.31"},
        "setup": {"installer": "uv", "seconds": 61.2},
        "smoke": {"summary": "40 passed, 2 skipped, 1327 deselected in 150.20s (0:02:30)", "returncode": 0, "seconds": 152.0},
        "metadata": {"ok": True}, "passed": True,
    }  # fmt: skip
    table = compat.table([result]).splitlines()
    assert table[2] == (
        "| 3.12.1 | 2.11.0 | newest in range | numpy 2.5.5, timm 1.0.31 "
        "| pass: 40 passed, 2 skipped | 61 s (uv) | 152 s | 2026-11-26 |"
    )
    result.update(passed=False, resolution="lowest-direct")
    assert "| lowest-direct |" in compat.row(result) and "**FAIL**" in compat.row(result)


def test_saved_compat_runs_passed():
    runs = [json.loads(p.read_text()) for p in sorted((REPO / "docs" / "compat").glob("*.json"))]
    assert runs, "no make compat result in docs/compat"
    page = (REPO / "docs" / "install.md").read_text(encoding="utf-8")
    for run in runs:
        assert run["passed"] and run["metadata"]["ok"], run["name"]
        assert compat.row(run) in page, f"docs/install.md lacks the row of {run['name']}.json"


def test_the_smoke_subset_covers_what_make_compat_promises():
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "smoke", "-p",
         "no:cacheprovider"],
        cwd=REPO, capture_output=True, text=True,
    )  # fmt: skip
    ids = [line for line in proc.stdout.splitlines() if "::" in line]
    files = {line.split("::")[0] for line in ids}
    assert {
        "tests/test_plugin_import.py",  # imports
        "tests/test_nmt_decoding.py",  # every family's step-by-step decoding
        "tests/test_cli_e2e.py",  # fairseq-train / fairseq-generate
        "tests/test_vision_train.py",  # vision training steps
    } <= files
    decoding = [i for i in ids if "test_incremental_decoding_equals_full_pass" in i]
    assert len(decoding) >= 6  # every family
