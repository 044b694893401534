"""The relaxed-recursion study's runs, one method per kind (:mod:`studies.relaxed.study` says
what each is for and in which order they run): the teacher trained to its plateau, and trained
again where only its recorded result is here (refused unless it is the recorded one); the
conversions and their fine-tuning; the controls (from scratch for K and for T + K updates, the
teacher continued and re-warmed). Each is a :class:`~studies.plan.Run`: its name, the settings
its result depends on (:class:`~studies.relaxed.setup.Setup`) and its work.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

from recurnmt.cli import UserError
from recurnmt.experiments.fairseq_log import log_records
from studies.plan import Record, Run, Runner, machine, train_logs, write_result
from studies.relaxed.setup import RELAXED, TEACHER, Cell, Setup, distilled, p_star, relaxed_flags


class Runs(Setup, Runner):
    """The study's runs: :class:`~studies.relaxed.setup.Setup`'s settings and commands, run by
    :class:`~studies.plan.Runner` (the plan's order is :class:`~studies.relaxed.study.Study`'s)."""

    def __init__(self, args: argparse.Namespace):
        super().__init__(args)
        self.record = Record(getattr(args, "record", None))
        self.made: set[str] = set()  # the runs this study has run
        self.again: dict[str, dict[str, Any]] = {}

    def train_data(self) -> Path:
        """The corpus the students train on: the real one, or with ``--distill`` the
        teacher's translations of its training set (made once, after the teacher)."""
        if not self.args.distill:
            return self.args.data
        return distilled(self.teacher_checkpoint(), self.out / "distilled", self.args)

    # -- the teacher -------------------------------------------------------------------------

    @property
    def teacher_dir(self) -> Path:
        return self.out / "teacher"

    def teacher_run(self) -> Run:
        def body(run_dir: Path) -> dict[str, Any]:
            a = self.args
            plateau = [
                "--validate-interval-updates", str(self.args.interval), "--save-interval-updates",
                str(self.args.interval), "--keep-interval-updates", "1", "--validate-interval", "1000",
                "--save-interval", "1000", "--patience", str(a.patience),
            ]  # fmt: skip
            log = self.train(TEACHER, [*self.size(), *self.teacher_recipe(a.max_update), *plateau],
                             run_dir)  # fmt: skip
            records = [r for path in train_logs(run_dir) for r in log_records(path, "valid")]
            curve = sorted({int(float(r["num_updates"])): float(r["loss"])
                            for r in records if "num_updates" in r}.items())  # fmt: skip
            if not curve:
                raise UserError(f"the teacher's log {log} holds no validation")
            best_updates, best_loss = min(curve, key=lambda c: (c[1], c[0]))
            for extra in (run_dir / "checkpoints").glob("checkpoint_*_*.pt"):
                extra.unlink()
            found = self.evaluate(run_dir / "checkpoints" / "checkpoint_best.pt", run_dir)
            return {
                "kind": "teacher", "p_star": p_star(TEACHER, self.size()),
                "updates": best_updates, "best_valid_loss": best_loss,
                "stopped_at": curve[-1][0], "curve": curve, **found,
            }  # fmt: skip

        return Run("teacher", self.teacher_settings(), body, self.args.max_update)

    @property
    def teacher_best(self) -> Path:
        """Where the teacher's best checkpoint is (whether or not it is here)."""
        return self.teacher_dir / "checkpoints" / "checkpoint_best.pt"

    def teacher_result(self) -> dict[str, Any]:
        return json.loads((self.teacher_dir / "result.json").read_text(encoding="utf-8"))

    def teacher_checkpoint(self) -> Path:
        """The teacher's best checkpoint; trained again when only its result is here (taken
        from the record in a new checkout), and refused unless the new teacher is the recorded
        one (the same validation curve and test BLEU): the runs that start from it would
        otherwise mix two teachers. A teacher recorded with another :func:`machine` is refused
        before training (the same lock on another CPU gave another teacher)."""
        path = self.teacher_best
        if path.exists() or not (self.teacher_dir / "result.json").exists():
            return path
        recorded = self.teacher_result()
        made_on, here = recorded.get("machine"), machine()
        if made_on is not None and made_on != here:  # refused in seconds, not after an hour
            shown = "; ".join(f"{k} {made_on.get(k)} there, {here.get(k)} here"
                              for k in here if made_on.get(k) != here[k])  # fmt: skip
            raise UserError(
                f"the recorded teacher was trained on another machine ({shown}): trained again "
                "here it would not be the recorded one, so the runs that start from it cannot "
                "go on here; --teacher-free runs the others, --fresh redoes the study"
            )
        print("[teacher] its checkpoint is not here: training it again", flush=True)
        again = self.execute(self.teacher_run())
        same = ("curve", "updates", "bleu", "chrf")
        if any(json.loads(json.dumps(again[k])) != recorded[k] for k in same):
            write_result(self.teacher_dir, recorded)
            raise UserError(
                f"the teacher trained again here is not the recorded one (best validation loss "
                f"{again['best_valid_loss']} at update {again['updates']}, sacreBLEU {again['bleu']}"
                f"; recorded: {recorded['best_valid_loss']} at {recorded['updates']}, "
                f"{recorded['bleu']}): the runs that start from it cannot go on; --fresh "
                "redoes the study"
            )
        return path

    # -- the conversions and their fine-tuning ----------------------------------------------

    def cell_fields(self, cell: Cell) -> dict[str, Any]:
        """What the result of a run of ``cell``'s architecture says of it."""
        flags = [*self.size(), *relaxed_flags(cell.unique, cell.rank)]
        return {"unique": cell.unique, "init": cell.init, "rank": cell.rank,
                "p_star": p_star(RELAXED, flags)}  # fmt: skip

    def converted_path(self, cell: Cell) -> Path:
        return self.out / "convert" / cell.name / "converted.pt"

    def convert(self, cell: Cell):
        """``recurnmt-convert`` of the teacher to ``cell`` (its result: ``ConversionResult``)."""
        from recurnmt.nmt.convert import convert

        return convert(
            self.teacher_checkpoint(), self.converted_path(cell), arch=RELAXED,
            encoder_unique_layers=cell.unique, decoder_unique_layers=cell.unique,
            init=cell.init, level_lora_rank=cell.rank, layer_norms="per-level", force=True,
        )  # fmt: skip

    def conversion(self, cell: Cell) -> Path:
        """The converted checkpoint of ``cell``, converted again when only its result is here
        (the teacher it comes from checked against the record first)."""
        path = self.converted_path(cell)
        if not path.exists():
            print(f"[convert/{cell.name}] its checkpoint is not here: converting again", flush=True)
            self.convert(cell)
        return path

    def convert_run(self, cell: Cell) -> Run:
        def body(run_dir: Path) -> dict[str, Any]:
            conv = self.convert(cell)
            found = self.evaluate(conv.out, run_dir)
            return {
                "kind": "converted", **self.cell_fields(cell), "updates": 0,
                "max_logit_difference": conv.max_logit_difference,
                "energy_kept": conv.energy_kept, **found,
            }  # fmt: skip

        return Run(f"convert/{cell.name}", self.dependent(cell=cell.name), body, 0)

    def tune_run(self, cell: Cell, k: int, lr: float, seed: int, teacher_distill=0.0) -> Run:
        """Fine-tuning a conversion; with ``teacher_distill`` W, word-level distillation from
        the teacher (the criterion's ``--teacher-distill``, Kim & Rush 2016) in its loss."""
        kd = {"teacher_distill": teacher_distill} if teacher_distill else {}

        def body(run_dir: Path) -> dict[str, Any]:
            distill = ["--teacher-checkpoint", str(self.teacher_checkpoint()),
                       "--teacher-distill", f"{teacher_distill:g}"] if kd else []  # fmt: skip
            flags = [*self.size(), *relaxed_flags(cell.unique, cell.rank),
                     *self.tune_recipe(k, lr, seed), *distill,
                     "--finetune-from-model", str(self.conversion(cell))]  # fmt: skip
            self.train(RELAXED, flags, run_dir, self.train_data())
            found = self.evaluate(run_dir / "checkpoints" / "checkpoint_last.pt", run_dir)
            return {"kind": "fine-tuned + KD" if kd else "fine-tuned", **self.cell_fields(cell),
                    "k": k, "lr": lr, "seed": seed, "updates": k, **found, **kd}  # fmt: skip

        name = f"tune/{cell.name}/k{k}/lr{lr:g}/s{seed}"
        if kd:
            name = f"tune-kd/{cell.name}/k{k}/lr{lr:g}/w{teacher_distill:g}/s{seed}"
        settings = self.dependent(
            cell=cell.name, k=k, lr=lr, seed=seed, **self.tune_settings(), **kd
        )
        return Run(name, settings, body, k)

    # -- the controls ------------------------------------------------------------------------

    def scratch_run(self, unique: int, rank: str, k: int, seed: int) -> Run:
        def body(run_dir: Path) -> dict[str, Any]:
            flags = [*self.size(), *relaxed_flags(unique, rank), *self.short_recipe(k, seed)]
            self.train(RELAXED, flags, run_dir, self.train_data())
            found = self.evaluate(run_dir / "checkpoints" / "checkpoint_last.pt", run_dir)
            fields = self.cell_fields(Cell(unique, "-", rank))
            return {**fields, "kind": "scratch K", "k": k, "seed": seed, "updates": k, **found}

        settings = self.base_settings() | {
            "arch": f"m{unique}-r{rank}", "k": k, "seed": seed, "lr": self.args.lr,
            "dropout": self.args.dropout, "distill": self.args.distill,
        }  # fmt: skip
        return Run(f"scratch/m{unique}-r{rank}/k{k}/s{seed}", settings, body, k)

    def total_run(self, unique: int, rank: str, seed: int) -> Run:
        """From scratch with the teacher's recipe for T + K updates, evaluated at every K."""
        budgets = sorted(self.args.budgets)

        def body(run_dir: Path) -> dict[str, Any]:
            t = self.teacher_result()["updates"]
            saves = ["--save-interval-updates", str(self.args.interval), "--validate-interval-updates",
                     "0", "--disable-validation"]  # fmt: skip
            flags = [*self.size(), *relaxed_flags(unique, rank),
                     *self.teacher_recipe(t + budgets[-1], seed), *saves]  # fmt: skip
            self.train(RELAXED, flags, run_dir, self.train_data())
            ckpts = run_dir / "checkpoints"
            wanted = {t + k: k for k in budgets}
            points = {}
            for path in sorted(ckpts.glob("checkpoint_*_*.pt")):
                updates = int(path.stem.rsplit("_", 1)[1])
                if updates in wanted:
                    points[wanted[updates]] = self.evaluate(path, run_dir, f"-k{wanted[updates]}")
                path.unlink()
            missing = sorted(set(budgets) - set(points))
            if missing:
                raise UserError(f"{run_dir}: no checkpoint at T + K for K = {missing}")
            fields = self.cell_fields(Cell(unique, "-", rank))
            return {**fields, "kind": "scratch T+K", "seed": seed, "teacher_updates": t,
                    "points": {str(k): v for k, v in points.items()}}  # fmt: skip

        settings = self.dependent(arch=f"m{unique}-r{rank}", seed=seed, budgets=budgets,
                                  distill=self.args.distill)  # fmt: skip
        t_guess = self.args.max_update
        return Run(f"total/m{unique}-r{rank}/s{seed}", settings, body, t_guess + budgets[-1])

    def continued_run(self, k: int) -> Run:
        def body(run_dir: Path) -> dict[str, Any]:
            t = self.teacher_result()["updates"]
            ckpts = run_dir / "checkpoints"
            ckpts.mkdir(parents=True, exist_ok=True)  # its run saves nothing before the end
            shutil.copy(self.teacher_checkpoint(), ckpts / "checkpoint_last.pt")
            flags = [*self.size(), *self.teacher_recipe(t + k), "--validate-interval", "1000",
                     "--save-interval", "1000"]  # fmt: skip
            self.train(TEACHER, flags, run_dir)
            found = self.evaluate(ckpts / "checkpoint_last.pt", run_dir)
            return {"kind": "teacher continued", "p_star": p_star(TEACHER, self.size()),
                    "k": k, "seed": 1, "updates": k, **found}  # fmt: skip

        return Run(f"continued/k{k}", self.dependent(k=k), body, k)

    def rewarmed_run(self, k: int, lr: float, seed: int) -> Run:
        def body(run_dir: Path) -> dict[str, Any]:
            flags = [*self.size(), *self.tune_recipe(k, lr, seed),
                     "--finetune-from-model", str(self.teacher_checkpoint())]  # fmt: skip
            self.train(TEACHER, flags, run_dir, self.train_data())
            found = self.evaluate(run_dir / "checkpoints" / "checkpoint_last.pt", run_dir)
            return {"kind": "teacher re-warmed", "p_star": p_star(TEACHER, self.size()),
                    "k": k, "lr": lr, "seed": seed, "updates": k, **found}  # fmt: skip

        settings = self.dependent(k=k, lr=lr, seed=seed, **self.tune_settings())
        return Run(f"rewarmed/k{k}/lr{lr:g}/s{seed}", settings, body, k)
