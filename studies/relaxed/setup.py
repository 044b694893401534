"""What every run of the relaxed-recursion study (:mod:`studies.relaxed.study`) shares: its
cells (M blocks a side, an init, a LoRA rank), the settings a run's result depends on, the
training recipes, and the one way every model is trained and evaluated
(:meth:`Setup.evaluate`); and the teacher's translations of the training set as a corpus
(``--distill``: :func:`distilled`).
"""

from __future__ import annotations

import argparse
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
from studies.plan import train_logs

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


class Setup:
    """The study's settings over one prepared corpus (``args``: scripts/relaxed_nmt.py's options,
    with ``data`` and ``langs`` resolved): its cells, what each run depends on, the recipes,
    and the commands every run trains and evaluates with."""

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

    # -- settings ----------------------------------------------------------------------------

    def base_settings(self) -> dict[str, Any]:
        """What every run depends on: the corpus, the size, the evaluation."""
        keys = ("embed_dim", "ffn_dim", "heads", "levels", "max_tokens", "beam", "lenpen", "nproc")
        return {k: getattr(self.args, k) for k in keys} | {"data": str(self.args.data)}

    def teacher_settings(self) -> dict[str, Any]:
        a = self.args
        keys = ("lr", "warmup", "dropout", "patience", "max_update", "interval")
        return self.base_settings() | {k: getattr(a, k) for k in keys} | {"seed": 1}

    def dependent(self, **extra: Any) -> dict[str, Any]:
        """Settings of a run that starts from the teacher (or is measured against its T)."""
        return self.base_settings() | {"teacher": self.teacher_settings(), **extra}

    def tune_settings(self) -> dict[str, Any]:
        return {"tune_warmup": self.args.tune_warmup, "distill": self.args.distill}

    # -- recipes -----------------------------------------------------------------------------

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
