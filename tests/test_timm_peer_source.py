"""timm's test file comes from timm's source distribution, not from this repository
(tests/timm_peer/peer_source.py): downloaded once at the installed version, reused after, and
where the index cannot be reached the reason is one line that the suite is skipped with."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import timm

from tests.timm_peer import peer_source
from tests.timm_peer.peer_source import Unavailable, cached_path, fetch, fetch_installed
from tests.timm_peer.selection import suite_may_run

ROOT = Path(__file__).resolve().parents[1]
MEMBER = "tests/test_models.py"
TEST_FILE = b"def test_something():\n    pass\n"


def fake_pip(members: dict[str, bytes], calls: list[list[str]], returncode: int = 0, err=""):
    """A runner standing in for ``pip download``: records the command and writes an sdist of
    ``members`` (paths inside its top folder) where ``--dest`` says."""

    def run(cmd, **kwargs):
        calls.append(cmd)
        if returncode:
            return subprocess.CompletedProcess(cmd, returncode, "", err)
        spec = cmd[cmd.index("download") + 1]  # timm==VERSION
        top = spec.replace("==", "-")
        dest = Path(cmd[cmd.index("--dest") + 1])
        with tarfile.open(dest / f"{top}.tar.gz", "w:gz") as archive:
            for name, data in members.items():
                info = tarfile.TarInfo(f"{top}/{name}")
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
        return subprocess.CompletedProcess(cmd, 0, "", "")

    return run


def test_the_member_is_taken_from_the_sdist_and_reused(tmp_path):
    calls: list[list[str]] = []
    runner = fake_pip({MEMBER: TEST_FILE, "tests/__init__.py": b""}, calls)
    path = fetch("timm", "1.2.3", MEMBER, tmp_path, runner=runner)
    assert (
        path
        == tmp_path / "timm-1.2.3" / "test_models.py"
        == cached_path(tmp_path, "timm", "1.2.3", MEMBER)
    )
    assert path.read_bytes() == TEST_FILE
    assert fetch("timm", "1.2.3", MEMBER, tmp_path, runner=runner) == path
    assert len(calls) == 1  # the cached file is reused, nothing downloaded again
    cmd = calls[0]
    assert cmd[:5] == [sys.executable, "-m", "pip", "download", "timm==1.2.3"]
    assert cmd[cmd.index("--no-binary") + 1] == "timm" and "--no-deps" in cmd  # the sdist only
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".download-")]


def test_a_cached_file_is_used_without_asking_the_index(tmp_path):
    cached = cached_path(tmp_path, "timm", "1.2.3", MEMBER)
    cached.parent.mkdir()
    cached.write_bytes(TEST_FILE)

    def offline(cmd, **kwargs):
        raise AssertionError(f"ran {cmd}")

    assert fetch("timm", "1.2.3", MEMBER, tmp_path, runner=offline) == cached


def test_the_version_is_the_installed_one(tmp_path, monkeypatch):
    assert peer_source.installed_version("timm") == timm.__version__
    monkeypatch.setattr(peer_source, "installed_version", lambda dist: "9.8.7")
    calls: list[list[str]] = []
    path = fetch_installed("timm", MEMBER, tmp_path, runner=fake_pip({MEMBER: TEST_FILE}, calls))
    assert "timm==9.8.7" in calls[0] and path.parent.name == "timm-9.8.7"


PIP_FAILURE = """\
WARNING: Retrying (Retry(total=1, connect=None, read=None, redirect=None, status=None)) after \
connection broken by 'NewConnectionError('<pip._vendor.urllib3.connection.HTTPConnection \
object at 0x7f0>: Failed to establish a new connection: [Errno 111] Connection refused')': \
/simple/timm/
ERROR: Could not find a version that satisfies the requirement timm==1.2.3 (from versions: none)
ERROR: No matching distribution found for timm==1.2.3
"""


def test_a_failed_download_gives_a_one_line_reason_once_per_run(tmp_path):
    calls: list[list[str]] = []
    runner = fake_pip({}, calls, returncode=1, err=PIP_FAILURE)
    with pytest.raises(Unavailable) as err:
        fetch("timm", "1.2.3", MEMBER, tmp_path, run_id="run-a", runner=runner)
    reason = str(err.value)
    assert "\n" not in reason
    assert reason == (
        "timm 1.2.3's source distribution not downloaded: the package index could not be "
        "reached ([Errno 111] Connection refused); pip: Could not find a version that "
        "satisfies the requirement timm==1.2.3 (from versions: none)"
    )
    # another process of the same run is told the same without asking the index again
    with pytest.raises(Unavailable, match="from versions: none"):
        fetch("timm", "1.2.3", MEMBER, tmp_path, run_id="run-a", runner=runner)
    assert len(calls) == 1
    with pytest.raises(Unavailable):  # a later run tries again
        fetch("timm", "1.2.3", MEMBER, tmp_path, run_id="run-b", runner=runner)
    assert len(calls) == 2
    assert not cached_path(tmp_path, "timm", "1.2.3", MEMBER).exists()


def test_an_index_without_that_version_says_so():
    """Reached, but no such release: pip's error alone."""
    out = "ERROR: Could not find a version that satisfies the requirement timm==0.0.0\n"
    assert peer_source.pip_reason(out) == (
        "pip: Could not find a version that satisfies the requirement timm==0.0.0"
    )


def test_an_sdist_without_the_file_is_a_reason_too(tmp_path):
    runner = fake_pip({"README.md": b"timm"}, [])
    with pytest.raises(Unavailable, match=r"timm-1.2.3.tar.gz\) holds no tests/test_models.py"):
        fetch("timm", "1.2.3", MEMBER, tmp_path, runner=runner)


def test_an_unreachable_index_is_one_line_from_pip_itself(tmp_path, monkeypatch):
    """The real pip, pointed at an index nobody serves (no config file, no other index or
    wheel folder): the failure becomes the one-line reason."""
    for var in [v for v in os.environ if v.startswith("PIP_")]:
        monkeypatch.delenv(var)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    with pytest.raises(Unavailable) as err:
        fetch("timm", timm.__version__, MEMBER, tmp_path)
    reason = str(err.value)
    assert "\n" not in reason
    assert reason.startswith(
        f"timm {timm.__version__}'s source distribution not downloaded: the package index could "
        "not be reached"
    )
    assert f"timm=={timm.__version__}" in reason


def test_the_repository_holds_no_file_of_timms():
    """timm's test file lives only in the ignored cache; git tracks none of it."""
    proc = subprocess.run(
        ["git", "ls-files", "tests/timm_peer"], cwd=ROOT, capture_output=True, text=True
    )
    if proc.returncode:
        pytest.skip(f"not a git checkout: {proc.stderr.strip()}")
    tracked = proc.stdout.split()
    assert not [p for p in tracked if Path(p).name == "test_models.py" or "/sdist/" in p]
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", "tests/timm_peer/sdist/timm-1.0.31/test_models.py"],
        cwd=ROOT,
    )
    assert ignored.returncode == 0


PROJECT_MARKERS = {"e2e", "dist", "cuda", "smoke", "timm_peer", "parametrize", "skipif"}


@pytest.mark.parametrize(
    ("markexpr", "fetched"),
    [
        ("", True),
        ("timm_peer", True),
        ("not e2e", True),  # make test-fast
        ("cfg", True),  # one of timm's own markers
        ("cuda", False),  # make gpu-check, maybe with no index to ask
        ("smoke", False),  # make compat
        ("e2e", False),
        ("not timm_peer", False),
    ],
)
def test_the_suite_is_fetched_only_where_m_can_select_it(markexpr, fetched):
    assert suite_may_run(markexpr, PROJECT_MARKERS) is fetched
