"""The measurements of ``scripts/adaptive_depth.py``: per-row exits of trained models on the
embedded corpus, against the same model at full depth (docs/adaptive_depth.md).

For each model and exit test, in this process, one thread by default:

1. *calibration on the validation set* (never the test set): the first ``--valid-sentences``
   validation sentences decoded at batch 64, beam 4, at full depth and at every threshold of the
   test's grid; each threshold's consistency with full depth (:func:`consistency`: CALM's
   textual consistency, sacreBLEU against full depth's outputs), its token agreement
   (:func:`agreement`) and the mean levels run; for each stated consistency (``--agreements``)
   the threshold of fewest levels that reaches it;
2. *the test set* at batch 64 beam 4 for every threshold of the grid (the curve) and the
   calibrated ones, at batch 64 greedy and at batch 1 beam 4 (``--sentences`` sentences spread
   over the lengths) for the calibrated ones: sacreBLEU, tokens/s as a ratio to full depth, mean
   levels, and sacreBLEU's paired bootstrap (1,000 resamples) of each point against full depth;
3. each test's own cost: the test at a threshold no confidence reaches (batch 64 beam 4);
4. where the time goes (torch's profiler on a few batches, by kind of operation) at full
   depth, at the floor and at a calibrated threshold;
5. the *floor*: every row exits at the minimum level, the fastest exits can make this model and
   search (what the rest of a step costs: the encoder, the output layer, fairseq's search).

Every point is saved to the JSON as soon as it is measured: a stopped run resumes there.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from recurnmt.experiments.artifacts import portable, write_json
from recurnmt.experiments.scoring import corpus_bleu
from recurnmt.modules.decoding.exits import ExitClassifier, Exits
from studies.speculative.measure import TestSet, beam, bleu, decode, greedy, load

# each test's thresholds, from the most to the least conservative
GRIDS = {
    "saturation": (0.999, 0.995, 0.99, 0.98, 0.95, 0.9),
    "margin": (0.99, 0.95, 0.9, 0.8, 0.7, 0.5),
    "classifier": (0.99, 0.95, 0.9, 0.8, 0.7, 0.5),
}
FULL = "full depth"
NEVER = 2.0  # above every test's confidence: the test's own cost, no row exits


def agreement(full: dict[int, torch.Tensor], mine: dict[int, torch.Tensor]) -> tuple[float, float]:
    """Token agreement with full depth (the full-depth outputs' tokens that the same position
    of the exits' output repeats, over all full-depth tokens) and the share of identical
    outputs: ``recurnmt-exits calibrate``'s (:func:`recurnmt.analysis.exit_calibration.
    agreement`)."""
    from recurnmt.analysis.exit_calibration import agreement as token_agreement

    return token_agreement({i: h.tolist() for i, h in mine.items()},
                           {i: h.tolist() for i, h in full.items()})  # fmt: skip


def consistency(
    test: TestSet, full: dict[int, torch.Tensor], mine: dict[int, torch.Tensor]
) -> float:
    """CALM's textual consistency (Schuster et al. 2022: a similarity of the early-exit
    output to the full model's; BLEU is one it names): sacreBLEU of the exits' outputs with
    full depth's as the references, over 100 (1: the same outputs). Unlike token agreement,
    one early word that shifts the rest of a sentence costs a few n-grams, not the sentence."""
    ids = sorted(full)
    score, _ = corpus_bleu([test.detokenized(mine[i]) for i in ids],
                           [test.detokenized(full[i]) for i in ids])  # fmt: skip
    return round(score.score / 100, 4)


def paired_p(test: TestSet, full: dict[int, torch.Tensor], mine: dict[int, torch.Tensor]) -> float:
    """sacreBLEU's paired bootstrap (1,000 resamples, Koehn 2004) of the exits' hypotheses
    against full depth's: the p-value that their BLEU differs by chance."""
    from recurnmt.experiments.scoring import paired_bootstrap

    ids = sorted(full)

    def text(h: dict[int, torch.Tensor]) -> list[str]:
        return [test.detokenized(h[i]) for i in ids]

    if text(full) == text(mine):  # sacreBLEU's test gives 0.001 to a difference of 0
        return 1.0
    return round(paired_bootstrap(text(full), text(mine), [test.references[i] for i in ids]), 4)


class Run:
    """One model's decoding, with or without exits, in one setting."""

    def __init__(self, model, test: TestSet, setting: str, sentences: int, batch: int) -> None:
        self.model, self.test, self.setting = model, test, setting
        ids = list(range(len(test.dataset))) if setting != "batch 1 beam 4" else \
            test.spread(sentences)  # fmt: skip
        size = 1 if setting.startswith("batch 1 ") else batch
        self.batches = test.batches(ids, size)
        self.make = (lambda: greedy(model, test.tgt_dict)) if "greedy" in setting else \
            (lambda: beam(model, test.tgt_dict))  # fmt: skip

    def __call__(self, exits: Exits | None) -> tuple[dict[int, torch.Tensor], float, int]:
        stack = self.model.decoder.stack
        stack.set_exits(exits)
        try:
            return decode(self.make(), self.model, self.batches)
        finally:
            stack.set_exits(None)


def _exits(model, test_name: str, threshold: float, min_level: int, units=None) -> Exits:
    return Exits(test_name, threshold, min_level, head=model.decoder.output_layer,
                 classifier=units)  # fmt: skip


def exit_units(checkpoint: Path, args: argparse.Namespace, log: Callable[[str], None]):
    """The classifier test's units of ``checkpoint``, trained on the training set by
    ``recurnmt-exits train`` (kept beside the checkpoint; trained when missing)."""
    from recurnmt.analysis.exits import main as exits_main

    path = checkpoint.parent.parent / "exit_units.pt"
    if not path.exists():
        log(f"training the exit units of {portable(checkpoint)} (recurnmt-exits train)")
        flags = ["train", str(checkpoint), "--data", str(args.data), "--out", str(path),
                 "--device", args.device, "--epochs", str(args.unit_epochs)]  # fmt: skip
        if args.unit_sentences:
            flags += ["--max-sentences", str(args.unit_sentences)]
        exits_main(flags)
    return ExitClassifier.load(path)[0]


def measure_model(
    name: str, model, args: argparse.Namespace, record: dict, save: Callable[[], None],
    log: Callable[[str], None], units: ExitClassifier | None = None,
) -> None:  # fmt: skip
    """Every point of one model, each saved as it is measured (those in ``record`` kept);
    ``units``: the classifier test's."""
    valid = TestSet(args.data, args.device, subset="valid")
    test = TestSet(args.data, args.device)
    levels = len(model.decoder.stack.active_levels)
    mine = record.setdefault(name, {"levels": levels, "calibration": {}, "points": []})
    min_level = args.min_exit_level
    # 1. calibration on the validation set
    calib = Run(model, valid, "batch 64 beam 4", args.sentences, args.batch)
    calib.batches = valid.batches(list(range(min(args.valid_sentences, len(valid.dataset)))),
                                  args.batch)  # fmt: skip
    full_valid = None
    for test_name in args.tests:
        rows = mine["calibration"].setdefault(test_name, [])
        done = {r["threshold"] for r in rows}
        for threshold in GRIDS[test_name]:
            if threshold in done:
                continue
            if full_valid is None:
                full_valid, _, _ = calib(None)
            exits = _exits(model, test_name, threshold, min_level, units)
            hyps, seconds, _ = calib(exits)
            tokens, identical = agreement(full_valid, hyps)
            same = consistency(valid, full_valid, hyps)
            rows.append({"threshold": threshold, "consistency": same,
                         "agreement": round(tokens, 4), "identical": round(identical, 4),
                         "levels": round(exits.mean_levels, 3),
                         "seconds": round(seconds, 2)})  # fmt: skip
            log(f"{name}: valid {test_name} >= {threshold}: consistency {same:.4f}, token "
                f"agreement {tokens:.4f}, {exits.mean_levels:.2f} levels")  # fmt: skip
            save()
    chosen = {
        (test_name, target): calibrated(mine["calibration"][test_name], target)
        for test_name in args.tests for target in args.agreements
    }  # fmt: skip
    # 2. the test set, 3. the floor
    for setting in ("batch 64 beam 4", "batch 64 greedy", "batch 1 beam 4"):
        run = Run(model, test, setting, args.sentences, args.batch)
        points = [(None, None, None)]  # full depth first
        for test_name in args.tests:
            grid = GRIDS[test_name] if setting == "batch 64 beam 4" else ()
            for target in args.agreements:
                t = chosen[(test_name, target)]
                if t is not None:
                    points.append((test_name, t, target))
            points += [(test_name, t, None) for t in grid]
            if setting == "batch 64 beam 4":
                points.append((test_name, NEVER, "never"))  # the test's own cost
        points.append(("saturation", -1.0, "floor"))
        full_hyps = None
        for test_name, threshold, target in points:
            key = {"setting": setting, "test": test_name or FULL, "threshold": threshold}
            if any(all(p.get(k) == v for k, v in key.items()) for p in mine["points"]):
                continue
            if full_hyps is None:
                full_hyps, full_seconds, _ = run(None)
                full_bleu = bleu(test, full_hyps)
            if test_name is None:
                hyps, seconds, tokens = full_hyps, full_seconds, None
                exits = None
            else:
                exits = _exits(model, test_name, threshold, min_level, units)
                hyps, seconds, tokens = run(exits)
            n_tokens = sum(len(h) for h in hyps.values())
            point = {
                **key,
                "calibrated_for": target,
                "bleu": bleu(test, hyps) if exits else full_bleu,
                "seconds": round(seconds, 3),
                "tokens_per_s": round(n_tokens / seconds, 1),
                "levels": round(exits.mean_levels, 3) if exits else levels,
                "agreement": round(agreement(full_hyps, hyps)[0], 4),
                "consistency": consistency(test, full_hyps, hyps),
                "p": paired_p(test, full_hyps, hyps) if exits else None,
                "sentences": len(hyps),
            }
            mine["points"].append(point)
            log(f"{name}: {setting} {key['test']} {threshold}: BLEU {point['bleu']}, "
                f"{point['tokens_per_s']} tokens/s, {point['levels']} levels")  # fmt: skip
            save()
        if setting == "batch 64 beam 4" and "time" not in mine:
            best = chosen.get((args.tests[0], args.agreements[-1]))
            mine["time"] = {
                FULL: where_time_goes(run, None),
                "floor": where_time_goes(run, _exits(model, "saturation", -1.0, min_level)),
            }
            if best is not None:
                label = f"{args.tests[0]} >= {best:g}"
                mine["time"][label] = where_time_goes(run, _exits(model, args.tests[0], best,
                                                                  min_level, units))  # fmt: skip
            save()


# torch operators by what they do in a decoding step (the profile of "where the time goes")
OPERATIONS = {
    "linear layers (levels, output layer)": ("aten::mm", "aten::addmm", "aten::bmm"),
    "cache reorders and row writes": ("aten::index_select", "aten::index_copy_"),
    "attention": ("aten::_scaled_dot_product_flash_attention_for_cpu",),
    "search (log-softmax, top-k)": ("aten::_log_softmax", "aten::topk"),
}


def where_time_goes(run: Run, exits: Exits | None, batches: int = 4) -> dict[str, float]:
    """Milliseconds of the first ``batches`` batches of ``run`` by :data:`OPERATIONS` (self
    CPU time of torch's profiler; the rest: every other operator and Python)."""
    from torch.profiler import ProfilerActivity, profile

    stack = run.model.decoder.stack
    kept = run.batches
    run.batches = kept[:batches]
    try:
        stack.set_exits(exits)
        with profile(activities=[ProfilerActivity.CPU]) as prof, torch.no_grad():
            start = time.perf_counter()
            run.make().generate([run.model], run.batches[0][1])
            for _, sample in run.batches[1:]:
                run.make().generate([run.model], sample)
            total = (time.perf_counter() - start) * 1000
    finally:
        stack.set_exits(None)
        run.batches = kept
    by_op = {e.key: e.self_cpu_time_total / 1000 for e in prof.key_averages()}
    out = {what: round(sum(by_op.get(op, 0.0) for op in ops), 1)
           for what, ops in OPERATIONS.items()}  # fmt: skip
    out["everything else"] = round(total - sum(out.values()), 1)
    return out


def calibrated(rows: list[dict], target: float) -> float | None:
    """The threshold of fewest levels whose validation consistency with full depth is at
    least ``target`` (None: none reaches it)."""
    ok = [r for r in rows if r["consistency"] >= target]
    return min(ok, key=lambda r: r["levels"])["threshold"] if ok else None


def measure(args: argparse.Namespace, specs: dict[str, Any]) -> None:
    """Measures every trained model of ``args.models``, writes the JSON beside ``args.doc``
    after each point, then the page and its plot."""
    torch.set_num_threads(args.threads)
    raw = args.doc.with_suffix(".json")
    record = json.loads(raw.read_text()) if raw.exists() else {}
    record["settings"] = {k: str(v) for k, v in vars(args).items() if k != "step"}
    models = record.setdefault("models", {})

    def log(line: str) -> None:
        print(line, flush=True)

    def save() -> None:
        write_json(raw, record)

    for name in args.models:
        path = args.out / name / "checkpoints" / "checkpoint_last.pt"
        if not path.exists():
            log(f"{name}: not trained ({portable(path)}); python scripts/adaptive_depth.py train")
            continue
        models[name] = specs[name][2]
        model = load(path, args.device)[0]
        units = exit_units(path, args, log) if "classifier" in args.tests else None
        measure_model(name, model, args, record.setdefault("results", {}), save, log, units)
    from studies.adaptive.report import write_report

    write_report(args.doc, json.loads(raw.read_text()))


__all__ = ["GRIDS", "agreement", "calibrated", "consistency", "exit_units", "measure", "paired_p"]
