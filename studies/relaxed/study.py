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
conversion) is made again and checked against the record (:meth:`~studies.relaxed.runs.Runs.teacher_checkpoint`).
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

Every model is evaluated alike (:meth:`~studies.relaxed.setup.Setup.evaluate`):
``fairseq-generate`` on the test set (beam 4, length penalty 1.5, sentencepiece removed;
detokenized sacreBLEU and chrF against the raw references, hypotheses kept for the paired
bootstrap) and ``fairseq-validate`` on the validation set.

The parts: :mod:`studies.relaxed.setup` (the cells, settings, recipes, training and
evaluation), :mod:`studies.relaxed.runs` (each kind of run), this module (their order, and
what waits or is made again).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from studies.plan import Run, hypotheses
from studies.relaxed.runs import Runs


class Study(Runs):
    """The study: its runs (:class:`~studies.relaxed.runs.Runs`) in the plan's order, the
    fine-tuning lr the selection chose, and the runs ``--teacher-free`` leaves and
    ``--recover-hypotheses`` makes again."""

    def __init__(self, args: argparse.Namespace):
        super().__init__(args)
        self._untested: set[str] | None = None

    def chosen_lr(self) -> float | None:
        """The fine-tuning lr with the lowest validation perplexity at the smallest K on the first
        main cell (None: not all of the selection has run)."""
        found = [self.stored(self.tune_run(self.main[0], self.selection_k, lr, 1))
                 for lr in self.args.tune_lrs]  # fmt: skip
        if any(r is None for r in found):
            return None
        return min(found, key=lambda r: (r["valid_ppl"], r["lr"]))["lr"]

    def planned(self) -> bool:
        """The stages after the selection plan nothing until it has run (:meth:`chosen_lr`)."""
        return self.chosen_lr() is not None

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
