"""docs/speculative.md and its plot, from the figures of :mod:`studies.speculative.measure`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

USAGE = """\
A recursive decoder's first R levels, with its final norm and output layer, are a complete,
cheaper model made of the same weights, and their keys and values are the full model's for those
levels. recurnmt decodes with them as a draft (`recurnmt/modules/decoding/speculative.py`): it drafts K
tokens with levels 1..R, verifies them with levels R+1..N in one pass that starts from the
draft's level-R states, keeps the longest prefix the full model agrees with plus the full
model's next token, and truncates every level's cache to what was kept. Greedy output is the
full model's greedy output token for token; sampling is speculative rejection sampling
(Leviathan et al. 2023), distributed exactly as the full model's samples.

```bash
fairseq-generate data-bin/lohelp_de_en_spm4000 --user-dir user_dir --path work/speculative/ringformer-random/checkpoints/checkpoint_last.pt \\
    --task speculative_translation --draft-levels 2 --draft-tokens 4 --beam 1 \\
    --gen-subset test --post-process sentencepiece    # or --draft-levels auto; or --sampling
```

`--draft-levels 0` runs the same loop without drafts: the full model one token at a time,
fairseq's greedy search (or sampler) without its beam bookkeeping, the same output; `auto`
times every R from 0 on the first batch and keeps the fastest. `fairseq-interactive` takes the
same flags; an exported model takes
`generate(..., draft_levels=2, draft_tokens=4)` (`python -m recurnmt.export`). The log says how many
drafts each verification accepted and what drafting and verifying took. A draft is good when
the model was trained for it: `fairseq-train ... --mixed-depth on --mixed-depth-levels R`
(the decoder's first R levels under the same loss) or `random` (R drawn for every batch).
Every family drafts but ACT (its halting mixes the outputs of every level: refused, naming
`--draft-levels`); SReT's and One Wide FFN's first levels are a valid draft, exact as any, but
their mixed-depth branch is not a prefix of their levels. Beam search does not speculate
(`--beam` above 1 is refused): the last table says why. A batch advances by its rows' smallest
acceptance, so speculation pays most sentence by sentence, if at all: on this CPU, at this
width, a verification over K + 1 positions costs about a step or more and a draft pass more
than its share of one (where the time goes, below), and the drafts' gain over the same loop
without them is small; the loop itself, `--draft-levels 0`, is the saving a user of
`fairseq-generate --beam 1` gets at every batch size. `--compile-decoding` compiles the loop
with `torch.compile`, and greedy, a whole round as one function (the K draft passes with their
embeddings and argmaxes, the verification, the acceptance): a round then costs the host one
call and one read, and the drafts pay on top of the compiled loop sentence by sentence
([Compiled decoding](compiled_decoding.md) measures it).

The tables set speculation against recurnmt's loop without drafts (`x no draft`: what the
drafts themselves buy) and against fairseq's greedy search (`x fairseq's search`: what a user
of plain `fairseq-generate --beam 1` gains, the loop's own saving included).""".splitlines()
NO_DRAFT = "no draft"
REFERENCE = "transformer"  # fairseq's transformer


def _rows(results: dict, setting: str) -> dict[tuple[str, str], dict]:
    return {(r["model"], r["run"]): r for r in results["speed"]["rows"] if r["setting"] == setting}


def _spec_runs(rows: dict, model: str) -> dict[tuple[int, int], dict]:
    out = {}
    for (name, run), row in rows.items():
        if name == model and run.startswith("spec"):
            r, k = (int(part.split("=")[1]) for part in run.split()[1:])
            out[r, k] = row
    return out


def fastest_setting(results: dict, model: str, setting: str = "batch 1") -> tuple[int, int] | None:
    """The draft depth R and length K of ``model``'s fastest speculative run at ``setting``
    (None where it has none)."""
    spec = _spec_runs(_rows(results, setting), model)
    if not spec:
        return None
    return max(spec.items(), key=lambda item: item[1]["tokens_per_s"])[0]


def _baseline(rows: dict, model: str) -> dict | None:
    """What speculation is set against: the same loop without drafts (older measurements:
    fairseq's greedy search)."""
    return rows.get((model, NO_DRAFT)) or rows.get((model, "greedy"))


def _ratio(row: dict | None, base: dict | None) -> str:
    return f"{row['tokens_per_s'] / base['tokens_per_s']:.2f}" if row and base else "-"


def speed_table(results: dict, setting: str) -> list[str]:
    """Per model: fairseq's greedy search, recurnmt's loop without drafts, its best
    speculative setting, beam 4 (batch 1 only)."""
    rows = _rows(results, setting)
    ref = rows.get((REFERENCE, "greedy"))
    lines = [
        "| model | fairseq's greedy search tokens/s | no draft tokens/s | speculative greedy: "
        "best R, K | tokens/s | x no draft | x fairseq's search | x fairseq's transformer | "
        "drafts accepted per verification | beam 4 tokens/s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for model in results["models"]:
        plain = rows.get((model, "greedy"))
        if plain is None:
            continue
        spec, bare = _spec_runs(rows, model), rows.get((model, NO_DRAFT))
        beam = rows.get((model, "beam4"))
        beam_cell = f"{beam['tokens_per_s']:.0f}" if beam else "-"
        bare_cell = f"{bare['tokens_per_s']:.0f}" if bare else "-"
        if not spec:
            lines.append(
                f"| {model} | {plain['tokens_per_s']:.0f} | {bare_cell} | - | - | - | - | - | - "
                f"| {beam_cell} |"
            )
            continue
        r, k = fastest_setting(results, model, setting)
        best = spec[r, k]
        lines.append(
            f"| {model} | {plain['tokens_per_s']:.0f} | {bare_cell} | R={r}, K={k} | "
            f"{best['tokens_per_s']:.0f} | {_ratio(best, bare)} | {_ratio(best, plain)} | "
            f"{_ratio(best, ref)} | {best['accepted']:.2f} | {beam_cell} |"
        )
    return lines


def grid_table(results: dict, model: str, setting: str = "batch 1") -> list[str]:
    rows = _rows(results, setting)
    plain = _baseline(rows, model)
    spec = _spec_runs(rows, model)
    if not spec or plain is None:
        return []
    ks = sorted({k for _, k in spec})
    lines = [
        "| R \\ K | " + " | ".join(str(k) for k in ks) + " |",
        "| --- | " + " | ".join("---" for _ in ks) + " |",
    ]
    for r in sorted({r for r, _ in spec}):
        cells = []
        for k in ks:
            row = spec.get((r, k))
            cells.append(
                "-" if row is None
                else f"{row['tokens_per_s'] / plain['tokens_per_s']:.2f} ({row['accepted']:.2f})"
            )  # fmt: skip
        lines.append(f"| {r} | " + " | ".join(cells) + " |")
    return lines


TARGET = 1.8  # issue 40's batch-1 greedy target against the same model without drafts


def costs_table(results: dict) -> list[str]:
    """Per model, at its fastest batch-1 setting: one step without drafts, one draft pass and
    one verification (ms, and against the step), the tokens a verification keeps, the speed
    against the loop without drafts as measured and as it would be if drafting cost nothing,
    and what a draft pass could cost at most for the target (the rest of the time as
    measured)."""
    costs = results.get("costs", {})
    if not costs:
        return []
    lines = [
        "| model | R, K | step without drafts, ms | draft pass, ms (x step) | verification, ms "
        f"(x step) | tokens per verification | x no draft | x no draft, drafts free | draft "
        f"pass for {TARGET}x, ms |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for model, c in costs.items():
        plain, spec = c["plain"], c["spec"]
        step = (plain["draft_seconds"] + plain["verify_seconds"]) / plain["verifications"]
        draft = spec["draft_seconds"] / spec["draft_passes"]
        verify = spec["verify_seconds"] / spec["verifications"]
        per_verification = spec["tokens"] / spec["verifications"]
        passes = spec["draft_passes"] / spec["verifications"]
        plain_token = plain["seconds"] / plain["tokens"]
        rest = (spec["seconds"] - spec["draft_seconds"] - spec["verify_seconds"]) / spec["tokens"]
        free = plain_token * spec["tokens"] / (spec["seconds"] - spec["draft_seconds"])
        allowed = (per_verification * (plain_token / TARGET - rest) - verify) / passes
        lines.append(
            f"| {model} | R={c['R']}, K={c['K']} | {step * 1e3:.2f} | {draft * 1e3:.2f} "
            f"({draft / step:.2f}) | {verify * 1e3:.2f} ({verify / step:.2f}) | "
            f"{per_verification:.2f} | {plain['seconds'] / spec['seconds']:.2f} | {free:.2f} | "
            f"{f'{allowed * 1e3:.2f}' if allowed > 0 else 'none'} |"
        )
    return lines


def quality_table(results: dict) -> list[str]:
    quality = results["quality"]
    rows = _rows(results, "batch 1") if "speed" in results else {}
    levels = max((len(q.get("draft", {})) for q in quality.values()), default=0)
    head = "| model | beam 4 | greedy | " + " | ".join(f"draft R={r}" for r in range(1, levels + 1))
    head += " | drafts accepted, R=1, K=4 |"
    lines = [head, "| --- | --- | --- |" + " --- |" * levels + " --- |"]
    for model, q in quality.items():
        drafts = [f"{q['draft'][str(r)]:.2f}" if str(r) in q.get("draft", {}) else "-"
                  for r in range(1, levels + 1)]  # fmt: skip
        spec = rows.get((model, "spec R=1 K=4"))
        accepted = f"{spec['accepted']:.2f} of 4" if spec else "-"
        lines.append(
            f"| {model} | {q['beam4']:.2f} | {q['greedy']:.2f} | "
            + " | ".join(drafts)
            + f" | {accepted} |"
        )
    return lines


def headline(results: dict) -> list[str]:
    """The setting whose drafts gain most at batch 1, against the same loop without drafts,
    fairseq's greedy search and fairseq's transformer, in one sentence."""
    rows = _rows(results, "batch 1")
    main = main_model(results)
    if main is None:
        return []
    (r, k), best = max(_spec_runs(rows, main).items(), key=lambda item: item[1]["tokens_per_s"])
    plain, ref = rows[(main, "greedy")], rows.get((REFERENCE, "greedy"))
    bare = rows.get((main, NO_DRAFT))
    versus = f", {_ratio(best, ref)}x fairseq's transformer's greedy search" if ref else ""
    own = f"{_ratio(best, bare)}x the same loop without drafts, " if bare else ""
    return [
        f"**At batch 1** the drafts gain most for `{main}` with R={r}, K={k}: "
        f"{best['tokens_per_s']:.0f} tokens/s, {own}{_ratio(best, plain)}x fairseq's greedy "
        f"search of the same model{versus}, accepting {best['accepted']:.2f} drafts per "
        "verification.",
    ]


def loop_line(results: dict) -> list[str]:
    """What recurnmt's loop itself gains over fairseq's greedy search, and what the drafts
    add to it, across the models, in one sentence per batch setting."""
    settings = results["settings"]
    lines = []
    for setting in ("batch 1", f"batch {settings['batch']}"):
        rows = _rows(results, setting)
        loop, drafts = [], []
        for model in results["models"]:
            plain, bare = rows.get((model, "greedy")), rows.get((model, NO_DRAFT))
            if not plain or not bare:
                continue
            loop.append(bare["tokens_per_s"] / plain["tokens_per_s"])
            spec = _spec_runs(rows, model)
            if spec:
                best = max(r["tokens_per_s"] for r in spec.values())
                drafts.append((best / bare["tokens_per_s"], model))
        if not loop:
            continue
        gain, model = max(drafts)
        lines.append(
            f"**At {setting}** recurnmt's loop without drafts decodes {min(loop):.2f}-"
            f"{max(loop):.2f}x as fast as fairseq's greedy search of the same model; with "
            f"drafts, the best model and setting (`{model}`) decodes {gain:.2f}x as fast as "
            "that loop."
        )
    return lines


def identical_table(results: dict) -> list[str]:
    lines = [
        "| model | R | identical to plain greedy | where not: the full model's two best logits "
        "apart by |",
        "| --- | --- | --- | --- |",
    ]
    for model, q in results["quality"].items():
        for r, same in q.get("identical", {}).items():
            gaps = ", ".join(f"{m:.1e}" for m in same.get("margins", []))
            lines.append(f"| {model} | {r} | {same['same']} of {same['of']} | {gaps} |")
    return lines


def beam_table(results: dict) -> list[str]:
    lines = [
        "| model | R | beam steps | steps the draft selects alike: in order | as sets | mean run "
        "of such steps: in order | as sets |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for model, by_r in results.get("beam", {}).items():
        for r, row in by_r.items():
            o, s = row["ordered"], row["as_sets"]
            lines.append(
                f"| {model} | {r} | {row['steps']} | {o['agreeing']:.2f} | {s['agreeing']:.2f} | "
                f"{o['mean_run']:.2f} | {s['mean_run']:.2f} |"
            )
    return lines


def main_model(results: dict) -> str | None:
    """The model whose draft decodes fastest at batch 1 against the same loop without drafts:
    its R x K grid is tabled and plotted."""
    rows = _rows(results, "batch 1")
    best = {}
    for model in results["models"]:
        spec, plain = _spec_runs(rows, model), _baseline(rows, model)
        if spec and plain:
            best[model] = max(r["tokens_per_s"] for r in spec.values()) / plain["tokens_per_s"]
    return max(best, key=best.get) if best else None


def measured_on(settings: dict[str, str]) -> str:
    """Where the figures were measured: the CPU with its threads, or the GPU in its dtype (a
    page written before ``--device`` existed: the CPU in float32)."""
    device, dtype = settings.get("device", "cpu"), settings.get("dtype", "fp32")
    if device == "cpu":
        return f"CPU, {settings['threads']} thread(s), {DTYPE_WORDS[dtype]}"
    return f"{device}, {DTYPE_WORDS[dtype]}, timings synchronised with the device"


DTYPE_WORDS = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def plot(results: dict, path: Path) -> bool:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    main = main_model(results)
    rows = _rows(results, "batch 1")
    plain = _baseline(rows, main)
    spec = _spec_runs(rows, main)
    if not spec or plain is None:
        return False
    device = results["settings"].get("device", "cpu").split(":")[0].upper()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for r in sorted({r for r, _ in spec}):
        ks = sorted(k for rr, k in spec if rr == r)
        left.plot(ks, [spec[r, k]["tokens_per_s"] / plain["tokens_per_s"] for k in ks], "o-",
                  label=f"R={r}")  # fmt: skip
        right.plot(ks, [spec[r, k]["accepted"] for k in ks], "o-", label=f"R={r}")
    left.axhline(1.0, color="grey", lw=0.8)
    left.set(xlabel="drafted tokens K", ylabel="tokens/s vs no draft",
             title=f"{main}, batch 1, {device}")  # fmt: skip
    right.set(xlabel="drafted tokens K", ylabel="drafts accepted per verification",
              title="acceptance")  # fmt: skip
    left.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def _costs_section(results: dict) -> list[str]:
    table = costs_table(results)
    if not table:
        return []
    levels = results["settings"]["levels"]
    return [
        "## Where the time goes at batch 1",
        "",
        "Each drafting model at its fastest batch-1 setting above, measured again beside the "
        "loop without drafts (the same sentences, the fastest of the rounds) with the loop's "
        "own clocks: a step without drafts (the embedding, every level at one position, the "
        "output layer and the choice), a draft pass (the embedding, the first R levels at "
        "one position, the output layer and the draft's choice; K + 1 of them per "
        "verification), a verification (the other levels over K + 1 positions, the output "
        "layer over them, the acceptance, the caches' truncation). `drafts free`: the speed "
        "with the draft passes' time taken out; the last column: what a draft pass could "
        f"cost at most for {TARGET}x the loop without drafts, the verifications and the rest "
        "as measured (`none`: not even free drafts would reach it).",
        "",
        *table,
        "",
        f"A draft pass runs R of the {levels} levels, yet costs more than R/{levels} of a "
        "step: the embedding, the output layer over the whole vocabulary and the choice are "
        "paid once per pass whatever R is, and at one position a level's time is mostly the "
        "host's work for its operations, not its arithmetic.",
        "",
    ]


def write_report(doc: Path, results: dict[str, Any]) -> None:
    settings = results["settings"]
    batch = f"batch {settings['batch']}"
    counts = [v["of"] for q in results["quality"].values() for v in q.get("identical", {}).values()]
    sentences = f"{counts[0]:,}" if counts else "all"
    main = main_model(results)
    figure = doc.with_suffix(".png")
    lines = [
        "# Self-speculative decoding",
        "",
        *USAGE,
        "",
        "## Measured",
        "",
        "Written by `python scripts/speculative.py measure` from the models "
        f"`python scripts/speculative.py train` trained (H={settings['embed_dim']}, "
        f"FF={settings['ffn_dim']}, {settings['heads']} heads, {settings['levels']} levels on "
        f"each side unless said, pre-LN, the demo's recipe: {settings['max_update']} updates on "
        "the embedded corpus). "
        f"{measured_on(settings)}; speed on {settings['sentences']} test "
        "sentences spread over its lengths, each configuration once a round, the fastest of "
        f"{settings['rounds']} rounds. tokens/s counts generated tokens, eos included.",
        "",
        "Models:",
        "",
        *[f"- `{name}`: {title}" for name, title in results["models"].items()],
        "",
        *headline(results),
        "",
        *[line for item in loop_line(results) for line in (item, "")],
        "## Speed at batch 1 (sentence by sentence)",
        "",
        *speed_table(results, "batch 1"),
        "",
        f"## Speed in batches of {settings['batch']}",
        "",
        *speed_table(results, batch),
        "",
        f"## `{main}`: every draft depth R and length K at batch 1",
        "",
        "tokens/s against the same loop without drafts (drafts accepted per verification):",
        "",
        *grid_table(results, main),
        "",
        f"![speed and acceptance against K]({figure.name})" if plot(results, figure) else "",
        "",
        *_costs_section(results),
        "## What training for drafts costs and buys",
        "",
        f"sacreBLEU on the {sentences} test sentences: every model at full depth (beam 4, length "
        "penalty 1.5; greedy), and its draft alone (greedy with its first R levels):",
        "",
        *quality_table(results),
        "",
        "## Identical outputs",
        "",
        "Speculative greedy decoding (K = 4) against plain greedy decoding, all "
        f"{sentences} test sentences in batches of 64, float32. Where the two part, the last "
        "column gives the gap between the full model's two best logits there (a full forward "
        "pass at batch 1 over the common prefix): a gap at float32 rounding is a tie that the "
        "order of the sums decides, not a draft the rule accepted wrongly.",
        "",
        *identical_table(results),
        "",
        "## Beam search",
        "",
        "Exact beam speculation would accept drafted steps while the draft's beam selection "
        "(the hypotheses that end and the 4 that go on, their tokens and beams, in order) "
        "equals the full model's. "
        "How often it does, from the same hypotheses at every step of the full model's beam "
        "search:",
        "",
        *beam_table(results),
        "",
    ]
    doc.write_text("\n".join(lines), encoding="utf-8")
