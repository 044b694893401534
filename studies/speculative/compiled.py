"""Decoding with each step compiled (``--compile-decoding``) measured against fairseq's search:
``python scripts/compiled_decoding.py`` (docs/compiled_decoding.md).

The same trained models as docs/speculative.md (``python scripts/speculative.py train``), the
same test sentences and clocks (:mod:`studies.speculative.measure`): per model and batch
setting, fairseq's greedy and beam-4 search, the static-shape search of ``--static-decoding``
run eagerly and compiled (``--compile-decoding``), and, for a model that drafts, recurnmt's
greedy loop without drafts and speculative greedy at a few draft settings. Every configuration
runs once a round, the rounds taking turns, the fastest round kept; before the first round
each compiled configuration decodes the timed sentences once, untimed (its compilations: the
seconds are reported). Every output is compared with fairseq's search at the same beam.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from recurnmt.experiments.artifacts import portable, write_json
from studies.speculative.measure import (
    BEAM,
    LENPEN,
    NO_DRAFT,
    TestSet,
    beam,
    can_draft,
    decode,
    greedy,
    load,
    speculative,
)
from studies.speculative.report import measured_on

FAIRSEQ, STATIC, COMPILED = "fairseq's search", "static, eager", "compiled"
SPECULATIVE = "speculative"


def static(model, tgt_dict, beam_size: int, compiled: bool):
    from recurnmt.nmt.static_decoding import StaticSequenceGenerator

    return StaticSequenceGenerator(
        [model], tgt_dict, beam_size=beam_size, len_penalty=LENPEN if beam_size > 1 else 1.0,
        max_len_a=1.5, max_len_b=10, compiled=compiled,
    )  # fmt: skip


def configurations(
    model, tgt_dict, drafts: Sequence[tuple[int, int]]
) -> list[tuple[str, str, Callable]]:
    """(search, run, make generator) of one model: fairseq's searches for every model; the
    static-shape ones, eager and compiled, and the speculative loop for recurnmt's: without
    drafts and at each (draft levels, tokens) of ``drafts`` (the levels cut to the model's
    N - 1), eager and compiled."""
    configs = [
        ("greedy", FAIRSEQ, lambda: greedy(model, tgt_dict)),
        (f"beam {BEAM}", FAIRSEQ, lambda: beam(model, tgt_dict)),
    ]
    if not can_draft(model) and not hasattr(model.decoder, "stack"):
        return configs  # fairseq's own transformer: its searches only
    for search, size in (("greedy", 1), (f"beam {BEAM}", BEAM)):
        configs.append((search, STATIC, lambda size=size: static(model, tgt_dict, size, False)))
        configs.append((search, COMPILED, lambda size=size: static(model, tgt_dict, size, True)))
    if can_draft(model):
        top = model.decoder.stack.num_levels - 1
        settings = dict.fromkeys((min(levels, top), k) for levels, k in drafts)
        for suffix, c in (("", False), (", compiled", True)):
            configs.append(
                ("greedy", NO_DRAFT + suffix, lambda c=c: speculative(model, tgt_dict, 0, 1, c))
            )
            for levels, k in settings:
                configs.append((
                    "greedy", f"{SPECULATIVE} R={levels} K={k}{suffix}",
                    lambda c=c, levels=levels, k=k: speculative(model, tgt_dict, levels, k, c),
                ))  # fmt: skip
    return configs


def compiles(run: str) -> bool:
    return run == COMPILED or run.endswith(", compiled")


def timed(run: str, setting: str) -> bool:
    """In batches: fairseq's searches and the compiled static-shape ones (speculation pays at
    batch 1 if anywhere, docs/speculative.md; the eager static search keeps finished rows, a
    cost docs/gpu.md measures)."""
    return setting == "batch 1" or run in (FAIRSEQ, COMPILED)


def measure_model(test: TestSet, model, name: str, args: argparse.Namespace,
                  log: Callable[[str], None]) -> list[dict[str, Any]]:  # fmt: skip
    """The rows of one model: every configuration at batch 1 and, where :func:`timed`, in
    batches of ``args.batch``, the fastest of ``args.rounds`` rounds."""
    ids = test.spread(args.sentences)
    settings = {
        "batch 1": test.batches(ids, 1),
        f"batch {args.batch}": test.batches(ids, args.batch),
    }
    configs = configurations(model, test.tgt_dict, args.drafts)
    compile_seconds: dict[tuple[str, str, str], float] = {}
    for search, run, make in configs:  # compilations, untimed: the first shapes of each
        for setting, batches in settings.items():
            if compiles(run) and timed(run, setting):
                start = time.perf_counter()
                decode(make(), model, batches)
                compile_seconds[(search, run, setting)] = time.perf_counter() - start
    log(f"{name}: compiled in {sum(compile_seconds.values()):.0f} s")
    best: dict[tuple[str, str, str], dict[str, Any]] = {}
    outputs: dict[tuple[str, str, str], dict[int, torch.Tensor]] = {}
    for round_ in range(args.rounds):
        for search, run, make in configs:
            for setting, batches in settings.items():
                if not timed(run, setting):
                    continue
                out, seconds, tokens = decode(make(), model, batches)
                key = (search, run, setting)
                outputs.setdefault(key, out)
                if key not in best or seconds < best[key]["seconds"]:
                    best[key] = {
                        "model": name, "search": search, "run": run, "setting": setting,
                        "seconds": round(seconds, 3), "tokens": tokens, "sentences": len(ids),
                        "tokens_per_s": round(tokens / seconds, 1),
                        "sentences_per_s": round(len(ids) / seconds, 2),
                    }  # fmt: skip
        log(f"{name}: round {round_ + 1} of {args.rounds} done")
    for key, row in best.items():
        search, run, setting = key
        want = outputs[(search, FAIRSEQ, setting)]
        row["identical"] = sum(torch.equal(outputs[key][i], want[i]) for i in want)
        if key in compile_seconds:
            row["compile_seconds"] = round(compile_seconds[key], 1)
    return list(best.values())


def measure(args: argparse.Namespace, titles: dict[str, str]) -> dict[str, Any]:
    """Every trained model of ``args.models`` measured (the JSON beside ``args.doc`` after each
    model: a stopped run resumes there; delete it to measure again), then the page and plot."""
    torch.set_num_threads(args.threads)
    raw = args.doc.with_suffix(".json")
    results = json.loads(raw.read_text()) if raw.exists() else {"rows": []}
    test = TestSet(args.data, args.device)

    def log(line: str) -> None:
        print(line, flush=True)

    results["models"] = results.get("models", {})
    results["settings"] = {k: str(v) for k, v in vars(args).items()}
    for name in args.models:
        path = args.out / name / "checkpoints" / "checkpoint_last.pt"
        if not path.exists():
            log(f"{name}: not trained ({portable(path)}: python scripts/speculative.py train)")
            continue
        if any(r["model"] == name for r in results["rows"]):
            log(f"{name}: measured already ({portable(raw)})")
            continue
        model = load(path, args.device)[0]
        results["rows"] += measure_model(test, model, name, args, log)
        results["models"][name] = titles.get(name, name)
        write_json(raw, results)
    write_report(args.doc, results)
    return results


def _find(rows, model, search, run, setting) -> dict | None:
    for row in rows:
        if (row["model"], row["search"], row["run"], row["setting"]) == (
            model, search, run, setting,
        ):  # fmt: skip
            return row
    return None


def _ratio(row: dict | None, base: dict | None) -> str:
    if row is None or base is None:
        return "-"
    return f"{row['tokens_per_s'] / base['tokens_per_s']:.2f}"


def table(results: dict, setting: str) -> list[str]:
    rows = [r for r in results["rows"] if r["setting"] == setting]
    lines = [
        "| model | search | run | tokens/s | x fairseq's search | x fairseq's transformer | "
        "identical to fairseq's search | compiling, s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        base = _find(rows, row["model"], row["search"], FAIRSEQ, setting)
        other = _find(rows, "transformer", row["search"], FAIRSEQ, setting)
        lines.append(
            f"| {row['model']} | {row['search']} | {row['run']} | {row['tokens_per_s']:.0f} | "
            f"{_ratio(row, base)} | {_ratio(row, other)} | "
            f"{row['identical']} of {row['sentences']} | {row.get('compile_seconds', '')} |"
        )
    return lines


def headline(results: dict) -> list[str]:
    """One line per setting and search: every compiled run against fairseq's search of the same
    model, over the models (the lowest and highest ratio)."""
    lines = []
    rows = results["rows"]
    for setting in dict.fromkeys(r["setting"] for r in rows):
        for search in dict.fromkeys(r["search"] for r in rows):
            parts = []
            here = [r for r in rows if (r["setting"], r["search"]) == (setting, search)]
            for run in dict.fromkeys(r["run"] for r in here if compiles(r["run"])):
                ratios = []
                for row in (r for r in here if r["run"] == run):
                    base = _find(rows, row["model"], search, FAIRSEQ, setting)
                    if base is not None:
                        ratios.append((row["tokens_per_s"] / base["tokens_per_s"], row["model"]))
                if ratios:
                    low, high = min(ratios), max(ratios)
                    span = f"{low[0]:.2f}x ({low[1]})"
                    if len(ratios) > 1:
                        span += f" to {high[0]:.2f}x ({high[1]})"
                    name = "the static-shape search" if run == COMPILED else run.split(",")[0]
                    parts.append(f"{name} {span}")
            if parts:
                lines.append(f"- **{setting}, {search}**, compiled, against fairseq's search of "
                             f"the same model: {'; '.join(parts)}.")  # fmt: skip
    gains = []
    for model in dict.fromkeys(r["model"] for r in rows):
        base = _find(rows, model, "greedy", NO_DRAFT + ", compiled", "batch 1")
        spec = [r for r in rows if r["model"] == model and r["setting"] == "batch 1"
                and r["run"].startswith(SPECULATIVE) and compiles(r["run"])]  # fmt: skip
        if base is not None and spec:
            best = max(spec, key=lambda r: r["tokens_per_s"])
            ratio = best["tokens_per_s"] / base["tokens_per_s"]
            setting = best["run"].removeprefix(SPECULATIVE + " ").split(",")[0]
            gains.append(f"{model} {ratio:.2f}x at {setting}")
    if gains:
        lines.append("- **drafts on top of the compiled loop** (batch 1, greedy; the fastest "
                     "draft setting against the compiled loop without drafts): "
                     f"{'; '.join(gains)}.")  # fmt: skip
    return lines


def plot(results: dict, path: Path) -> bool:
    """tokens/s against fairseq's search of the same model, per model, run and setting."""
    import logging

    import matplotlib

    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # fairseq's root logger: DEBUG
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in results["rows"] if r["run"] != FAIRSEQ]
    if not rows:
        return False
    settings = list(dict.fromkeys(r["setting"] for r in rows))
    most = max(sum(r["setting"] == s for r in rows) for s in settings)
    size = (6.5 * len(settings), max(4.0, 0.2 * most + 1.2))  # a readable row per bar
    fig, axes = plt.subplots(1, len(settings), figsize=size, squeeze=False)
    for ax, setting in zip(axes[0], settings, strict=True):
        here = [r for r in rows if r["setting"] == setting]
        labels, values = [], []
        for row in here:
            base = _find(results["rows"], row["model"], row["search"], FAIRSEQ, setting)
            labels.append(f"{row['model']}: {row['search']}, {row['run']}")
            values.append(row["tokens_per_s"] / base["tokens_per_s"])
        colors = ["tab:green" if "compiled" in lab else "tab:gray" for lab in labels]
        ax.barh(range(len(values)), values, color=colors)
        ax.set_yticks(range(len(values)), labels, fontsize=7)
        ax.axvline(1.0, color="black", linewidth=0.8)
        ax.invert_yaxis()
        ax.set_xlabel("tokens/s, x fairseq's search of the same model")
        ax.set_title(setting)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def write_report(doc: Path, results: dict) -> None:
    png = doc.with_suffix(".png")
    drew = plot(results, png)
    settings = results.get("settings", {})
    command = "python scripts/compiled_decoding.py"
    lines = [
        "# Compiled decoding on a CPU",
        "",
        f"Written by `{command}` from the models `python scripts/speculative.py train` "
        f"trained (docs/speculative.md). {measured_on(settings)}",
        "",
        "Models:",
        "",
        *(f"- `{name}`: {title}" for name, title in results.get("models", {}).items()),
        "",
        "`--compile-decoding` is the static-shape search of `--static-decoding` (every row kept,",
        "keys and values in fixed buffers read under a mask) with each step after the first",
        "compiled by `torch.compile` (TorchInductor: the step's elementwise operations, norms and",
        "softmaxes fused into a few C++ kernels). At this width a step at batch 1 costs the",
        "host's dispatch of its operations more than their arithmetic, which compiling removes;",
        "in batches the arithmetic dominates and the static search's finished rows, still",
        "computed, cost more than the dispatch saved. Greedy speculation (and the same loop",
        "without drafts) compiles a whole round into one function: the K draft passes with",
        "their embeddings and argmaxes, the verification, the full model's tokens and how",
        "many drafts they accept, so that a round costs the host one call and one read",
        "(`recurnmt/modules/decoding/speculative.py`, `_greedy_round`).",
        "*identical*: the same output tokens as fairseq's search at the same beam; *compiling*:",
        "the untimed first decoding of the timed sentences (a few compilations, then the code",
        "reused).",
        "",
        *headline(results),
        "",
    ]
    for setting in dict.fromkeys(r["setting"] for r in results["rows"]):
        lines += [f"## {setting[0].upper()}{setting[1:]}", "", *table(results, setting), ""]
    if drew:
        lines += [f"![compiled decoding against fairseq's search]({png.name})", ""]
    doc.write_text("\n".join(lines), encoding="utf-8")
