"""The measurements of ``scripts/speculative.py``: self-speculative decoding of trained models
on the embedded test set, against plain decoding and fairseq's transformer (docs/speculative.md).

Every figure is measured in this process, on the CPU with one thread by default (``--device
cuda --dtype fp16`` on a GPU, the timings then synchronised with the device), one model at a
time (its timing rounds taking turns), each model's figures saved as soon as they are measured:
BLEU at full depth and of the drafts alone, identical outputs of speculative and plain greedy
decoding, tokens/s at batch 1 and in batches, and how often a draft reproduces a beam-search
step (the bound on exact beam speculation).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from fairseq import search
from fairseq.sequence_generator import SequenceGenerator

from recurnmt.experiments.artifacts import portable, write_json
from recurnmt.experiments.benchmark import generation_batches, translation_task
from recurnmt.experiments.scoring import corpus_bleu
from recurnmt.modules.mixed_depth import first_levels

BEAM, LENPEN = 4, 1.5  # the demo's decoding (docs/demo.md)
NO_DRAFT = "no draft"  # --draft-levels 0: the speculative loop decoding at full depth


DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def load(checkpoint: Path, device: torch.device | str = "cpu", dtype: str = "fp32"):
    """The trained model (evaluation mode, in ``dtype`` on ``device``) and its task."""
    from fairseq import checkpoint_utils

    import recurnmt.nmt  # noqa: F401  (the plugin)

    models, _cfg, task = checkpoint_utils.load_model_ensemble_and_task([str(checkpoint)])
    return models[0].to(device=device, dtype=DTYPES[dtype]).eval(), task


class TestSet:
    """The embedded test set (or another ``subset``) as fairseq batches it, with its raw
    references."""

    def __init__(self, data: Path, device: torch.device | str = "cpu", subset: str = "test"):
        self.device = torch.device(device)
        task = translation_task(data, subset)
        self.dataset = task.dataset(subset)
        self.pad = task.source_dictionary.pad()
        self.left_pad = task.cfg.left_pad_source
        self.tgt_dict = task.target_dictionary
        self.references = (data / f"{subset}.raw.en").read_text(encoding="utf-8").splitlines()
        self.by_length = sorted(range(len(self.dataset)), key=lambda i: self.dataset.src_sizes[i])

    def batches(self, ids: Sequence[int], size: int) -> list[tuple[list[int], dict]]:
        """``ids`` in batches of ``size`` (sorted by length, as fairseq-generate batches)."""
        ordered = sorted(ids, key=lambda i: self.dataset.src_sizes[i])
        out = []
        for start in range(0, len(ordered), size):
            chunk = ordered[start : start + size]
            sample = self.dataset.collater([self.dataset[i] for i in chunk])
            (net,) = generation_batches(sample, len(chunk), len(chunk), self.pad, self.left_pad)
            net = {k: v.to(self.device) for k, v in net.items()}
            out.append((sample["id"].tolist(), {"net_input": net}))
        return out

    def spread(self, n: int) -> list[int]:
        """``n`` sentences spread over the lengths of the test set."""
        step = max(1, len(self.by_length) // n)
        return self.by_length[::step][:n]

    def detokenized(self, tokens: torch.Tensor) -> str:
        return self.tgt_dict.string(tokens, "sentencepiece")


def decode(generator, model, batches) -> tuple[dict[int, torch.Tensor], float, int]:
    """Every sentence's best hypothesis, the wall time and the tokens generated."""
    out, tokens = {}, 0
    device = next(model.parameters()).device
    synchronize = torch.cuda.synchronize if device.type == "cuda" else lambda *_: None
    synchronize(device)
    start = time.perf_counter()
    with torch.no_grad():
        for ids, sample in batches:
            for i, hypos in zip(ids, generator.generate([model], sample), strict=True):
                out[i] = hypos[0]["tokens"].cpu()
                tokens += hypos[0]["tokens"].numel()
    synchronize(device)
    return out, time.perf_counter() - start, tokens


def bleu(test: TestSet, hypotheses: dict[int, torch.Tensor]) -> float:
    ids = sorted(hypotheses)
    refs = [test.references[i] for i in ids]
    score, _ = corpus_bleu([test.detokenized(hypotheses[i]) for i in ids], refs)
    return round(score.score, 2)


def greedy(model, tgt_dict, **kwargs) -> SequenceGenerator:
    return SequenceGenerator([model], tgt_dict, beam_size=1, max_len_a=1.5, max_len_b=10, **kwargs)


def speculative(model, tgt_dict, levels: int, tokens: int, compiled: bool = False):
    from recurnmt.nmt.speculative import SpeculativeSequenceGenerator

    return SpeculativeSequenceGenerator(
        [model], tgt_dict, beam_size=1, max_len_a=1.5, max_len_b=10, draft_levels=levels,
        draft_tokens=tokens, compiled=compiled,
    )  # fmt: skip


def beam(model, tgt_dict) -> SequenceGenerator:
    return SequenceGenerator(
        [model], tgt_dict, beam_size=BEAM, len_penalty=LENPEN, max_len_a=1.5, max_len_b=10
    )


def can_draft(model) -> bool:
    stack = getattr(model.decoder, "stack", None)
    return stack is not None and stack.halting is None


def quality(test: TestSet, model, max_levels: int, log: Callable[[str], None], name: str) -> dict:
    """BLEU of a model at full depth (beam 4) and greedy, of its drafts alone (greedy at their
    first R levels), and how many sentences speculative greedy decodes as plain greedy does,
    for every R up to ``max_levels`` (K = 4), on the whole test set in batches of 64."""
    everything = test.batches(range(len(test.dataset)), 64)
    row: dict[str, Any] = {}
    hyps, _, _ = decode(beam(model, test.tgt_dict), model, everything)
    row["beam4"] = bleu(test, hyps)
    plain, _, _ = decode(greedy(model, test.tgt_dict), model, everything)
    row["greedy"] = bleu(test, plain)
    log(f"{name}: BLEU beam 4 {row['beam4']}, greedy {row['greedy']}")
    if can_draft(model):
        stack = model.decoder.stack
        row["draft"], row["identical"] = {}, {}
        for r in range(1, min(stack.num_levels, max_levels + 1)):
            with first_levels(stack, r):
                drafted, _, _ = decode(greedy(model, test.tgt_dict), model, everything)
            row["draft"][r] = bleu(test, drafted)
            spec, _, _ = decode(speculative(model, test.tgt_dict, r, 4), model, everything)
            same = sum(torch.equal(spec[i], plain[i]) for i in plain)
            row["identical"][r] = {"same": same, "of": len(plain)}
            differ = [i for i in plain if not torch.equal(spec[i], plain[i])]
            if differ:
                row["identical"][r]["margins"] = [_margin(model, test, i, plain[i], spec[i])
                                                  for i in differ]  # fmt: skip
            log(f"  R={r}: draft alone {row['draft'][r]} BLEU; speculative greedy "
                f"identical to greedy on {same} of {len(plain)}")  # fmt: skip
    return row


def _margin(model, test: TestSet, i: int, plain: torch.Tensor, spec: torch.Tensor) -> float:
    """Where two greedy outputs of sentence ``i`` part: the gap between the two best logits of
    the full model there (one full forward at batch 1 over the common prefix). A gap at float32
    rounding (1e-6 of logits near 10) is a tie that the order of a sum decides: plain decoding
    in a batch and at batch 1 part there too."""
    a, b = plain.tolist(), spec.tolist()
    j = next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    src = test.dataset[i]["source"][None].to(test.device)
    prev = torch.tensor([[test.tgt_dict.eos(), *a[:j]]], device=test.device)
    with torch.no_grad():
        lengths = torch.tensor([src.size(1)], device=test.device)
        logits = model(src, lengths, prev)[0][0, -1].float()
    top = logits.topk(2).values
    return float(top[0] - top[1])


def speed(test: TestSet, model, args: argparse.Namespace, log: Callable[[str], None],
          name: str) -> list[dict]:  # fmt: skip
    """Tokens/s and sentences/s of a model at batch 1 (``args.sentences`` sentences spread
    over the test set) and in batches of ``args.batch``: fairseq's greedy search (and beam 4 at
    batch 1), recurnmt's loop without drafts (``--draft-levels 0``), speculative greedy for
    every R up to ``args.max_draft_levels`` and K (in batches: K = 4);
    every configuration once a round, the rounds taking turns, the fastest round kept."""
    one = test.batches(test.spread(args.sentences), 1)
    batched = test.batches(test.spread(args.sentences), args.batch)
    tgt = test.tgt_dict
    configs: list[tuple[str, Callable[[], Any]]] = [
        ("greedy", lambda: greedy(model, tgt)), ("beam4", lambda: beam(model, tgt))
    ]  # fmt: skip
    if can_draft(model):  # recurnmt's loop without drafts: what speculation itself adds
        configs.append((NO_DRAFT, lambda: speculative(model, tgt, 0, 1)))
        for r in range(1, min(model.decoder.stack.num_levels, args.max_draft_levels + 1)):
            for k in args.draft_tokens:
                make = lambda r=r, k=k: speculative(model, tgt, r, k)  # noqa: E731
                configs.append((f"spec R={r} K={k}", make))
    results: dict[tuple[str, str], dict] = {}
    for round_ in range(args.rounds):
        for run, make in configs:
            for setting, batches in (("batch 1", one), (f"batch {args.batch}", batched)):
                if setting != "batch 1" and (run == "beam4" or run.startswith("spec") and
                                             not run.endswith(" K=4")):  # fmt: skip
                    continue
                generator = make()
                _, seconds, tokens = decode(generator, model, batches)
                best = results.get((run, setting))
                if best is None or seconds < best["seconds"]:
                    stats = getattr(generator, "stats", None)
                    results[(run, setting)] = {
                        "model": name, "run": run, "setting": setting,
                        "seconds": round(seconds, 3), "tokens": tokens,
                        "sentences": sum(len(ids) for ids, _ in batches),
                        "accepted": None if stats is None else round(stats.row_accepted, 3),
                        "tokens_per_verification": None if stats is None
                        else round(stats.tokens_per_verification, 3),
                    }  # fmt: skip
        log(f"{name}: speed round {round_ + 1} of {args.rounds} done")
    rows = list(results.values())
    for row in rows:
        row["tokens_per_s"] = round(row["tokens"] / row["seconds"], 1)
        row["sentences_per_s"] = round(row["sentences"] / row["seconds"], 2)
    return rows


def costs(test: TestSet, model, args: argparse.Namespace, results: dict,
          log: Callable[[str], None], name: str) -> dict | None:  # fmt: skip
    """Where the time of batch-1 speculation goes, for the model's fastest setting at batch 1
    (from its speed rows): the loop without drafts and that setting, each once a round, the
    fastest round kept, with the loop's own clocks
    (:class:`~recurnmt.modules.decoding.speculative.Statistics`): the seconds of drafting (every draft
    pass: K drafts and the last draft's own pass) and of verifying (the deep levels over K + 1
    positions, the output layer, the acceptance and the caches' truncation), and the rest (the
    encoder, the generator's own work). From them: a draft pass and a verification against one
    step without drafts, and the speed speculation would reach if drafting cost nothing."""
    from studies.speculative.report import fastest_setting

    if (setting := fastest_setting(results, name)) is None:
        return None
    r, k = setting
    one = test.batches(test.spread(args.sentences), 1)
    best: dict[str, dict] = {}
    for _ in range(args.rounds):
        for run, levels, tokens in ((NO_DRAFT, 0, 1), (f"spec R={r} K={k}", r, k)):
            generator = speculative(model, test.tgt_dict, levels, tokens)
            _, seconds, generated = decode(generator, model, one)
            stats = generator.stats
            if run not in best or seconds < best[run]["seconds"]:
                best[run] = {
                    "seconds": round(seconds, 4), "tokens": generated,
                    "verifications": stats.verifications, "emitted": stats.emitted,
                    "draft_passes": stats.drafted + stats.verifications,
                    "draft_seconds": round(stats.draft_seconds, 4),
                    "verify_seconds": round(stats.verify_seconds, 4),
                }  # fmt: skip
    log(f"{name}: where the time goes at R={r}, K={k} measured")
    return {"R": r, "K": k, "plain": best[NO_DRAFT], "spec": best[f"spec R={r} K={k}"]}


def beam_agreement(test: TestSet, model, args: argparse.Namespace) -> dict:
    """How often the draft (the first R levels) would select the beam-4 step the full model
    selects (:func:`_same_selection`), and the mean run of consecutive agreeing steps: the
    bound on what exact beam speculation could accept."""
    out = {}
    ids = test.spread(min(args.sentences, 60))
    stack = model.decoder.stack
    for r in range(1, min(stack.num_levels, args.max_draft_levels + 1)):
        agree = _beam_steps(model, test, ids, r)
        out[r] = {"steps": sum(len(seq) for seq in agree)}
        for i, key in enumerate(("ordered", "as_sets")):
            steps = [a[i] for seq in agree for a in seq]
            runs = [len(run) for seq in agree
                    for run in "".join("1" if a[i] else "0" for a in seq).split("0")]  # fmt: skip
            out[r][key] = {
                "agreeing": round(sum(steps) / max(len(steps), 1), 3),
                "mean_run": round(statistics.mean(runs), 3) if runs else 0.0,
            }
    return out


def _beam_steps(
    model, test: TestSet, ids: Sequence[int], levels: int
) -> list[list[tuple[bool, bool]]]:
    """For every sentence, whether each beam-search step's candidates from the draft's
    log-probabilities equal the full model's (both from the same hypotheses)."""
    decoder = model.decoder
    stack = decoder.stack
    drafts: list[torch.Tensor] = []
    real_forward = decoder.forward

    def forward(prev, encoder_out=None, incremental_state=None, **kwargs):
        x, extra = real_forward(prev, encoder_out, incremental_state, return_all_hiddens=True)
        hidden = extra["inner_states"][levels - 1].transpose(0, 1)  # B x T x C, level R
        norm = stack.final_norm
        drafts.append(decoder.output_layer(hidden if norm is None else norm(hidden)))
        return x, extra

    bs = search.BeamSearch(test.tgt_dict)
    real_step, eos = bs.step, test.tgt_dict.eos()
    agreement: dict[int, list[tuple[bool, bool]]] = {}

    def step(step_, lprobs, scores, *args, **kwargs):
        full = real_step(step_, lprobs, scores, *args, **kwargs)
        draft = torch.log_softmax(drafts[-1][:, -1].float(), -1).view_as(lprobs)
        draft[..., test.tgt_dict.pad()] = -float("inf")
        mine = real_step(step_, draft, scores, *args, **kwargs)
        for row, ok in enumerate(_same_selection(full, mine, eos, BEAM)):
            agreement.setdefault(current[row], []).append(ok)
        return full

    bs.step = step
    generator = SequenceGenerator([model], test.tgt_dict, beam_size=BEAM, len_penalty=LENPEN,
                                  max_len_a=1.5, max_len_b=10, search_strategy=bs)  # fmt: skip
    decoder.forward = forward
    try:
        for batch_ids, sample in test.batches(ids, 1):
            current = batch_ids
            drafts.clear()
            with torch.no_grad():
                generator.generate([model], sample)
    finally:
        decoder.forward = real_forward
    return list(agreement.values())


def _same_selection(full, mine, eos: int, beam: int) -> list[tuple[bool, bool]]:
    """Per sentence, whether two beam-search steps select alike, as fairseq's
    ``SequenceGenerator`` uses a step's 2 x beam candidates: the hypotheses that end (eos among
    the first ``beam``) and the ``beam`` that go on (the first candidates that are not eos),
    their tokens and beams, in order and as sets (a speculation could follow a permutation).
    The scores do not enter: a verification recomputes them."""
    out = []
    for f_idx, f_beam, m_idx, m_beam in zip(full[1], full[2], mine[1], mine[2], strict=True):
        picks = []
        for idx, beams in ((f_idx, f_beam), (m_idx, m_beam)):
            ends = [b for t, b in zip(idx[:beam].tolist(), beams[:beam].tolist(), strict=True)
                    if t == eos]  # fmt: skip
            going = [(t, b) for t, b in zip(idx.tolist(), beams.tolist(), strict=True)
                     if t != eos][:beam]  # fmt: skip
            picks.append((ends, going))
        ordered = picks[0] == picks[1]
        as_sets = all(sorted(a) == sorted(b) for a, b in zip(*picks, strict=True))
        out.append((ordered, as_sets))
    return out


def measure(args: argparse.Namespace, specs: dict[str, tuple[str, tuple[str, ...], str]]) -> None:
    """Runs every measurement of the trained models of ``args.models`` (those trained), writes
    the JSON beside ``args.doc`` after each model's part (a stopped run resumes from there;
    delete the JSON to measure again), then the page and its plot."""
    torch.set_num_threads(args.threads)
    doc = args.doc
    raw = doc.with_suffix(".json")
    results = json.loads(raw.read_text()) if raw.exists() else {}

    def log(line: str) -> None:
        print(line, flush=True)

    test = TestSet(args.data, args.device)
    models = {}
    for name in args.models:
        path = args.out / name / "checkpoints" / "checkpoint_last.pt"
        if path.exists():
            models[name] = load(path, args.device, args.dtype)[0]
    results["models"] = {n: specs[n][2] for n in models}
    results["settings"] = {k: str(v) for k, v in vars(args).items() if k not in ("step",)}
    results.setdefault("speed", {"rows": []})
    for part, fn in (
        ("quality", lambda name, m: quality(test, m, args.max_draft_levels, log, name)),
        ("speed", lambda name, m: speed(test, m, args, log, name)),
        ("beam", lambda name, m: beam_agreement(test, m, args) if can_draft(m) else None),
        (
            "costs",
            lambda name, m: costs(test, m, args, results, log, name) if can_draft(m) else None,
        ),
    ):
        for name, model in models.items():  # one model at a time, kept as it is measured
            done = {r["model"] for r in results["speed"]["rows"]} if part == "speed" else \
                results.get(part, {})  # fmt: skip
            if name in done:
                log(f"{name}: {part} measured already ({portable(raw)})")
                continue
            value = fn(name, model)
            if part == "speed":
                results["speed"]["rows"] += value
            elif value is not None:
                results.setdefault(part, {})[name] = value
            write_json(raw, results)
    from studies.speculative.report import write_report

    write_report(doc, json.loads(raw.read_text()))  # the keys as the JSON has them
