"""recurnmt.experiments.timed: a command's output streamed as it comes, stopped with its children
at its time limit; a budget shared among the steps still to come."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from recurnmt.experiments.timed import Budget, run_streamed

ROOT = Path(__file__).resolve().parents[1]


def test_output_is_streamed_to_the_terminal_and_the_log(tmp_path, capfd):
    log = tmp_path / "log.txt"
    code = "import sys; print('one'); print('two', file=sys.stderr); sys.exit(3)"
    run = run_streamed([sys.executable, "-c", code], log)
    assert (run.returncode, run.timed_out) == (3, False)
    assert run.tail == "one\ntwo\n"
    assert log.read_text().endswith("one\ntwo\n") and log.read_text().startswith("+ ")
    assert "one\ntwo\n" in capfd.readouterr().out


def test_a_command_past_its_limit_is_stopped_with_its_children(tmp_path):
    log = tmp_path / "log.txt"
    child = tmp_path / "child_pid"
    code = (  # a parent printing, then waiting on a child that outlives it unless killed too
        "import subprocess, sys, time\n"
        f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(child)!r}, 'w').write(str(p.pid))\n"
        "print('started', flush=True)\n"
        "p.wait()\n"
    )
    start = time.monotonic()
    run = run_streamed([sys.executable, "-c", code], log, timeout=3)
    assert run.timed_out and time.monotonic() - start < 20
    assert "started" in run.tail  # what it printed before the limit is kept
    assert "stopped at its time limit, 3 s" in log.read_text()
    pid = int(child.read_text())
    with pytest.raises(ProcessLookupError):  # the grandchild went with it
        for _ in range(50):
            os.kill(pid, 0)
            time.sleep(0.1)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stopped_run_stops_its_command_and_the_commands_children(tmp_path, sig):
    """The command runs in a process group of its own (so that its time limit stops its
    workers too), out of reach of a signal sent to the run's: a run stopped by SIGTERM or
    Ctrl-C stops the command's group before it ends, and no process is left."""
    pids = tmp_path / "pids"
    inner = (
        "import os, subprocess, sys\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{p.pid}}')\n"
        "p.wait()\n"
    )
    outer = (  # Ctrl-C's own handler, whatever the test runner's process had set (ignored)
        "import signal, sys\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "from pathlib import Path\nfrom recurnmt.experiments.timed import run_streamed\n"
        f"run_streamed([sys.executable, '-c', {inner!r}], Path({str(tmp_path / 'log')!r}))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.Popen([sys.executable, "-c", outer], env=env, cwd=ROOT)
    deadline = time.monotonic() + 60
    while not (pids.exists() and len(pids.read_text().split()) == 2):
        assert time.monotonic() < deadline and run.poll() is None, "the command never started"
        time.sleep(0.1)
    run.send_signal(sig)
    assert run.wait(timeout=60) != 0  # the group's grace (10 s) and a loaded machine
    for pid in map(int, pids.read_text().split()):
        assert _gone(pid, 15), f"process {pid} outlived the stopped run"


def _gone(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        if Path(f"/proc/{pid}/stat").exists() and " Z " in Path(f"/proc/{pid}/stat").read_text():
            return True  # a zombie: ended, waiting for its (init) parent to reap it
        time.sleep(0.1)
    return False


def test_the_budget_is_shared_among_the_steps_still_to_come():
    budget = Budget(100, reserve=10)
    assert 89 < budget.left() <= 90
    assert budget.share(3, later=6) == pytest.approx(budget.left() / 3, rel=1e-3)
    budget.start -= 85  # 85 s went by: the last 5 s of the reserve-less time remain
    assert budget.left() == pytest.approx(5, abs=0.1)
    budget.start -= 50
    assert budget.left() == 0 and budget.share(1, 1) == 0
    with pytest.raises(ValueError, match="--budget 0: must be a positive number of seconds"):
        Budget(0)
