"""ACT's two halting rules on one trained Universal Transformer + ACT checkpoint.

Decodes a subset with fairseq's beam search under the ``authors`` rule (halted positions are
still transformed) and the ``paper`` rule (UT sec. 2.2: halted positions leave the level
loop; :mod:`recurnmt.modules.act_rule`), the same weights switched between them
(:func:`~recurnmt.modules.act_rule.set_act_rule`), and reports for each: sacreBLEU, the share
of sentences whose best hypothesis is the same under both rules, the levels run (positions
entering a block's FFN per source token, encoder; per decoded row-step, decoder: the work
done, not the ACT depth) and the time per sentence at ``--batch`` sentences with beam
``--beam`` and at one sentence per batch (``--single`` sentences of the subset).

    python scripts/act_rule.py --checkpoint checkpoints/ut_act/checkpoint_best.pt \\
        --data data-bin/wmt14_en_de --out results/act_rule

Writes ``act_rule.json`` and ``act_rule.md`` to ``--out`` and prints the table. A benchmark,
not a test: ``tests/test_act_rule.py`` runs its CPU path on a tiny checkpoint.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from recurnmt.cli import entry_point
from recurnmt.experiments.artifacts import write_json

PROG = "python scripts/act_rule.py"
RULES = ("authors", "paper")


class WorkCounter:
    """Counts the positions entering the blocks' FFNs of a side and the positions the side's
    stack is called on (forward hooks; removed by :meth:`close`)."""

    def __init__(self, side) -> None:
        self.ffn = 0
        self.positions = 0
        self.real = 0
        stack = side.stack
        self.handles = [
            block.ffn.register_forward_hook(self._ffn) for block in stack.blocks if block.ffn
        ]
        self.handles.append(stack.register_forward_pre_hook(self._call, with_kwargs=True))

    def _ffn(self, module, inputs, output) -> None:
        self.ffn += inputs[0].shape[:-1].numel()

    def _call(self, module, args, kwargs) -> None:
        x = args[0]
        self.positions += x.shape[:-1].numel()
        pad = kwargs.get("padding_mask")
        self.real += x.shape[:-1].numel() - (0 if pad is None else int(pad.sum()))

    @property
    def levels(self) -> float:
        """FFN positions per real position (0 before any)."""
        return self.ffn / self.real if self.real else 0.0

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()


def decode(model, task, batches, search: dict[str, Any], post_process: str | None) -> dict:
    """Beam search (``search``: SequenceGenerator's settings) over ``batches``: {sentence id:
    (best hypothesis, reference)}, the seconds it took and the levels each side ran (see
    :class:`WorkCounter`)."""
    import torch
    from fairseq.sequence_generator import SequenceGenerator

    generator = SequenceGenerator([model], task.target_dictionary, **search)
    device = next(model.parameters()).device
    dictionary = task.target_dictionary
    counters = {side: WorkCounter(getattr(model, side)) for side in ("encoder", "decoder")}
    out: dict[int, tuple[str, str]] = {}
    seconds = 0.0
    try:
        for sample in batches:
            sample = _to(sample, device)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            with torch.no_grad():
                hyps = generator.generate([model], sample)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            seconds += time.perf_counter() - start
            for i, sid in enumerate(sample["id"].tolist()):
                target = sample["target"][i]
                target = target[target.ne(dictionary.pad())]
                out[sid] = (
                    dictionary.string(hyps[i][0]["tokens"].int().cpu(), post_process),
                    dictionary.string(target.int().cpu(), post_process),
                )
    finally:
        for counter in counters.values():
            counter.close()
    return {
        "sentences": out,
        "seconds": seconds,
        "levels": {side: c.levels for side, c in counters.items()},
    }


def _to(sample: dict[str, Any], device) -> dict[str, Any]:
    from fairseq import utils

    return utils.move_to_cuda(sample, device) if device.type == "cuda" else sample


def compare(model, task, batches, single, search: dict[str, Any], post_process: str | None):
    """Both rules on ``batches`` (and on ``single``, one sentence a batch) with beam search's
    settings ``search``: the record."""
    import sacrebleu

    from recurnmt.modules.act_rule import set_act_rule

    if set_act_rule(model, RULES[0]) == 0:
        raise ValueError("the checkpoint has no ACT halting units (train with --act on)")
    runs, record = {}, {"beam": search["beam_size"], "rules": {}}
    for rule in RULES:
        set_act_rule(model, rule)
        decode(model, task, batches[:1], search, post_process)  # warm-up, untimed
        runs[rule] = run = decode(model, task, batches, search, post_process)
        alone = decode(model, task, single, search, post_process) if single else None
        ids = sorted(run["sentences"])
        hyps = [run["sentences"][i][0] for i in ids]
        refs = [run["sentences"][i][1] for i in ids]
        record["rules"][rule] = {
            "sacrebleu": round(sacrebleu.corpus_bleu(hyps, [refs]).score, 2),
            "levels_encoder": round(run["levels"]["encoder"], 3),
            "levels_decoder": round(run["levels"]["decoder"], 3),
            "ms_per_sentence_batch": round(1000 * run["seconds"] / max(len(ids), 1), 3),
            "ms_per_sentence_single": None
            if alone is None
            else round(1000 * alone["seconds"] / max(len(alone["sentences"]), 1), 3),
        }
    a, b = (runs[rule]["sentences"] for rule in RULES)
    record["sentences"] = len(a)
    record["identical_share"] = round(sum(a[i][0] == b[i][0] for i in a) / max(len(a), 1), 4)
    set_act_rule(model, RULES[0])
    return record


def table(record: dict) -> str:
    """The record as a markdown table."""
    lines = [
        f"{record['sentences']} sentences, beam {record['beam']}; identical best hypotheses: "
        f"{100 * record['identical_share']:.1f}%",
        "",
        "| rule | sacreBLEU | levels (enc) | levels (dec) | ms/sent (batch) | ms/sent (1) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for rule, r in record["rules"].items():
        single = "-" if r["ms_per_sentence_single"] is None else r["ms_per_sentence_single"]
        lines.append(
            f"| {rule} | {r['sacrebleu']} | {r['levels_encoder']} | {r['levels_decoder']} | "
            f"{r['ms_per_sentence_batch']} | {single} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, required=True, help="a UT-ACT checkpoint")
    parser.add_argument("--data", type=Path, required=True, help="its binarized data dir")
    parser.add_argument("--subset", default="test")
    parser.add_argument("--max-sentences", type=int, default=None, help="the first N (all)")
    parser.add_argument("--batch", type=int, default=64, help="sentences per batch")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--max-len-a", type=float, default=0, help="as fairseq-generate's")
    parser.add_argument("--max-len-b", type=int, default=200, help="as fairseq-generate's")
    parser.add_argument("--single", type=int, default=200,
                        help="sentences timed one per batch (0: none)")  # fmt: skip
    parser.add_argument("--post-process", default="sentencepiece",
                        help="fairseq's --post-process of the hypotheses ('none': none)")  # fmt: skip
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--out", type=Path, default=Path("results/act_rule"))
    opts = parser.parse_args(argv)
    if not opts.checkpoint.is_file():
        parser.error(f"--checkpoint {opts.checkpoint}: no such file")

    import torch

    from recurnmt.analysis.nmt_inputs import device_of, load_nmt_models, translation_batches

    if opts.threads:
        torch.set_num_threads(opts.threads)
    models, names, task = load_nmt_models([opts.checkpoint], opts.data, device_of(opts.device))
    batches = translation_batches(task, opts.subset, opts.max_sentences, opts.batch)
    single = translation_batches(task, opts.subset, opts.single, 1) if opts.single else []
    post = None if opts.post_process == "none" else opts.post_process
    search = {"beam_size": opts.beam, "max_len_a": opts.max_len_a, "max_len_b": opts.max_len_b}
    record = compare(models[0], task, batches, single, search, post)
    record.update(checkpoint=str(opts.checkpoint), arch=names[0], subset=opts.subset,
                  batch=opts.batch, device=str(next(models[0].parameters()).device))  # fmt: skip
    write_json(opts.out / "act_rule.json", record)
    text = table(record)
    (opts.out / "act_rule.md").write_text(text, encoding="utf-8")
    print(text, end="")


if __name__ == "__main__":
    sys.exit(entry_point(main, PROG)())
