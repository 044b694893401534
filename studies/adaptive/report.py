"""docs/adaptive_depth.md from the measurements of ``scripts/adaptive_depth.py``: each model's
calibration on the validation set, its test-set points against full depth, the verdicts the
issue asks for, and a speed-quality plot. A run stopped part-way still gets a page: every table
holds what has run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from recurnmt.experiments.artifacts import portable

FULL = "full depth"
SETTINGS = ("batch 64 beam 4", "batch 64 greedy", "batch 1 beam 4")
TARGET_SPEEDUP, ALPHA = 1.5, 0.05


def _full(points: list[dict], setting: str) -> dict | None:
    return next((p for p in points if p["setting"] == setting and p["test"] == FULL), None)


def verdict(points: list[dict]) -> str:
    """Whether a threshold calibrated on validation decodes at batch 64 beam 4 at least 1.5x as
    fast as full depth with sacreBLEU not reliably lower (paired bootstrap p >= 0.05)."""
    full = _full(points, SETTINGS[0])
    calibrated = [p for p in points if p["setting"] == SETTINGS[0] and p.get("calibrated_for")
                  not in (None, "floor", "never")]  # fmt: skip
    if full is None or not calibrated:
        return "not measured yet"
    best = None
    for p in calibrated:
        speedup = p["tokens_per_s"] / full["tokens_per_s"]
        ok = speedup >= TARGET_SPEEDUP and (p["bleu"] >= full["bleu"] or p["p"] >= ALPHA)
        if ok and (best is None or speedup > best[0]):
            best = (speedup, p)
    if best is None:
        fastest = max(calibrated, key=lambda p: p["tokens_per_s"])
        return (
            f"**not reached**: the fastest calibrated threshold ({fastest['test']} >= "
            f"{fastest['threshold']}) decodes at "
            f"{fastest['tokens_per_s'] / full['tokens_per_s']:.2f}x full depth's tokens/s "
            f"(BLEU {fastest['bleu']} vs {full['bleu']}, p = {fastest['p']})"
        )
    speedup, p = best
    return (
        f"**reached**: {p['test']} >= {p['threshold']} (calibrated for {p['calibrated_for']} "
        f"consistency on validation) decodes at {speedup:.2f}x full depth's tokens/s, BLEU "
        f"{p['bleu']} vs {full['bleu']} (p = {p['p']})"
    )


def _points_table(points: list[dict], setting: str) -> list[str]:
    full = _full(points, setting)
    rows = [p for p in points if p["setting"] == setting]
    if full is None or not rows:
        return ["(not measured yet)"]
    lines = [
        "| exits | threshold | calibrated for | levels run | tokens/s | vs full depth | "
        "sacreBLEU | paired p | consistency | token agreement |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for p in rows:
        threshold = "" if p["threshold"] is None else f"{p['threshold']:g}"
        target = p.get("calibrated_for")
        target = "" if target is None else str(target)
        ratio = p["tokens_per_s"] / full["tokens_per_s"]
        pval = "" if p["p"] is None else f"{p['p']:.3f}"
        lines.append(
            f"| {p['test']} | {threshold} | {target} | {p['levels']:.2f} | {p['tokens_per_s']:.0f} | "
            f"{ratio:.2f}x | {p['bleu']:.2f} | {pval} | {p.get('consistency', 1.0):.3f} | "
            f"{p['agreement']:.3f} |"
        )
    return lines


def _calibration_table(calibration: dict[str, list[dict]]) -> list[str]:
    lines = [
        "| test | threshold | consistency | token agreement | identical outputs | levels run |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for test, rows in calibration.items():
        for r in rows:
            lines.append(
                f"| {test} | {r['threshold']:g} | {r['consistency']:.4f} | {r['agreement']:.4f} | "
                f"{r['identical']:.3f} | "
                f"{r['levels']:.2f} |"
            )
    return lines


def _time_table(time: dict[str, dict[str, float]]) -> list[str]:
    runs = list(time)
    kinds = list(time[runs[0]])
    lines = ["| operations | " + " | ".join(runs) + " |", "| --- |" + " ---: |" * len(runs)]
    for kind in kinds:
        lines.append(f"| {kind} | " + " | ".join(f"{time[r][kind]:.0f}" for r in runs) + " |")
    totals = " | ".join(f"**{sum(time[r].values()):.0f}**" for r in runs)
    return lines + [f"| total | {totals} |"]


def plot(doc: Path, record: dict[str, Any]) -> Path | None:
    """tokens/s (as a ratio to full depth) against sacreBLEU at batch 64 beam 4, one curve per
    model and test, calibrated points marked; the PNG beside the page."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = record.get("results", {})
    if not results:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, mine in results.items():
        points = mine["points"]
        full = _full(points, SETTINGS[0])
        if full is None:
            continue
        ax.scatter([1.0], [full["bleu"]], marker="s", color="black")
        for test in sorted({p["test"] for p in points} - {FULL}):
            rows = [p for p in points if p["setting"] == SETTINGS[0] and p["test"] == test
                    and p.get("calibrated_for") not in ("floor", "never")]  # fmt: skip
            rows.sort(key=lambda p: p["tokens_per_s"])
            xs = [p["tokens_per_s"] / full["tokens_per_s"] for p in rows]
            line = ax.plot(xs, [p["bleu"] for p in rows], marker="o", label=f"{name}, {test}")
            for p, x in zip(rows, xs, strict=True):
                if p.get("calibrated_for") is not None:
                    ax.scatter([x], [p["bleu"]], s=90, facecolors="none",
                               edgecolors=line[0].get_color())  # fmt: skip
    ax.axvline(TARGET_SPEEDUP, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("tokens/s, as a ratio to the same model at full depth")
    ax.set_ylabel("sacreBLEU (test)")
    ax.set_title("Exits at batch 64, beam 4 (circled: calibrated on validation)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    png = doc.with_suffix(".png")
    fig.savefig(png, dpi=120)
    plt.close(fig)
    return png


def write_report(doc: Path, record: dict[str, Any]) -> None:
    """The page and its plot."""
    png = plot(doc, record)
    settings = record.get("settings", {})
    lines = [
        "# Adaptive depth: exits that skip the work",
        "",
        "<!-- written by python scripts/adaptive_depth.py measure; do not edit -->",
        "",
        "Rows leave each decoding step's level loop once their exit test passes; the rows "
        "still running go on compacted, and the levels an exited row skipped get keys and "
        "values from its exit state (`recurnmt/modules/decoding/exits.py`, "
        "[exits](exits.md)). Every point below is the same trained model decoding the "
        "embedded test set, with and without exits, in one process on one thread "
        f"(`--threads {settings.get('threads', '1')}`), thresholds calibrated on the first "
        f"{settings.get('valid_sentences', '?')} validation sentences, never on the test set.",
        "",
        "```bash",
        "python scripts/speculative.py train --models ringformer-random relaxed_transformer-random",
        "python scripts/adaptive_depth.py measure",
        "```",
        "",
    ]
    if png is not None:
        lines += [f"![speed and quality]({png.name})", ""]
    for name, mine in record.get("results", {}).items():
        title = record.get("models", {}).get(name, name)
        lines += [
            f"## {name}: {title}",
            "",
            f"Verdict at batch 64, beam 4: {verdict(mine['points'])}.",
            "",
        ]
        lines += ["### Calibration (validation, batch 64, beam 4)", ""]
        lines += _calibration_table(mine["calibration"]) + [""]
        for setting in SETTINGS:
            lines += [f"### Test set, {setting}", ""] + _points_table(mine["points"], setting)
            lines += [""]
        if mine.get("time"):
            lines += ["### Where the time goes (batch 64, beam 4, the first 4 batches, ms)", ""]
            lines += _time_table(mine["time"]) + [""]
    lines += [
        "The *never* rows run each test at a threshold no confidence reaches: no row exits, "
        "and the time lost against full depth is the test's own cost (the margin test's "
        "output layer at every candidate level). The *floor* rows exit every row at the "
        "minimum level: what a step costs besides the levels (the encoder, the output layer, "
        "fairseq's search), the bound of any exit test on this model and search.",
        "",
        f"Raw figures: `{portable(doc.with_suffix('.json'))}`.",
        "",
    ]
    doc.write_text("\n".join(lines), encoding="utf-8")
