"""A study as a resumable plan of runs (:mod:`studies.relaxed.study` is one): stages of
runs in order, each run in its own directory with its settings; a finished run
(``RUN/result.json``) is reused while its settings hold, an interrupted one goes on in its
directory, and where the directories are gone (a new checkout) a finished run is taken from
the study's committed record (:class:`Record`).
"""

from __future__ import annotations

import gzip
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LATER = "(later stages)"  # pending: stages with runs that wait for the runs before them
AGAIN = ("reproduced", "seconds_again")  # what a run made again adds to its recorded result


def machine() -> dict[str, Any]:
    """What a run's numbers repeat on bit for bit besides its settings: the torch build, the
    CPU and the kernels torch picks for it, the cores (a CPU run's threads per process come
    from them). The same lock file on another CPU trained a teacher that differed from its
    first validation on, so a result says where it was made (``RUN/result.json``
    ``machine``, outside its settings: a run is reused anywhere, and made again only where
    this is equal)."""
    import os
    import platform

    import torch

    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            names = [line.split(":", 1)[1] for line in info if line.startswith("model name")]
        model = names[0].strip() if names else model
    except OSError:  # not Linux
        pass
    return {"torch": torch.__version__, "cpu": model,
            "kernels": torch.backends.cpu.get_cpu_capability(), "cores": os.cpu_count()}  # fmt: skip


@dataclass
class Run:
    """One run of the study: its directory name, what its result depends on, and the work."""

    name: str
    settings: dict[str, Any]
    body: Callable[[Path], dict[str, Any]]
    updates: int  # training updates it costs (the plan's estimate of its work)


class Runner:
    """Runs a plan: a subclass gives ``args`` (``fresh``), ``out`` (the run directories),
    ``record`` (:class:`Record`), ``made`` (a set), ``again`` (a dict) and :meth:`stages`."""

    WAITS = "they wait for what this checkout lacks"  # why :meth:`waits` leaves runs

    args: Any
    out: Path
    record: Record
    made: set[str]
    again: dict[str, dict[str, Any]]  # the recorded results of the runs made again

    def stages(self) -> list[Callable[[], list[Run]]]:
        raise NotImplementedError

    def planned(self) -> bool:
        """Whether every stage plans its runs now: a stage may plan nothing until an earlier one
        has run (every stage does, unless a subclass says so)."""
        return True

    def waits(self, run: Run) -> bool:
        """Whether ``run`` is left for later (none is, unless a subclass says so)."""
        return False

    def recovers(self, run: Run, result: dict[str, Any]) -> bool:
        """Whether ``run``, finished with ``result``, is run again for what its record lacks
        (none is, unless a subclass says so): :meth:`execute` then keeps the recorded result,
        and what the new run made only if it reproduced every recorded number."""
        return False

    def finished(self, run: Run) -> dict[str, Any] | None:
        """:meth:`stored`, unless the run is to be made again (:meth:`recovers`)."""
        result = self.stored(run)
        if result is not None and run.name not in self.made and self.recovers(run, result):
            self.again[run.name] = result
            return None
        return result

    def stored(self, run: Run) -> dict[str, Any] | None:
        """The run's stored result if its settings are unchanged: from its directory, or, where
        that is gone, from the committed record (written back into the directory)."""
        if self.args.fresh and run.name not in self.made:  # --fresh: what this study made
            return None
        settings = json.loads(json.dumps(run.settings))
        done = self.out / run.name / "result.json"
        if not done.exists():
            return self.record.restore(run.name, settings, self.out)
        result = json.loads(done.read_text(encoding="utf-8"))
        return result if result.get("settings") == settings else None

    def execute(self, run: Run) -> dict[str, Any]:
        """Runs ``run``: anew, or on from where an interrupted attempt with the same settings
        stopped (fairseq-train resumes from the run's ``checkpoint_last.pt``)."""
        run_dir = self.out / run.name
        started = run_dir / "started.json"
        settings = json.dumps(run.settings, sort_keys=True)
        if not started.exists() or started.read_text(encoding="utf-8") != settings:
            shutil.rmtree(run_dir, ignore_errors=True)
            run_dir.mkdir(parents=True)
            started.write_text(settings, encoding="utf-8")
        elif (run_dir / "checkpoints" / "checkpoint_last.pt").exists():
            print(f"[{run.name}] resuming from its last checkpoint", flush=True)
        start = time.time()
        result = {"run": run.name, **run.body(run_dir), "settings": run.settings}
        result["seconds"] = round(time.time() - start, 1)
        result["machine"] = machine()
        if run.name in self.again:
            result = self.reproduced(self.again.pop(run.name), result)
        write_result(run_dir, result)
        self.made.add(run.name)
        return result

    def reproduced(self, recorded: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
        """The recorded result of a run made again (:meth:`recovers`), whose hypotheses are
        kept only where the new run reproduced every recorded number (the time excepted);
        ``reproduced`` says which (a run that did not is not made again)."""
        name, same = recorded["run"], json.loads(json.dumps(result))
        differs = [k for k in recorded if k not in ("seconds", "settings", "machine", *AGAIN) and
                   same.get(k) != json.loads(json.dumps(recorded[k]))]  # fmt: skip
        if differs:
            for hyps in hypotheses(result):
                (self.out / hyps).unlink(missing_ok=True)
            shown = "; ".join(f"{k}: {same.get(k)} against {recorded[k]}" for k in differs[:3])
            print(f"[{name}] run again, it is not the recorded run ({shown}): its record "
                  "stands, without its hypotheses", flush=True)  # fmt: skip
        else:
            print(f"[{name}] run again, equal to the recorded run: its hypotheses kept", flush=True)
        return {**recorded, "reproduced": not differs, "seconds_again": result["seconds"],
                "settings": result["settings"]}  # fmt: skip

    def run(self, deadline: float | None = None) -> tuple[list[dict[str, Any]], list[str]]:
        """Runs the plan until it is done or ``deadline`` (``time.time()``) has passed.

        The runs :meth:`waits` names are left for later without holding up the stages after
        them.

        Returns:
            The finished results in plan order, and the names of the runs not yet run.
        """
        results, pending, seen, later, skipped = [], [], set(), False, []
        for stage in self.stages():
            runs = stage()
            if pending:  # an earlier stage is unfinished: this one's finished runs are shown,
                # none is started (a stage may need the earlier ones' results)
                found = [(run, self.finished(run) or self.again.pop(run.name, None))
                         for run in runs]  # fmt: skip
                results += [r for run, r in found if r is not None and run.name not in seen]
                seen.update(run.name for run, r in found if r is not None)
                later = later or not self.planned() or any(r is None for _, r in found)
                continue
            todo = [r for r in runs if self.finished(r) is None]
            left = [r for r in todo if self.waits(r)]
            total = sum(r.updates for r in todo if r not in left)
            again = sum(r.name in self.again for r in todo if r not in left)
            if todo:
                print(f"[plan] {len(todo) - len(left)} of {len(runs)} runs to do ({total:,} "
                      "updates)" + (f"; {again} of them again, for what the record lacks"
                                    if again else "")
                      + (f"; {len(left)} left: {self.WAITS}" if left else ""))  # fmt: skip
            for run in runs:
                result = self.finished(run)
                if result is None and run not in left and (deadline is None or
                                                           time.time() < deadline):  # fmt: skip
                    print(f"[{run.name}] ... ({time.strftime('%H:%M')})", flush=True)
                    result = self.execute(run)
                    print(f"[{run.name}] {summary(result)}", flush=True)
                if result is None and run.name in self.again:  # not made again now: as recorded
                    result = self.again.pop(run.name)
                if result is None and run in left:
                    skipped.append(run.name)
                    continue
                if result is None:
                    pending.append(run.name)
                elif run.name not in seen:  # a selection run is also a main-cell run
                    seen.add(run.name)
                    results.append(result)
        return results, pending + skipped + [LATER] * later


def write_result(run_dir: Path, result: dict[str, Any]) -> None:
    """``RUN/result.json``: what marks a run finished."""
    (run_dir / "result.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


def train_logs(run_dir: Path) -> list[Path]:
    """The ``fairseq-train`` logs of a run, oldest attempt first."""
    earlier = sorted(run_dir.glob("train-*.log"), key=lambda p: int(p.stem.split("-")[1]))
    return [*earlier, *([run_dir / "train.log"] if (run_dir / "train.log").exists() else [])]


def summary(result: dict[str, Any]) -> str:
    """One line: BLEU, chrF and perplexity (of every point of a T + K run)."""
    points = result.get("points") or {"": result}
    return (
        "; ".join(
            f"{'K=' + k + ': ' if k else ''}BLEU {p['bleu']:.2f}, chrF {p['chrf']:.2f}, "
            f"valid ppl {p['valid_ppl']}"
            for k, p in points.items()
        )
        + f" ({result.get('seconds', 0):.0f} s"
        + (
            f"; made again in {result['seconds_again']:.0f} s)"
            if "seconds_again" in result
            else ")"
        )
    )


def hypotheses(result: dict[str, Any]) -> list[str]:
    """The hypothesis files of a result (relative to the study's directory), a T + K run's
    one per K."""
    found = [result["hyps"]] if "hyps" in result else []
    for point in result.get("points", {}).values():
        found += hypotheses(point)
    return found


class Record:
    """The study's committed record: ``docs/relaxed_nmt.json`` (every finished run's result
    with its settings, and the paired bootstraps' p-values) and, beside it, ``relaxed_nmt_hyps/`` (each evaluation's hypotheses,
    gzipped, written once: the paired bootstrap needs them after the run directories are
    gone). ``path`` None: no record."""

    def __init__(self, path: Path | None):
        self.path = path
        self.results: dict[str, dict[str, Any]] = {}
        self.pvalues: dict[str, float] = {}  # paired bootstraps (relaxed_report.bootstrap_key)
        if path is not None and path.exists():
            found = json.loads(path.read_text(encoding="utf-8"))
            self.results = {r["run"]: r for r in found.get("results", [])}
            self.pvalues = dict(found.get("bootstrap", {}))

    @property
    def hyps_dir(self) -> Path | None:
        return None if self.path is None else self.path.with_name(f"{self.path.stem}_hyps")

    def kept(self, hyps: str) -> Path | None:
        return None if self.hyps_dir is None else self.hyps_dir / f"{hyps}.gz"

    def keeps(self, hyps: str) -> bool:
        """Whether the record keeps the hypotheses ``hyps``."""
        kept = self.kept(hyps)
        return kept is not None and kept.exists()

    def restore(self, name: str, settings: dict[str, Any], out: Path) -> dict[str, Any] | None:
        """The recorded result of run ``name`` if it ran with ``settings``, written back to
        ``out/name/result.json`` with the hypotheses the record keeps."""
        from recurnmt.experiments.artifacts import portable

        result = self.results.get(name)
        if result is None or result.get("settings") != portable(settings):  # as it was written
            return None
        result = {**result, "settings": settings}  # as RUN/result.json holds them
        (out / name).mkdir(parents=True, exist_ok=True)
        for hyps in hypotheses(result):
            kept = self.kept(hyps)
            if kept is not None and kept.exists():
                (out / hyps).write_bytes(gzip.decompress(kept.read_bytes()))
        write_result(out / name, result)
        return result

    def keep(self, results: list[dict[str, Any]], out: Path) -> int:
        """Keeps the hypotheses of ``results`` not kept yet (gzipped, mtime 0: the same bytes
        for the same text); returns how many were added."""
        added = 0
        for hyps in (h for r in results for h in hypotheses(r)):
            kept, made = self.kept(hyps), out / hyps
            if kept is None or kept.exists() or not made.exists():
                continue
            kept.parent.mkdir(parents=True, exist_ok=True)
            kept.write_bytes(gzip.compress(made.read_bytes(), compresslevel=9, mtime=0))
            added += 1
        return added
