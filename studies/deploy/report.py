"""docs/deploy.md and its plot, from the figures of :mod:`studies.deploy.measure`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from studies.deploy.measure import ENGINES, SETTINGS

USAGE = """\
A trained model leaves PyTorch for CTranslate2, the engine OpenNMT, Argos Translate and
LibreTranslate serve translation with, through `recurnmt-export-ct2`
(`recurnmt/nmt/ct2_export.py`). In evaluation RingFormer, relaxed recursion,
`recurrent_transformer` and Takase & Kiyono's sharing are standard Transformers level by level:
every level is written as a standard layer, its block's weights with RingFormer's low-rank
signals or the relaxed level's LoRA folded in and its own norms; levels that share identical
weights are stored once. fairseq's own `transformer` exports through CTranslate2's fairseq
functions. The Universal Transformer (positions and a timestep signal at every level), ACT
(halting) and SReT (its non-linear projection, residual coefficients and sliced attention) are
refused, naming the part; One Wide FFN's decoder, which has no FFN, gets a zero one (exact in
pre-LN, refused in post-LN).

```bash
python scripts/demo_nmt.py                # trains work/demo_nmt/checkpoints/checkpoint_last.pt; ends by exporting it
recurnmt-export-ct2 work/demo_nmt/checkpoints/checkpoint_last.pt work/demo_nmt/ct2 \\
    --data data-bin/lohelp_de_en_spm4000 --quantization int8 --force
```

```python
import ctranslate2, sentencepiece

spm = sentencepiece.SentencePieceProcessor(model_file="data-bin/lohelp_de_en_spm4000/spm.model")
translator = ctranslate2.Translator("work/demo_nmt/ct2")
pieces = translator.translate_batch(
    spm.encode(["Klicken Sie auf OK."], out_type=str), beam_size=4, length_penalty=1.5
)[0].hypotheses[0]
print("".join(pieces).replace("\\u2581", " ").strip())
```

`--quantization` is one of float32 (the default), int8, int8_float32, int8_float16, float16 and
bfloat16 (the GPU types need a GPU build of CTranslate2). The directory holds `model.bin`,
`config.json` and the two vocabularies; with the corpus's `spm.model` beside it, it is what an
Argos Translate package (`.argosmodel`: a zip of `model/` holding the CTranslate2 directory,
`sentencepiece.model` and a `metadata.json` naming the languages) carries, and what
LibreTranslate then serves. `ctranslate2` comes with `pip install 'recurnmt[deploy]'` (in the
environment `make setup` builds).""".splitlines()
REFERENCE = "transformer"


def _speed(results: dict, model: str, engine: str, setting: str, beam: int) -> float | None:
    row = results["models"].get(model, {}).get("speed", {}).get(f"{engine}, {setting}, beam {beam}")
    return None if row is None else row["tokens_per_s"]


def speed_table(results: dict) -> list[str]:
    heads = [f"{setting}, beam {beam}" for setting, _size, beam in SETTINGS]
    lines = [
        "| model | engine | " + " | ".join(heads) + " |",
        "| --- | --- | " + " | ".join("---" for _ in heads) + " |",
    ]
    for model in results["models"]:
        for engine in ENGINES:
            cells = []
            for setting, _size, beam in SETTINGS:
                mine = _speed(results, model, engine, setting, beam)
                ref = _speed(results, REFERENCE, "pytorch", setting, beam)
                own = _speed(results, model, "pytorch", setting, beam)
                if mine is None:
                    cells.append("")
                    continue
                parts = [f"{mine:,.0f}"]
                if ref:
                    parts.append(f"{mine / ref:.2f}x fs")
                if own and engine != "pytorch":
                    parts.append(f"{mine / own:.2f}x own")
                cells.append(" · ".join(parts))
            lines.append(f"| `{model}` | {engine} | " + " | ".join(cells) + " |")
    return lines


def quality_table(results: dict) -> list[str]:
    lines = [
        "| model | "
        + " | ".join(f"{e}, greedy | {e}, beam 4" for e in ENGINES)
        + " | greedy identical (ct2 float32) | parameters MiB | model.bin float32 | int8 |",
        "| --- |" + " --- |" * (2 * len(ENGINES) + 4),
    ]
    for model, row in results["models"].items():
        scores = [f"{row['bleu'].get(f'{e}, beam {b}', '')}" for e in ENGINES for b in (1, 4)]
        same, sizes = row["identical_greedy"], row["sizes"]
        lines.append(
            f"| `{model}` | " + " | ".join(scores) + f" | {same['same']:,} of {same['of']:,} | "
            f"{sizes['parameters_mib']} | {sizes['float32_mib']} | {sizes['int8_mib']} |"
        )
    return lines


def headline(results: dict) -> list[str]:
    out = ["**CTranslate2 int8 against the same model in recurnmt's PyTorch decoding:**", ""]
    for model in results["models"]:
        if model == REFERENCE:
            continue
        row = results["models"][model]
        ratios = []
        for setting, _size, beam in SETTINGS:
            int8 = _speed(results, model, "ct2 int8", setting, beam)
            own = _speed(results, model, "pytorch", setting, beam)
            if int8 and own:
                ratios.append(f"{int8 / own:.1f}x ({setting}, beam {beam})")
        bleu = row["bleu"]
        out.append(
            f"- `{model}`: CTranslate2 int8 decodes {', '.join(ratios)} as fast as recurnmt in "
            f"PyTorch; beam-4 sacreBLEU {bleu['ct2 int8, beam 4']} against "
            f"{bleu['pytorch, beam 4']}."
        )
    return out


def plot(results: dict, path: Path) -> bool:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(results["models"])
    if not models:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=False)
    for ax, (setting, beam) in zip(axes, (("batch 1", 1), ("batch 16", 4)), strict=True):
        width = 0.8 / len(ENGINES)
        for j, engine in enumerate(ENGINES):
            values = [_speed(results, m, engine, setting, beam) or 0 for m in models]
            ax.bar([i + j * width for i in range(len(models))], values, width, label=engine)
        ax.set_xticks([i + width for i in range(len(models))], models, rotation=15, fontsize=8)
        ax.set(ylabel="tokens/s", title=f"{setting}, beam {beam}, CPU")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def write_report(doc: Path, results: dict[str, Any]) -> None:
    settings = results["settings"]
    figure = doc.with_suffix(".png")
    titles = results.get("titles", {})
    lines = [
        "# Serving with CTranslate2",
        "",
        *USAGE,
        "",
        "## Measured",
        "",
        "Written by `python scripts/deploy_bench.py` from the models `python "
        "scripts/speculative.py train` trained (H=128, FF=512, 4 heads, pre-LN, the demo's "
        f"recipe on the embedded corpus). CPU, {settings['threads']} thread(s); speed on "
        f"{settings['sentences']} test sentences spread over its lengths, the fastest of "
        f"{settings['rounds']} rounds; tokens/s counts generated tokens, end of sentence "
        "included; `fs`: against fairseq's transformer decoded by fairseq's generator in the "
        "same setting, `own`: against the same model in PyTorch. CTranslate2 decodes the "
        "batches fairseq's generator decodes, with its length limit (1.5 x source + 10) and "
        "length penalty (1.5).",
        "",
        "Models:",
        "",
        *[f"- `{name}`: {titles.get(name, '')}" for name in results["models"]],
        "",
        *headline(results),
        "",
        "## Speed (tokens/s)",
        "",
        *speed_table(results),
        "",
        f"![tokens/s by engine]({figure.name})" if plot(results, figure) else "",
        "",
        "## Quality and size",
        "",
        "sacreBLEU on all 1,555 test sentences (length penalty 1.5 for beam 4); greedy outputs "
        "of CTranslate2 float32 identical token for token to fairseq's generator; the unique "
        "parameters in float32 and `model.bin` of each export (MiB):",
        "",
        *quality_table(results),
        "",
        "## What sharing saves on disk",
        "",
        "`model.bin` (float32) of a `recurrent_transformer` at this size (H=128, 6 levels a "
        "side, embeddings shared), one block a side against six; CTranslate2 stores a "
        "variable equal to another once, so levels that run one block cost it once (the "
        "sinusoidal position table is stored too, once):",
        "",
        "| model | unique parameters (MiB) | position table (MiB) | model.bin (MiB) | model.bin / "
        "parameters |",
        "| --- | --- | --- | --- | --- |",
        *[
            f"| {name} | {s['parameters_mib']} | {s['position_table_mib']} | "
            f"{s['model_bin_mib']} | {s['model_bin_mib'] / s['parameters_mib']:.2f} |"
            for name, s in results.get("storage", {}).items()
        ],
        "",
    ]
    doc.write_text("\n".join(lines), encoding="utf-8")
