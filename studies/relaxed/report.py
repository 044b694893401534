"""The relaxed-recursion study's page (:mod:`studies.relaxed.study`): its tables, the
verdicts computed from them, paired bootstrap tests and the plot, from the finished runs.

A study stopped part-way still gets a page: every table holds what has run, the verdicts
count only complete comparisons, and the page says how many runs are still to do.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from studies.plan import LATER

Result = dict[str, Any]


def by_kind(results: Iterable[Result], kind: str) -> list[Result]:
    return [r for r in results if r["kind"] == kind]


def points(results: list[Result]) -> list[Result]:
    """The results with every ``scratch T+K`` run split into one result per K."""
    out = []
    for r in results:
        if r["kind"] != "scratch T+K":
            out.append(r)
            continue
        for k, found in r["points"].items():
            updates = r["teacher_updates"] + int(k)
            base = {key: v for key, v in r.items() if key != "points"}
            out.append({**base, **found, "k": int(k), "updates": updates})
    return out


def at_chosen_lr(results: list[Result], lr: float | None) -> list[Result]:
    """The results without the fine-tuning runs at an lr the selection did not choose."""
    tuned = ("fine-tuned", "fine-tuned + KD", "teacher re-warmed")
    return [r for r in results if r["kind"] not in tuned or r["lr"] == lr]


def mean_sd(values: list[float]) -> str:
    """``22.31`` (one value) or ``22.31 ± 0.12 (3)``: mean, standard deviation, count."""
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f} ({len(values)})"


def group(results: list[Result], kind: str, k: int, unique=None, rank=None, init=None):
    """The results of one kind at one K (and cell), over seeds."""
    return [
        r
        for r in results
        if r["kind"] == kind
        and r.get("k") == k
        and (unique is None or r.get("unique") == unique)
        and (rank is None or str(r.get("rank")) == str(rank))
        and (init is None or r.get("init") == init)
    ]


def _mean(rs: list[Result], key: str) -> float | None:
    values = [r[key] for r in rs if r.get(key) is not None]
    return statistics.mean(values) if values else None


def bootstrap_key(a: Result, b: Result) -> str:
    """What a p-value is cached under: both evaluations, each by its run, hypotheses, BLEU
    and the seconds the run took (a run made again is another key)."""
    return " vs ".join(f"{r['run']}:{r['hyps']}:{r['bleu']}:{r.get('seconds')}" for r in (a, b))


def paired_bootstrap(study, a: Result, b: Result, refs: list[str]) -> float | None:
    """The p-value of sacreBLEU's paired bootstrap resampling (1,000 resamples, Koehn 2004)
    that ``a``'s test BLEU is no better than ``b``'s; cached in the study's record
    (``study.record.pvalues``). None: the hypotheses of one of them are not here (a run
    finished before the record kept hypotheses)."""
    from recurnmt.experiments.scoring import paired_bootstrap

    key = bootstrap_key(a, b)
    if key in study.record.pvalues:
        return study.record.pvalues[key]
    if not all((study.out / r["hyps"]).exists() for r in (a, b)):
        return None

    def hyps(r: Result) -> list[str]:
        return (study.out / r["hyps"]).read_text(encoding="utf-8").splitlines()

    study.record.pvalues[key] = p = paired_bootstrap(hyps(b), hyps(a), refs)
    return p


def _p(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def runs(n: int) -> str:
    """``1 run``, ``2 runs``."""
    return f"{n:,} run" + ("" if n == 1 else "s")


def _refs(study) -> list[str]:
    a = study.args
    return (a.data / f"test.raw.{a.langs[1]}").read_text(encoding="utf-8").splitlines()


def seed_pairs(row: dict[str, Any], study, refs: list[str]):
    """``(seed, fine-tuned, control, p)`` for each seed of a comparison row."""
    for seed in row["seeds"]:
        t = next(r for r in row["tuned"] if r["seed"] == seed)
        o = next(r for r in row["other"] if r["seed"] == seed)
        yield seed, t, o, paired_bootstrap(study, t, o, refs)


def untested(results: list[Result], study) -> set[str]:
    """The runs of the comparisons whose paired bootstrap is not in the record (the ones
    ``--recover-hypotheses`` makes again where their hypotheses are gone)."""
    results = at_chosen_lr(points(results), study.chosen_lr())
    return {
        r["run"]
        for row in comparisons(results, study)
        for seed in row["seeds"]
        for pair in [
            [next(r for r in row[side] if r["seed"] == seed) for side in ("tuned", "other")]
        ]
        if bootstrap_key(*pair) not in study.record.pvalues
        for r in pair
    }


def reliability(pairs: list[dict[str, Any]], study, refs: list[str]) -> str:
    """What the paired bootstrap says of a verdict's comparisons: how many differences it
    separates in every seed (p < 0.05), which it does not, how many it could not test."""
    ahead, behind, not_separated, untested = [], [], [], 0
    for row in pairs:
        ps = [p for *_, p in seed_pairs(row, study, refs)]
        where = f"M={row['unique']}, K={row['k']}"
        if any(p is None for p in ps):
            untested += 1
        elif all(p < 0.05 for p in ps):
            better = _mean(row["tuned"], "bleu") > _mean(row["other"], "bleu")
            (ahead if better else behind).append(where)
        else:
            not_separated.append(where)
    sides = [f"conversion {side} at {'; '.join(at)}"
             for side, at in (("ahead", ahead), ("behind", behind)) if at]  # fmt: skip
    parts = [f"{len(ahead) + len(behind)} of {len(pairs)} differences reliable (p < 0.05 in "
             f"every seed{': ' + ', '.join(sides) if sides else ''})"]  # fmt: skip
    if not_separated:
        parts.append(f"{len(not_separated)} not ({'; '.join(not_separated)})")
    if untested:
        parts.append(f"{untested} untested (hypotheses not kept)")
    return "Paired bootstrap: " + ", ".join(parts) + "."


NOT_KEPT = (
    "*p* -: the hypotheses of a run finished before the study kept them "
    "(`docs/relaxed_nmt_hyps/`, since 2026-11-29) are gone with its run directory; "
    "`--recover-hypotheses` makes such runs again and keeps their hypotheses where the new run "
    "reproduces the recorded one."
)


def comparisons(results: list[Result], study) -> list[dict[str, Any]]:
    """Fine-tuned conversion against each control, per main cell and K: means over the
    seeds both have (complete pairs only)."""
    rows = []
    for k in sorted(study.args.budgets):
        for cell in study.main:
            tuned = group(results, "fine-tuned", k, cell.unique, cell.rank, cell.init)
            for control in ("scratch K", "scratch T+K"):
                other = group(results, control, k, cell.unique, cell.rank)
                seeds = sorted({r["seed"] for r in tuned} & {r["seed"] for r in other})
                if not seeds:
                    continue
                a = [r for r in tuned if r["seed"] in seeds]
                b = [r for r in other if r["seed"] in seeds]
                rows.append({"k": k, "unique": cell.unique, "rank": cell.rank,
                             "control": control, "seeds": seeds, "tuned": a, "other": b})  # fmt: skip
    return rows


def verdicts(rows: list[dict[str, Any]], results: list[Result], study) -> list[str]:
    """One sentence per axis, computed from the numbers, with what the paired bootstrap
    says of them."""
    refs, out = _refs(study), []
    for control, axis in (
        (
            "scratch K",
            "equal uptraining budget (K updates after the teacher, which is a sunk cost)",
        ),
        ("scratch T+K", "equal total budget (the teacher's T updates + K)"),
    ):
        pairs = [r for r in rows if r["control"] == control]
        if not pairs:
            out.append(f"At {axis}: not run yet.")
            continue
        wins = sum(_mean(p["tuned"], "bleu") > _mean(p["other"], "bleu") for p in pairs)
        detail = "; ".join(
            f"M={p['unique']}, r={p['rank']}, K={p['k']}: {_mean(p['tuned'], 'bleu'):.2f} "
            f"against {_mean(p['other'], 'bleu'):.2f}" for p in pairs
        )  # fmt: skip
        how = {len(pairs): "beat", 0: "did not beat"}.get(wins, "beat only in places")
        won = [f"M={p['unique']}, K={p['k']}" for p in pairs
               if _mean(p["tuned"], "bleu") > _mean(p["other"], "bleu")]  # fmt: skip
        only = f", at {'; '.join(won)} only" if 0 < wins < len(pairs) else ""
        out.append(
            f"At {axis}, converted and fine-tuned models {how} the same architecture trained "
            f"from scratch: higher mean sacreBLEU in {wins} of {len(pairs)} comparisons{only} "
            f"({detail}). {reliability(pairs, study, refs)}"
        )
    restart = []
    for k in sorted(study.args.budgets):
        rewarmed = group(results, "teacher re-warmed", k)
        continued = group(results, "teacher continued", k)
        if rewarmed and continued:
            restart.append(f"K={k}: re-warmed {_mean(rewarmed, 'bleu'):.2f} against continued "
                           f"{_mean(continued, 'bleu'):.2f}")  # fmt: skip
    if restart:
        out.append(
            "What restarting costs without converting (the teacher fine-tuned with the "
            "fine-tuning recipe against its own training continued): " + "; ".join(restart) + "."
        )
    return out


def plateau_note(teacher: Result, args) -> str:
    """What the stop says about the plateau: an early stop shows one; the cap does not."""
    if teacher["stopped_at"] < args.max_update:
        return f", {teacher['stopped_at'] - teacher['updates']:,} updates without improvement"
    if teacher["updates"] == teacher["stopped_at"]:
        curve = teacher["curve"]
        back = curve[-1 - min(args.patience, len(curve) - 1)]
        gain = back[1] - curve[-1][1]
        return (
            f" (the cap, --max-update, still improving: by {gain:.3f} in validation loss over "
            f"its last {curve[-1][0] - back[0]:,} updates; no plateau by the patience rule)"
        )
    return " (the cap, --max-update)"


# a test BLEU moving by less has not moved: the study's fine-tuned, re-warmed and T + K runs
# differ by seed with standard deviations of 0.1 to 0.6 sacreBLEU
PLATEAU_BLEU = 0.5


def continued_note(teacher: Result, results: list[Result]) -> str:
    """Where the teacher plateaued, by the test: its own training continued from T (the
    ``teacher continued`` runs), against the teacher itself; empty before they have run."""
    runs = sorted(by_kind(results, "teacher continued"), key=lambda r: r["k"])
    if not runs:
        return ""
    bleu = [r["bleu"] - teacher["bleu"] for r in runs]
    ppl = [r["valid_ppl"] - teacher["valid_ppl"] for r in runs]
    each = "; ".join(f"K={r['k']:,}: {r['bleu']:.2f}, {r['valid_ppl']:.2f}" for r in runs)
    flat = max(abs(b) for b in bleu) < PLATEAU_BLEU
    verdict = (f"by the test the teacher is at its plateau at T (no change of {PLATEAU_BLEU} "
               "sacreBLEU or more)" if flat else "by the test the teacher was still moving at T")  # fmt: skip

    def span(values: list[float]) -> str:
        low, high = f"{min(values):+.2f}", f"{max(values):+.2f}"
        return low if low == high else f"{low} to {high}"

    return (f" Continued from T, its optimizer and schedule included, for K more updates, it "
            f"moves by {span(bleu)} sacreBLEU and {span(ppl)} validation perplexity ({each}): "
            f"{verdict}.")  # fmt: skip


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header),
            *("| " + " | ".join(row) + " |" for row in rows)]  # fmt: skip


def _ppl(rs: list[Result]) -> str:
    m = _mean(rs, "valid_ppl")
    return "-" if m is None else f"{m:.2f}"


def markdown(results: list[Result], pending: list[str], study, command: str, plot: Path) -> str:
    """The page: settings, teacher, lr selection, conversions, comparisons, verdicts."""
    a = study.args
    results = points(results)
    teacher = by_kind(results, "teacher")
    lines = ["# Relaxed recursion on the embedded corpus: uptraining a trained transformer", ""]
    lines.append(
        f"Written by `{command}` ({len(results)} results"
        + (
            "; runs still to do: rerun the same command to continue)" if pending else ")"
        )  # fmt: skip
        + ". The method's claim (Bae et al., ICLR 2025) is about the *uptraining* budget: "
        "the teacher is a sunk cost someone already paid. Every model has H="
        f"{a.embed_dim}, FF={a.ffn_dim}, {a.heads} heads, {a.levels} levels a side, pre-LN, "
        f"shared embeddings, dropout {a.dropout}, {a.max_tokens:,} tokens per update; test "
        f"set: beam {a.beam}, length penalty {a.lenpen}, detokenized sacreBLEU and chrF; "
        "validation perplexity by `fairseq-validate`. P* excludes the embeddings and the head."
    )
    if teacher:
        t = teacher[0]
        lines += ["", "## The teacher", "",
                  f"fairseq's `transformer`, Adam at lr {a.lr}, inverse-sqrt decay after "
                  f"{a.warmup} warm-up updates, validated every {a.interval:,} updates, stopped after "
                  f"{a.patience} validations without a lower validation loss: the lowest "
                  f"validation loss, {t['best_valid_loss']:.3f}, came at update "
                  f"{t['updates']:,} (T); training stopped at update "
                  f"{t['stopped_at']:,}{plateau_note(t, a)}. Its best checkpoint: sacreBLEU {t['bleu']:.2f}, chrF "
                  f"{t['chrf']:.2f}, validation perplexity {t['valid_ppl']:.2f} (P* "
                  f"{t['p_star'] / 1e6:.3f}M). Signature: {t['bleu_signature']}."
                  + continued_note(t, results)]  # fmt: skip
    lr = study.chosen_lr()
    selection = [r for r in results if r["kind"] == "fine-tuned" and r["k"] == study.selection_k
                 and r["seed"] == 1 and r.get("init") == study.main[0].init
                 and r["unique"] == study.main[0].unique
                 and str(r["rank"]) == str(study.main[0].rank)]  # fmt: skip
    if selection:
        c = study.main[0]
        lines += ["", "## The fine-tuning recipe", "",
                  f"{a.tune_warmup} warm-up updates to a peak lr, then linear decay to 0 over K; "
                  f"a fresh Adam. The peak lr chosen on validation perplexity at K = {study.selection_k:,} for "
                  f"M={c.unique}, {c.init}, r={c.rank}, seed 1"
                  + (f": **{lr:g}**." if lr is not None else " (not all run yet)."), ""]  # fmt: skip
        lines += _table(["peak lr", "valid ppl", "sacreBLEU"],
                        [[f"{r['lr']:g}", f"{r['valid_ppl']:.2f}", f"{r['bleu']:.2f}"]
                         for r in sorted(selection, key=lambda r: r["lr"])])  # fmt: skip
    results = at_chosen_lr(results, lr)
    converted = by_kind(results, "converted")
    if converted:
        lines += ["", "## The conversions, before fine-tuning", "",
                  "`recurnmt-convert` of the teacher: M blocks a side in a cycle, the init of "
                  "the shared blocks, per-level LoRA rank r (SVD of each level's difference from "
                  "its block; *energy kept*: the share of those differences' squared singular "
                  "values the LoRAs hold), per-level norms; *max diff*: the largest logit "
                  "difference from the teacher on random sentences.", ""]  # fmt: skip
        lines += _table(
            ["M", "init", "r", "P*", "energy kept", "max diff", "sacreBLEU", "chrF", "valid ppl"],
            [[str(r["unique"]), r["init"], str(r["rank"]), f"{r['p_star'] / 1e6:.3f}M",
              f"{r['energy_kept']:.3f}", f"{r['max_logit_difference']:.2g}", f"{r['bleu']:.2f}",
              f"{r['chrf']:.2f}", f"{r['valid_ppl']:.2f}"] for r in converted],
        )  # fmt: skip
    lines += _main_tables(results, study)
    rows = comparisons(results, study)
    if rows:
        lines += ["", "## Verdicts", "", *(f"- {v}" for v in verdicts(rows, results, study))]
        lines += _bootstrap_table(rows, study)
    lines += _distillation_table(results, study)
    lines += _grid_table(results, study)
    if pending:
        named = [p for p in pending if p != LATER]
        shown = ", ".join(f"`{p}`" for p in named[:12])
        later = ", then the stages planned after them" if LATER in pending else ""
        lines += ["", "## Still to run", "",
                  f"{runs(len(named))}: {shown}" + (", ..." if len(named) > 12 else "")
                  + later + "."]  # fmt: skip
    lines += ["", f"![sacreBLEU against the uptraining budget]({plot.name})", ""]
    return "\n".join(lines)


def _main_tables(results: list[Result], study) -> list[str]:
    lines = []
    for k in sorted(study.args.budgets):
        rows = []
        for cell in study.main:
            for kind, rs in (
                ("converted + fine-tuned", group(results, "fine-tuned", k, cell.unique,
                                                 cell.rank, cell.init)),
                ("from scratch, K", group(results, "scratch K", k, cell.unique, cell.rank)),
                ("from scratch, T + K", group(results, "scratch T+K", k, cell.unique, cell.rank)),
            ):  # fmt: skip
                if rs:
                    rows.append([kind, str(cell.unique), str(cell.rank),
                                 f"{rs[0]['p_star'] / 1e6:.3f}M", f"{rs[0]['updates']:,}",
                                 mean_sd([r["bleu"] for r in rs]),
                                 mean_sd([r["chrf"] for r in rs]), _ppl(rs)])  # fmt: skip
        for kind in ("teacher continued", "teacher re-warmed"):
            rs = group(results, kind, k)
            if rs:
                rows.append([kind, "-", "-", f"{rs[0]['p_star'] / 1e6:.3f}M", f"{k:,}",
                             mean_sd([r["bleu"] for r in rs]), mean_sd([r["chrf"] for r in rs]),
                             _ppl(rs)])  # fmt: skip
        if rows:
            lines += ["", f"## K = {k:,} updates of uptraining", "",
                      "Mean ± standard deviation (seeds) where a cell has several seeds; "
                      "*updates*: the run's own training updates.", ""]  # fmt: skip
            lines += _table(["model", "M", "r", "P*", "updates", "sacreBLEU", "chrF",
                             "valid ppl"], rows)  # fmt: skip
    return lines


def _bootstrap_table(rows: list[dict[str, Any]], study) -> list[str]:
    refs, table = _refs(study), []
    for row in rows:
        for seed, t, o, p in seed_pairs(row, study, refs):
            table.append([str(row["k"]), str(row["unique"]), str(row["rank"]), row["control"],
                          str(seed), f"{t['bleu']:.2f}", f"{o['bleu']:.2f}", _p(p)])  # fmt: skip
    missing = any(row[-1] == "-" for row in table)
    return ["", "Paired bootstrap resampling (sacreBLEU's, 1,000 resamples) of the fine-tuned "
            "conversion against each control, seed by seed: *p* is the probability that the "
            "difference arises by chance (small: the fine-tuned model is reliably better or "
            "worse, as its BLEU says)." + (" " + NOT_KEPT if missing else ""), "",
            *_table(["K", "M", "r", "control", "seed", "fine-tuned", "control BLEU", "p"],
                    table)]  # fmt: skip


def _distillation_table(results: list[Result], study) -> list[str]:
    """Fine-tuning with word-level distillation from the teacher against the same run
    without it (same cell, K, lr and seed), with a paired bootstrap and a verdict."""
    pairs = []
    for kd in by_kind(results, "fine-tuned + KD"):
        plain = group(results, "fine-tuned", kd["k"], kd["unique"], kd["rank"], kd["init"])
        plain = [r for r in plain if r["seed"] == kd["seed"] and r["lr"] == kd["lr"]]
        if plain:
            pairs.append((kd, plain[0]))
    if not pairs:
        return []
    refs = _refs(study)
    rows = [[str(kd["k"]), str(kd["unique"]), kd["init"], str(kd["rank"]), str(kd["seed"]),
             f"{plain['bleu']:.2f}", f"{kd['bleu']:.2f}", f"{plain['valid_ppl']:.2f}",
             f"{kd['valid_ppl']:.2f}", _p(paired_bootstrap(study, kd, plain, refs))]
            for kd, plain in pairs]  # fmt: skip
    better = sum(kd["bleu"] > plain["bleu"] for kd, plain in pairs)
    how = {len(pairs): "helped", 0: "did not help"}.get(better, "helped in part")
    w = pairs[0][0]["teacher_distill"]
    return ["", "## Logit distillation from the teacher", "",
            f"The same fine-tuning with the teacher's distribution in the loss: (1 - W) x the "
            f"label-smoothed loss + W x KL(teacher || student) over the target's tokens, W = {w:g} "
            "(word-level knowledge distillation, Kim & Rush 2016; `--teacher-checkpoint` and "
            "`--teacher-distill` of the recurrent criterion; validation perplexity is the "
            f"labels' alone). It {how}: higher sacreBLEU in {better} of {len(pairs)} "
            "comparisons. *p*: paired bootstrap of the distilled run against the run without."
            + (" " + NOT_KEPT if any(row[-1] == "-" for row in rows) else ""),
            "", *_table(["K", "M", "init", "r", "seed", "sacreBLEU", "with KD", "valid ppl",
                         "with KD", "p"], rows)]  # fmt: skip


def _grid_table(results: list[Result], study) -> list[str]:
    main = {(c.unique, c.init, str(c.rank)) for c in study.main}
    rows = []
    for r in by_kind(results, "fine-tuned"):
        if (r["unique"], r["init"], str(r["rank"])) in main or r["seed"] != 1:
            continue
        scratch = group(results, "scratch K", r["k"], r["unique"], r["rank"])
        scratch = [s for s in scratch if s["seed"] == 1]
        rows.append([str(r["k"]), str(r["unique"]), r["init"], str(r["rank"]), f"{r['lr']:g}",
                     f"{r['bleu']:.2f}", f"{scratch[0]['bleu']:.2f}" if scratch else "-",
                     f"{r['valid_ppl']:.2f}"])  # fmt: skip
    if not rows:
        return []
    return ["", "## Every other conversion, fine-tuned (seed 1)", "",
            *_table(["K", "M", "init", "r", "lr", "sacreBLEU", "from scratch, K", "valid ppl"],
                    sorted(rows, key=lambda row: (int(row[0]), row[1], row[2], row[3])))]  # fmt: skip


def plot(results: list[Result], study, path: Path) -> None:
    """sacreBLEU against K, one panel per main cell: the fine-tuned conversion and every
    control (means over seeds), the teacher as a line."""
    from matplotlib.figure import Figure  # no pyplot: no global backend state

    results = at_chosen_lr(points(results), study.chosen_lr())
    cells = study.main
    fig = Figure(figsize=(4.2 * len(cells), 3.8), dpi=110)
    teacher = by_kind(results, "teacher")
    for i, cell in enumerate(cells):
        ax = fig.add_subplot(1, len(cells), i + 1)
        series = {
            "converted + fine-tuned": ("fine-tuned", dict(unique=cell.unique, rank=cell.rank,
                                                          init=cell.init)),
            "from scratch, K": ("scratch K", dict(unique=cell.unique, rank=cell.rank)),
            "from scratch, T + K": ("scratch T+K", dict(unique=cell.unique, rank=cell.rank)),
            "teacher continued": ("teacher continued", {}),
            "teacher re-warmed": ("teacher re-warmed", {}),
        }  # fmt: skip
        for label, (kind, keys) in series.items():
            ks = [k for k in sorted(study.args.budgets) if group(results, kind, k, **keys)]
            if ks:
                ys = [_mean(group(results, kind, k, **keys), "bleu") for k in ks]
                ax.plot(ks, ys, marker="o", label=label)
        if teacher:
            ax.axhline(teacher[0]["bleu"], color="gray", linestyle="--", label="teacher")
        ax.set_title(f"M={cell.unique}, {cell.init}, r={cell.rank}", fontsize=9)
        ax.set_xlabel("K (uptraining updates)")
        if i == 0:
            ax.set_ylabel("sacreBLEU (test)")
        ax.grid(alpha=0.3)
    if fig.axes:
        fig.axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
