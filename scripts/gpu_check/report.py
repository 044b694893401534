"""The check's report (item 3 of the package's docstring): ``docs/gpu_check.md`` and its
``.json``, written anew after every step. The markdown holds where the run stood, the device,
Python, torch, CUDA and the other versions, the tests' result, and the tables of ratios to
fairseq's ``transformer`` and to timm's ViT, each ratio next to its target (issue 13)."""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from recurnmt.experiments.artifacts import portable  # standard library only
from recurnmt.experiments.timed import Budget  # standard library only

if TYPE_CHECKING:
    from scripts.gpu_check.steps import Step

# the command, as the report and the check's errors name it
PROG = "python -m scripts.gpu_check"
NMT_BASELINE = "transformer"
VISION_BASELINE = "timm vit"


@dataclass(frozen=True)
class Target:
    """A ratio's target: ``>= bound`` (speed) or ``<= bound`` (memory)."""

    bound: float
    at_least: bool

    def met(self, ratio: float) -> bool:
        """Judged on the ratio as the report prints it (two decimals)."""
        shown, bound = round(ratio, 2), round(self.bound, 2)
        return shown >= bound if self.at_least else shown <= bound

    def cell(self, ratio: float) -> str:
        """The table's target cell: the bound, and met or **missed** by ``ratio``."""
        sign = ">=" if self.at_least else "<="
        return f"{sign} {self.bound:.2f} " + ("met" if self.met(ratio) else "**missed**")


NMT_TARGETED = ("train_tokens_per_s", "gen_sentences_per_s", "cross_cache_mb")


def nmt_targets(row: dict, base: dict, dtype: str) -> dict[str, Target | None]:
    """Issue 13's targets of one architecture's row (None: no target for this row).

    Speed, in fp16: weight-shared families (P* below the transformer's) at least as fast
    (the issue sets no speed target in other dtypes). Cache, in every dtype: the
    cross-attention keys and values at most M/N of the transformer's (M unique
    cross-attentions, N levels), which any decoder that projects the memory once per unique
    block meets, fairseq's own at M = N included.
    """
    shared = row["arch"] != base["arch"] and row["p_star"] < base["p_star"]
    speed = Target(1.0, at_least=True) if shared and dtype == "fp16" else None
    cache = Target(row["cross_attentions"] / row["levels"], at_least=False)
    return {"train_tokens_per_s": speed, "gen_sentences_per_s": speed, "cross_cache_mb": cache}


def ratio_rows(
    results: list[dict],
    name_key: str,
    columns: list[tuple[str, str, str]],
    targets=None,
    targeted: tuple[str, ...] = (),
) -> list[str]:
    """Markdown table rows: each column's value, its ratio to the first row and, for the
    ``targeted`` columns, the target ``targets(row, base)`` gives (or -) with met / missed."""
    base = results[0]
    header = [name_key]
    for title, key, _ in columns:
        header += [title, "ratio"] + (["target"] if key in targeted else [])
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for row in results:
        goals = targets(row, base) if targets else {}
        cells = [f"`{row[name_key]}`"]
        for _, key, fmt in columns:
            ratio = row[key] / max(base[key], 1e-12)
            cells += [format(row[key], fmt), f"{ratio:.2f}"]
            if key in targeted:
                goal = goals.get(key)
                cells.append(goal.cell(ratio) if goal else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


NMT_COLUMNS = [
    ("train tok/s", "train_tokens_per_s", ".0f"),
    ("gen sent/s", "gen_sentences_per_s", ".1f"),
    ("peak MB", "peak_mem_mb", ".0f"),
    ("cross-attn cache MB", "cross_cache_mb", ".2f"),
    ("cache MB", "cache_mb", ".2f"),
    # what an update computes per token (SReT's projections: more) and how fast it runs it
    ("train FLOP/token", "train_flops_per_token", ".3g"),
    ("train FLOP/s", "train_flops_per_s", ".3g"),
]
VISION_COLUMNS = [
    ("train img/s", "train_images_per_s", ".1f"),
    ("infer img/s", "infer_images_per_s", ".1f"),
    ("peak MB", "peak_mem_mb", ".0f"),
]


def settings_line(doc: dict) -> str:
    """A benchmark's settings (``scripts/benchmark_{nmt,vision}.py``'s document), in words."""
    s = doc["settings"]
    if "img_size" in s:
        return (
            f"D={s['embed_dim']}, FF={s['ffn_dim']}, {s['heads']} heads, {s['levels']} levels, "
            f"{s['img_size']} px in {s['patch_size']} px patches, batches of {s['batch_size']}, "
            f"{s['steps']} timed updates"
        )
    return (
        f"H={s['embed_dim']}, FF={s['ffn_dim']}, {s['heads']} heads, {s['levels']} levels, "
        f"{s['max_tokens']} tokens a batch, {s['steps']} timed updates; {s['sentences']} "
        f"sentences decoded in batches of {s['gen_batch']}, beam {s['beam']}, "
        f"{s['decode_len']} tokens each"
    )


FAIRSEQ_COLUMNS = [
    ("train words/s (epoch 2)", "train_wps", ".0f"),
    ("epoch 1", "first_epoch_wps", ".0f"),
    ("generate sentences/s", "gen_sentences_per_s", ".1f"),
    ("tokens/s", "gen_tokens_per_s", ".0f"),
]


def status_lines(check: dict) -> list[str]:
    """Where the run stood when the report was written."""
    done, skipped = check["done"], check["skipped"]
    left = [s for s in check["steps"] if s not in done and s not in skipped]
    budget = f"{check.get('elapsed_s', 0):.0f} s of a budget of {check['budget_s']:.0f} s"
    if check["status"] == "complete":
        line = f"**Complete** after {budget}."
    else:
        line = (
            f"**In progress** when this report was written, after {budget}: a run stopped "
            "there leaves this report as it stands."
        )
    lines = [line, ""]
    if done:
        lines.append(f"Steps done: {', '.join(done)}.")
    if skipped:
        lines.append("Not run: " + "; ".join(f"{k} ({v})" for k, v in skipped.items()) + ".")
    if left:
        lines.append(f"Not reached yet: {', '.join(left)}.")
    lines.append(f"Every command's output: `{check['log']}`.")
    return lines


def failed_lines(doc: dict) -> list[str]:
    """The section of a step that did not finish: why, and its output's last lines."""
    return ["The step did not finish:", "", "```", doc["error"], "```"]


def fairseq_lines(check: dict) -> list[str]:
    """The sections of the real ``fairseq-train`` and ``fairseq-generate``, one per dtype."""
    lines = []
    for dtype, doc in check["fairseq"].items():
        lines += ["", f"## fairseq-train and fairseq-generate, {dtype}", ""]
        if "error" in doc:
            lines += failed_lines(doc)
            continue
        if "incomplete" in doc:
            lines += ["The step stopped before every architecture was measured:", "", "```"]
            lines += [doc["incomplete"], "```", ""]
        s = doc["settings"]
        lines += [
            f"The real command lines (`scripts/fairseq_speed.py`), one architecture after "
            f"the other on the embedded corpus ({s['max_train']} training pairs, batches of "
            f"{s['max_tokens']} tokens; H={s['embed_dim']}, FF={s['ffn_dim']}, {s['heads']} "
            f"heads, {s['levels']} levels). Steady state: the last of {s['epochs']} epochs is "
            "timed (the first meets every batch shape for the first time; its speed is shown "
            f"beside). Generation: {generated_part(s)}, beam {s['beam']}, "
            f"{generated_length(s)}, as `fairseq-generate` reports its own speed. "
            "Ratios to the first row.",
            "",
            *ratio_rows(doc["results"], "arch", FAIRSEQ_COLUMNS),
        ]
    return lines


def generated_part(settings: dict) -> str:
    """What of the test set ``scripts/fairseq_speed.py`` translated, in words."""
    shards = int(settings["gen_shards"])
    return "the test set" if shards == 1 else f"every {shards}th batch of the test set"


def generated_length(settings: dict) -> str:
    """How long its hypotheses were, in words."""
    length = int(settings.get("gen_len", 0))
    if not length:
        return "the models' own output lengths"
    return f"every hypothesis decoded to {length} tokens (the same work for every model)"


def decode_lines(check: dict) -> list[str]:
    """The sections of generation, one per ``Step.key``, with the fp16 speed target."""
    lines = []
    for key, doc in check.get("decode", {}).items():
        dtype = key.split()[0]  # "fp16" or "fp16 iwslt-b1" (Step.key)
        lines += ["", f"## Generation (beam search), {key}", ""]
        if "error" in doc:
            lines += failed_lines(doc)
            continue
        s = doc["settings"]
        lines += [
            f"fairseq's `SequenceGenerator` on {s['sentences']} test sentences in one batch, "
            f"beam {s['beam']}, exactly {s['decode_len']} tokens (`scripts/profile_decoding.py"
            f"`; H={s['embed_dim']}, FF={s['ffn_dim']}, {s['heads']} heads, {s['levels']} "
            f"levels). Every model is loaded at once and their {s['rounds']} timed rounds "
            "alternate; the fastest round counts. Speed ratio: fairseq's transformer's time "
            "per step over the family's (target in fp16: at least 1.0). Rows `ARCH static`: "
            "the same model decoded by `--static-decoding`'s beam search (each step after the "
            "first a CUDA graph where it was captured), with the path it took and how many of "
            "the batch's best hypotheses equal the plain beam search's.",
            "",
            "| arch | ms per step | median | speed ratio | target |",
            "| --- | --- | --- | --- | --- |",
        ]
        base = doc["results"][0]
        for row in doc["results"]:
            ratio = base["wall_ms_per_step"] / row["wall_ms_per_step"]
            goal = Target(1.0, at_least=True) if row is not base and dtype == "fp16" else None
            arch = f"`{row['arch']}`"
            if "identical" in row:
                arch += f" ({row['path']}; identical {row['identical']})"
            lines.append(
                f"| {arch} | {row['wall_ms_per_step']:.3f} | "
                f"{row['median_ms_per_step']:.3f} | {ratio:.2f} | "
                f"{goal.cell(ratio) if goal else '-'} |"
            )
    return lines


def render_report(check: dict) -> str:
    """The markdown report of one run, as far as it got (``check``: see :class:`Report`)."""
    env = check["environment"]
    lines = [
        "# GPU check",
        "",
        f"Written by `{check['command']}` on {check['date']}"
        + (" (**CPU smoke run at a tiny size: no GPU figure**)." if check["smoke"] else "."),
        "",
        *status_lines(check),
        "",
        "| | |",
        "| --- | --- |",
    ]
    if env:
        lines += [
            f"| device | {env['device_name']} |",
            f"| Python | {env['python']} |",
            f"| torch | {env['torch']} (CUDA {env['cuda']}, cuDNN {env['cudnn']}) |",
        ]
        lines += [f"| {k} | {v or 'not installed'} |" for k, v in env["packages"].items()]
        policy = check.get("sdpa", "no-cudnn")
        order = (
            "torch's own order (cuDNN first on Hopper in fp16/bf16)"
            if policy == "torch"
            else "cuDNN's attention last in torch's order (`TORCH_CUDNN_SDPA_DEPRIORITIZED`)"
        )
        lines.append(f"| attention | `RECURNMT_SDPA={policy}`: {order}, every model alike |")
    if check["setup"]:
        source = check["setup"]["wheels"] or "the package index"
        lines.append(f"| set-up (`.venv-gpu`) | {check['setup']['seconds']:.0f} s, from {source} |")
    tests = check["tests"]
    if tests:
        lines.append(f"| tests (`pytest -m cuda`) | {tests['summary']} |")
        lines += [f"| failed | `{name}` |" for name in tests.get("failed", [])]
    lines += decode_lines(check)
    lines += fairseq_lines(check)
    sections = [
        ("Translation", "nmt", "arch", NMT_COLUMNS, NMT_BASELINE),
        ("Images", "vision", "model", VISION_COLUMNS, VISION_BASELINE),
    ]
    for title, key, name_key, columns, baseline in sections:
        for dtype, doc in check[key].items():
            targeted, targets = (), None
            if key == "nmt":
                targeted = NMT_TARGETED
                targets = functools.partial(nmt_targets, dtype=dtype)
            lines += ["", f"## {title}, {dtype}", ""]
            if "error" in doc:
                lines += failed_lines(doc)
                continue
            lines += [
                f"Ratios to `{baseline}`, measured in the same run; {settings_line(doc)}. "
                f"Memory is the peak `torch.cuda.max_memory_allocated` of one training step"
                + (" (on the CPU: the bytes saved for backward)." if check["smoke"] else "."),
                "",
                *ratio_rows(doc["results"], name_key, columns, targets, targeted),
            ]
            if key == "nmt":
                lines += [
                    "",
                    "The cache is the decoder's incremental state after beam search decoded one "
                    "batch; its cross-attention part is the projected encoder keys and values. "
                    "Speed targets (issue 13) apply to the weight-shared families (P* below "
                    "the transformer's) in fp16; the cache target M/N holds for M unique "
                    "cross-attentions over N levels.",
                ]
    return "\n".join(lines) + "\n"


class Report:
    """``docs/gpu_check.md`` and ``.json``, written anew after every step: a run stopped at
    any point leaves the figures measured up to there."""

    def __init__(self, opts: argparse.Namespace, steps: list[Step], budget: Budget) -> None:
        self.out, self.budget = opts.out, budget
        now = datetime.datetime.now(datetime.UTC)
        self.check = {
            "command": "make gpu-check" if not opts.cpu_smoke else f"{PROG} --cpu-smoke",
            "date": now.strftime("%Y-%m-%d %H:%M UTC"),
            "smoke": opts.cpu_smoke,
            "budget_s": budget.seconds,
            "status": "running",
            "steps": [s.name for s in steps],
            "done": [],
            "skipped": {},
            "log": str(opts.log),
            "environment": {},
            # the attention kernels' order, every model's (recurnmt/modules/sdpa.py)
            "sdpa": os.environ.get("RECURNMT_SDPA") or "no-cudnn",
            "setup": None,
            "tests": None,
            "decode": {},
            "fairseq": {},
            "nmt": {},
            "vision": {},
        }

    def write(self) -> None:
        """Both files, each replaced whole."""
        self.check["elapsed_s"] = round(self.budget.elapsed(), 1)
        self.out.parent.mkdir(parents=True, exist_ok=True)
        for path, text in (
            (self.out, render_report(self.check)),
            (self.out.with_suffix(".json"), json.dumps(portable(self.check), indent=2) + "\n"),
        ):
            part = path.with_name(path.name + ".part")
            part.write_text(text, encoding="utf-8")
            part.replace(path)  # whole or not at all, should the run be stopped while writing

    def record(self, step: Step, result: dict) -> None:
        """``step``'s result, in its part of the report, which is written anew."""
        if step.part == "tests":
            self.check["tests"] = result
        else:
            self.check[step.part][step.key] = result
        self.check["done"].append(step.name)
        self.write()
