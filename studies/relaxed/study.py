"""The relaxed-recursion study on the axis the method claims: a trained transformer (a sunk
cost) converted into relaxed recursive models and uptrained, against the same models trained
from scratch (Relaxed Recursive Transformers, Bae et al., ICLR 2025, Sec. 3-4: uptraining
from a pretrained model at a small budget).

Every run is a real ``fairseq-train`` / ``recurnmt-convert`` / ``fairseq-generate`` command
with its log in its run directory; a finished run (``RUN/result.json``) is reused while the
settings it depends on are unchanged, and an interrupted one goes on from its last checkpoint
(the teacher and the T + K runs save one every 350 updates), so the study can be stopped and
resumed (``scripts/relaxed_nmt.py --hours H`` stops starting runs after H hours). It also goes
on in a checkout without its run directories: a run finished there is taken from the committed
record (``docs/relaxed_nmt.json``, its hypotheses from ``docs/relaxed_nmt_hyps/``) while its
settings are unchanged, and what a later run needs of it (the teacher's checkpoint, a
conversion) is made again and checked against the record (:meth:`Study.teacher_checkpoint`).
The runs, in the order they execute (the main comparison first, so a partial study is already
a complete comparison for its main cells):

1. ``teacher``: fairseq's ``transformer`` (H=128, FF=512, 4 heads, 6 layers, pre-LN, shared
   embeddings) trained to its plateau: Adam at lr 3e-3, inverse-sqrt decay after 400 warm-up
   updates, dropout 0.1, validated every ``--interval`` (350) updates, stopped after ``--patience``
   validations without a lower validation loss; its best checkpoint (update T) is the teacher.
2. ``convert/CELL``: ``recurnmt-convert`` of the teacher to every cell: M blocks a side looped
   in a cycle, an init (average, stepwise or lower: Bae et al. Sec. 3.2), per-level LoRA rank
   r (0, 8, 32 or full; SVD-initialised, Sec. 3.3), evaluated as converted.
3. ``tune/CELL/kK/lrLR/sS``: the conversion fine-tuned for K updates with a recipe of its own
   (``--finetune-from-model``: a fresh optimizer; ``--tune-warmup`` warm-up updates to peak
   lr LR, linear decay to 0 over K); LR chosen on validation perplexity at the smallest K on the
   first main cell among ``--tune-lrs`` (the ``recipe`` stage).
4. Controls at every K: ``scratch/M-rR/kK/sS`` (the relaxed architecture from scratch for K
   updates, the short recipe: lr 3e-3, K/7 warm-up updates, linear decay), ``total/M-rR/sS``
   (the relaxed architecture from scratch with the teacher's own recipe for T + K updates:
   equal total budget; one run, evaluated at every T + K), ``continued/kK`` (the teacher's
   own training resumed from its best checkpoint, optimizer and schedule included, for K
   more updates) and ``rewarmed/kK/lrLR/sS`` (the teacher fine-tuned with the fine-tuning
   recipe: what restarting costs, without converting).
5. ``tune/CELL/...`` and ``scratch/...`` for every other cell (seed 1): at the middle K before
   the main cells' second and third seeds, at the other budgets after them.

Every model is evaluated alike (:func:`evaluate`): ``fairseq-generate`` on the test set
(beam 4, length penalty 1.5, sentencepiece removed; detokenized sacreBLEU and chrF against
the raw references, hypotheses kept for the paired bootstrap) and ``fairseq-validate`` on
the validation set.
"""

from __future__ import annotations

import argparse
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recurnmt.cli import UserError
from recurnmt.experiments.commands import (
    fairseq_tool,
    generate_command,
    run_logged,
    train_command,
    user_dir,
)
from recurnmt.experiments.experiment import decoding_flags, recipe_flags, run_flags, size_flags
from recurnmt.experiments.fairseq_log import log_records
from recurnmt.experiments.launch import cpu_train_command
from studies.plan import (
    Record,
    Run,
    Runner,
    hypotheses,
    machine,
    train_logs,
    write_result,
)

TEACHER = "transformer"  # fairseq's own
RELAXED = "relaxed_transformer"
INITS = ("stepwise", "average", "lower")


@dataclass(frozen=True)
class Cell:
    """One conversion: M blocks a side, an init, a LoRA rank (``"full"``: the width)."""

    unique: int
    init: str
    rank: str

    @property
    def name(self) -> str:
        return f"m{self.unique}-{self.init}-r{self.rank}"

    @property
    def arch_name(self) -> str:
        """The relaxed architecture (the init does not change it)."""
        return f"m{self.unique}-r{self.rank}"


def relaxed_flags(unique: int, rank: str) -> list[str]:
    """The relaxed architecture's own flags (both sides alike)."""
    return [
        "--encoder-unique-layers", str(unique), "--decoder-unique-layers", str(unique),
        "--sharing-scheme", "cycle", "--level-lora-rank", str(rank), "--layer-norms", "per-level",
    ]  # fmt: skip


def p_star(arch: str, flags: list[str]) -> int:
    """P* (RingFormer Table 1: embeddings and head excluded) of ``arch`` with ``flags``."""
    from recurnmt.nmt.build import build_model
    from recurnmt.parameters import parameter_report

    return parameter_report(build_model(arch, [*flags, "--share-all-embeddings"])[0]).p_star


class Study(Runner):
    """The study's runs over one prepared corpus (``args``: scripts/relaxed_nmt.py's options,
    with ``data`` and ``langs`` resolved)."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.selection_k = min(args.budgets)  # the fine-tuning lr is chosen at this K
        self.out: Path = args.out
        self.cells = [
            Cell(m, i, str(r)) for m in args.unique for i in args.inits for r in args.ranks
        ]
        self.main = [Cell(m, args.main_init, str(args.main_rank)) for m in args.unique]
        for cell in self.main:
            if cell not in self.cells:
                self.cells.append(cell)
        self.record = Record(getattr(args, "record", None))
        self.made: set[str] = set()  # the runs this study has run
        self.again: dict[str, dict[str, Any]] = {}
        self._untested: set[str] | None = None

    # -- settings and recipes ----------------------------------------------------------------

    def base_settings(self) -> dict[str, Any]:
        """What every run depends on: the corpus, the size, the evaluation."""
        keys = ("embed_dim", "ffn_dim", "heads", "levels", "max_tokens", "beam", "lenpen", "nproc")
        return {k: getattr(self.args, k) for k in keys} | {"data": str(self.args.data)}

    def teacher_settings(self) -> dict[str, Any]:
        a = self.args
        keys = ("lr", "warmup", "dropout", "patience", "max_update", "interval")
        return self.base_settings() | {k: getattr(a, k) for k in keys} | {"seed": 1}

    def size(self) -> list[str]:
        return size_flags(argparse.Namespace(**vars(self.args), pre_ln=True))

    def recipe(self, updates: int, *, lr: float, warmup: int, schedule: str, seed: int):
        """fairseq flags of a training recipe (shared embeddings, Adam, label smoothing)."""
        a = self.args
        values = dict(
            lr=lr, warmup=warmup, lr_scheduler=schedule, max_update=updates, seed=seed,
            dropout=a.dropout, max_tokens=a.max_tokens, nproc=a.nproc,
        )  # fmt: skip
        return recipe_flags(argparse.Namespace(**values))

    def teacher_recipe(self, updates: int, seed: int = 1) -> list[str]:
        """The teacher's own recipe: inverse-sqrt decay after ``--warmup`` updates."""
        a = self.args
        return self.recipe(updates, lr=a.lr, warmup=a.warmup, schedule="inverse_sqrt", seed=seed)

    def short_recipe(self, updates: int, seed: int) -> list[str]:
        """Training from scratch for a short budget: linear decay to 0 over it, K/7 warm-up
        (the demo's 200 of 1,400)."""
        warmup = max(1, updates // 7)
        return self.recipe(
            updates, lr=self.args.lr, warmup=warmup, schedule="polynomial_decay", seed=seed
        )

    def tune_recipe(self, updates: int, lr: float, seed: int) -> list[str]:
        """Fine-tuning: ``--tune-warmup`` warm-up updates to ``lr``, linear decay to 0."""
        warmup = min(self.args.tune_warmup, max(1, updates // 2))
        return self.recipe(updates, lr=lr, warmup=warmup, schedule="polynomial_decay", seed=seed)

    # -- commands ----------------------------------------------------------------------------

    def train(self, arch: str, flags: list[str], run_dir: Path, data: Path | None = None):
        """Trains ``arch`` with ``flags`` into ``run_dir/checkpoints``; returns the log."""
        cmd = train_command(
            data or self.args.data,
            arch,
            [*flags, *run_flags(run_dir / "checkpoints")],
            start=cpu_train_command(self.args.nproc),
        )
        log = run_dir / "train.log"
        if log.exists():  # an interrupted attempt's log, kept: train-1.log, train-2.log, ...
            log.rename(run_dir / f"train-{len(train_logs(run_dir))}.log")
        run_logged(cmd, log)
        return log

    def evaluate(self, checkpoint: Path, run_dir: Path, tag: str = "") -> dict[str, Any]:
        """sacreBLEU and chrF on the test set (hypotheses kept in ``hyp{tag}.txt``),
        perplexity on the validation set."""
        import sacrebleu

        from recurnmt.experiments.scoring import read_hypotheses

        a = self.args
        out = run_dir / f"generate{tag}.txt"
        gen = generate_command(a.data, checkpoint, decoding_flags(a.beam, a.lenpen))
        run_logged(gen, run_dir / f"generate{tag}.log", stdout=out)
        hyps = read_hypotheses(out.read_text(encoding="utf-8").splitlines(), "D")
        (run_dir / f"hyp{tag}.txt").write_text("\n".join(hyps) + "\n", encoding="utf-8")
        refs = (a.data / f"test.raw.{a.langs[1]}").read_text(encoding="utf-8").splitlines()
        bleu, chrf = sacrebleu.metrics.BLEU(), sacrebleu.metrics.CHRF()
        validate = [
            *fairseq_tool("validate"), str(a.data), "--task", "translation",
            "--user-dir", str(user_dir()), "--path", str(checkpoint), "--valid-subset", "valid",
            "--max-tokens", "8000", "--cpu",
        ]  # fmt: skip
        run_logged(validate, run_dir / f"validate{tag}.log")
        found = log_records(run_dir / f"validate{tag}.log", "valid")
        ppl = float(found[-1]["ppl"]) if found and "ppl" in found[-1] else None
        out.unlink()  # the hypotheses are kept; fairseq's full output is not needed again
        return {
            "bleu": round(bleu.corpus_score(hyps, [refs]).score, 2),
            "chrf": round(chrf.corpus_score(hyps, [refs]).score, 2),
            "valid_ppl": ppl,
            "hyps": str((run_dir / f"hyp{tag}.txt").relative_to(self.out)),
            "bleu_signature": str(bleu.get_signature()),
        }

    def train_data(self) -> Path:
        """The corpus the students train on: the real one, or with ``--distill`` the
        teacher's translations of its training set (made once, after the teacher)."""
        if not self.args.distill:
            return self.args.data
        return distilled(self.teacher_checkpoint(), self.out / "distilled", self.args)

    # -- the runs ----------------------------------------------------------------------------

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

    def dependent(self, **extra: Any) -> dict[str, Any]:
        """Settings of a run that starts from the teacher (or is measured against its T)."""
        return self.base_settings() | {"teacher": self.teacher_settings(), **extra}

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

    def cell_fields(self, cell: Cell) -> dict[str, Any]:
        flags = [*self.size(), *relaxed_flags(cell.unique, cell.rank)]
        return {"unique": cell.unique, "init": cell.init, "rank": cell.rank,
                "p_star": p_star(RELAXED, flags)}  # fmt: skip

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

    def tune_settings(self) -> dict[str, Any]:
        return {"tune_warmup": self.args.tune_warmup, "distill": self.args.distill}

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

    # -- the plan ----------------------------------------------------------------------------

    def chosen_lr(self) -> float | None:
        """The fine-tuning lr with the lowest validation perplexity at the smallest K on the first
        main cell (None: not all of the selection has run)."""
        found = [self.stored(self.tune_run(self.main[0], self.selection_k, lr, 1))
                 for lr in self.args.tune_lrs]  # fmt: skip
        if any(r is None for r in found):
            return None
        return min(found, key=lambda r: (r["valid_ppl"], r["lr"]))["lr"]

    def stages(self) -> list[Callable[[], list[Run]]]:
        """The plan in order; a stage's runs start when the ones before it have all run (the
        fine-tuning lr is chosen by the selection: without it, the stages that need it plan
        nothing)."""
        a = self.args
        seeds, first = a.seeds, a.seeds[:1]
        ks = sorted(set(a.budgets))
        ks.insert(0, ks.pop(len(ks) // 2))  # the middle budget first: the main comparison

        def selection() -> list[Run]:
            return [self.tune_run(self.main[0], self.selection_k, lr, 1) for lr in a.tune_lrs]

        def main(seed_list: list[int]) -> Callable[[], list[Run]]:
            def plan() -> list[Run]:
                lr = self.chosen_lr()
                runs = []
                if lr is None:  # the selection has not run
                    return runs
                for k in ks:
                    for seed in seed_list:
                        for cell in self.main:
                            runs.append(self.tune_run(cell, k, lr, seed))
                            runs.append(self.scratch_run(cell.unique, cell.rank, k, seed))
                        runs.append(self.rewarmed_run(k, lr, seed))
                    if seed_list == first:
                        runs.append(self.continued_run(k))
                for seed in seed_list:
                    runs += [self.total_run(c.unique, c.rank, seed) for c in self.main]
                return runs

            return plan

        def distillation() -> list[Run]:
            """Does word-level distillation from the teacher help fine-tuning? The main cells
            at the middle K, seed 1, with it (against the same runs without, which main runs
            first): three short runs, before main's long T + K runs."""
            lr, w = self.chosen_lr(), a.teacher_distill
            return [self.tune_run(c, ks[0], lr, 1, w) for c in self.main] if w and lr else []

        def grid(budgets: list[int]) -> Callable[[], list[Run]]:
            """Every other conversion fine-tuned at ``budgets`` (seed 1), beside its
            architecture from scratch."""

            def plan() -> list[Run]:
                lr = self.chosen_lr()
                if lr is None:  # the selection has not run
                    return []
                main_archs = {(m.unique, m.rank) for m in self.main}
                archs = list(dict.fromkeys((c.unique, c.rank) for c in self.cells))
                archs = [a for a in archs if a not in main_archs]
                runs = []
                for k in budgets:
                    runs += [self.tune_run(c, k, lr, first[0]) for c in self.cells
                             if c not in self.main]  # fmt: skip
                    runs += [self.scratch_run(m, r, k, first[0]) for m, r in archs]
                return runs

            return plan

        # the other inits and ranks at the middle K come before the main cells' later seeds:
        # which init and rank uptrain best is a question the first seed leaves open, a second
        # seed of a control it has already answered narrows it
        return [
            lambda: [self.teacher_run()],
            lambda: [self.convert_run(c) for c in self.cells],
            selection,
            distillation,
            main(first),
            grid(ks[:1]),
            main(seeds[1:]),
            grid(ks[1:]),
        ]

    def needs_teacher(self, run: Run) -> bool:
        """Whether ``run`` starts from the teacher's checkpoint (or, with ``--distill``, from its
        translations): everything but the teacher itself and the students trained from
        scratch on the real corpus."""
        kind = run.name.split("/", 1)[0]
        return kind != "teacher" and (kind not in ("scratch", "total") or self.args.distill)

    WAITS = "they need the teacher's checkpoint"

    def waits(self, run: Run) -> bool:
        """``--teacher-free`` (``args.teacher_free``) and ``run`` needs a teacher's checkpoint
        this checkout lacks: hours of the study in a new checkout without first training the
        teacher again."""
        if not getattr(self.args, "teacher_free", False) or not self.needs_teacher(run):
            return False
        return not self.teacher_best.exists()

    def recovers(self, run: Run, result: dict[str, Any]) -> bool:
        """``--recover-hypotheses``: a run of a comparison without its paired bootstrap whose
        hypotheses are neither here nor in the record (it finished before the study kept
        them) is made again, and its hypotheses are kept if it reproduces the record."""
        if not getattr(self.args, "recover_hypotheses", False):
            return False
        if self._untested is None:
            from studies.relaxed.report import untested

            self._untested = untested(list(self.record.results.values()), self)
        gone = [h for h in hypotheses(result) if not (self.out / h).exists()
                and not self.record.keeps(h)]  # fmt: skip
        return run.name in self._untested and bool(gone) and result.get("reproduced") is None


def distilled(teacher: Path, out: Path, args: argparse.Namespace) -> Path:
    """The corpus with the teacher's translations of the training set as targets (Kim & Rush
    2016, sequence-level distillation), binarized with the corpus's own dictionaries; made
    once per teacher (its checkpoint's size and time stamp the result)."""
    stat = teacher.stat()
    stamp = json.dumps({"teacher": str(teacher), "size": stat.st_size, "mtime": stat.st_mtime,
                        "beam": args.beam, "lenpen": args.lenpen}, sort_keys=True)  # fmt: skip
    if (out / "done").exists() and (out / "done").read_text(encoding="utf-8") == stamp:
        return out
    shutil.rmtree(out, ignore_errors=True)
    (out / "text").mkdir(parents=True)
    src, tgt = args.langs
    extra = ["--gen-subset", "train", "--post-process", "none"]  # pieces, as binarized
    gen = generate_command(args.data, teacher, [*decoding_flags(args.beam, args.lenpen), *extra])
    run_logged(gen, out / "generate.log", stdout=out / "generate-train.txt")
    lines = (out / "generate-train.txt").read_text(encoding="utf-8").splitlines()
    pairs = {}
    for kind, side in (("S", src), ("H", tgt)):
        found = {}
        for line in lines:
            if line.startswith(f"{kind}-"):
                key, *_, text = line.split("\t")
                found[int(key[2:])] = text
        pairs[side] = [found[i] for i in sorted(found)]
    for side, text in pairs.items():
        (out / "text" / f"train.{side}").write_text("\n".join(text) + "\n", encoding="utf-8")
    preprocess = [
        *fairseq_tool("preprocess"), "--source-lang", src, "--target-lang", tgt,
        "--trainpref", str(out / "text" / "train"), "--destdir", str(out),
        "--srcdict", str(args.data / f"dict.{src}.txt"),
        "--tgtdict", str(args.data / f"dict.{tgt}.txt"), "--workers", "1",
    ]  # fmt: skip
    run_logged(preprocess, out / "preprocess.log")
    for path in args.data.glob("valid.*"):
        shutil.copy(path, out / path.name)
    (out / "done").write_text(stamp, encoding="utf-8")
    print(f"[distilled] {len(pairs[src]):,} training pairs with the teacher's targets", flush=True)
    return out
