"""A results table across architectures from the ``result.json`` files of the evaluations.

Each evaluation (``recurnmt-run-nmt-recipe run ...`` or ``recurnmt-evaluate-nmt``)
writes ``result.json``: the sacrebleu score and signature, the tokenized BLEU, the parameter
counts and what was evaluated. This module gathers them into one markdown table (rows:
architecture families; column groups: dataset and model size; in each group detokenized
sacreBLEU, tokenized BLEU and RingFormer's P*) and a PNG bar chart of the sacreBLEU scores.

Command line (``recurnmt-results-nmt``, also ``python -m recurnmt.experiments.results``)::

    recurnmt-results-nmt runs/ --markdown runs/results.md --png runs/results.png
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from recurnmt.cli import entry_point
from recurnmt.experiments.presets import PRESETS
from recurnmt.modules.families import FAMILIES

PROG = "recurnmt-results-nmt"  # also python -m recurnmt.experiments.results

REFERENCE = "transformer"  # fairseq's own transformer: the baseline of every comparison
REFERENCE_TITLE = "fairseq's transformer"


def family_order() -> tuple[str, ...]:
    """The architecture families in the order of tables and benchmarks: fairseq's transformer,
    then recurnmt's, as :data:`recurnmt.modules.FAMILIES` orders them."""
    return (REFERENCE, *FAMILIES)


def family_title(name: str) -> str:
    """A family's name in tables and plots (its :class:`~recurnmt.modules.Family` title)."""
    if name == REFERENCE:
        return REFERENCE_TITLE
    family = FAMILIES.get(name)
    return family.title if family is not None and family.title else name


# size suffixes of fairseq's and recurnmt's architecture names, longest first
SIZE_SUFFIXES = ("vaswani_wmt_en_de_big", "wmt_en_de_big", "wmt_en_de", "iwslt_de_en", "tiny")
DATASET_TITLES = {name: preset.title for name, preset in PRESETS.items()}


def split_arch(arch: str) -> tuple[str, str]:
    """``ringformer_wmt_en_de_big`` -> ``("ringformer", "wmt_en_de_big")``.

    A name without a size suffix is the family at its default size (``base``).
    """
    for suffix in SIZE_SUFFIXES:
        if arch.endswith("_" + suffix):
            return arch[: -len(suffix) - 1], suffix
    return arch, "base"


def find_results(paths: Iterable[str | Path]) -> list[Path]:
    """``result.json`` files: given directly, or found under given directories."""
    found: list[Path] = []
    for p in map(Path, paths):
        found += sorted(p.rglob("result.json")) if p.is_dir() else [p]
    return found


def load_results(paths: Iterable[str | Path]) -> list[dict[str, Any]]:
    """The evaluation results of :func:`find_results`, each with ``family`` and ``size``.

    Raises:
        ValueError: a file is not an evaluation result (names the file).
    """
    results = []
    for path in find_results(paths):
        try:
            record = json.loads(Path(path).read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not JSON: {e}") from e
        if "sacrebleu" not in record or "arch" not in record:
            raise ValueError(f"{path} is not a recurnmt evaluation result (no sacrebleu/arch)")
        family, size = split_arch(record["arch"])
        record.setdefault("family", family)
        record.setdefault("size", size)
        record["_path"] = str(path)
        results.append(record)
    return results


def _group(record: dict[str, Any]) -> tuple[str, str]:
    return record.get("dataset", "?"), record["size"]


def _group_title(group: tuple[str, str]) -> str:
    dataset, size = group
    return f"{DATASET_TITLES.get(dataset, dataset)} ({size})"


def _families(results: Sequence[dict[str, Any]]) -> list[str]:
    present = {r["family"] for r in results}
    ordered = [f for f in family_order() if f in present]
    return ordered + sorted(present - set(ordered))


def _groups(results: Sequence[dict[str, Any]]) -> list[tuple[str, str]]:
    return sorted({_group(r) for r in results})


def _index(results: Sequence[dict[str, Any]]) -> dict[tuple[str, tuple[str, str]], dict]:
    index: dict[tuple[str, tuple[str, str]], dict] = {}
    for r in results:
        key = (r["family"], _group(r))
        if key in index:
            raise ValueError(
                f"two results for {r['family']} on {_group_title(key[1])}: "
                f"{index[key]['_path']} and {r['_path']}"
            )
        index[key] = r
    return index


def _fmt(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def markdown_table(results: Sequence[dict[str, Any]]) -> str:
    """The results as a markdown table with the sacrebleu signatures below it."""
    groups, families, index = _groups(results), _families(results), _index(results)
    header = ["model"]
    for g in groups:
        title = _group_title(g)
        header += [f"{title} sacreBLEU", "tok. BLEU", "P* (M)"]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for family in families:
        row = [family]
        for g in groups:
            r = index.get((family, g))
            if r is None:
                row += ["", "", ""]
                continue
            tok = r.get("tokenized_bleu") or {}
            mark = "ᶜ" if tok.get("compound_split") else ""
            params = r.get("params") or {}
            p_star = params.get("p_star")
            row += [
                _fmt(r["sacrebleu"]["score"]),
                _fmt(tok.get("score")) + mark if tok else "–",
                _fmt(p_star / 1e6) if p_star is not None else "–",
            ]
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    lines.append(
        "sacreBLEU: detokenized, against the raw references. tok. BLEU: Moses-tokenized "
        "hypotheses against tokenized references (fairseq-score); ᶜ with compound splitting. "
        "P*: parameters without embeddings and output projection (RingFormer Table 1)."
    )
    for g in groups:
        signatures = sorted({r["sacrebleu"]["signature"] for r in results if _group(r) == g})
        note = "" if len(signatures) == 1 else " (differing signatures: not comparable)"
        lines.append(f"- {_group_title(g)}{note}: " + "; ".join(f"`{s}`" for s in signatures))
    return "\n".join(lines) + "\n"


def bar_chart(results: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """A grouped bar chart of sacreBLEU per architecture family and dataset, as PNG."""
    from matplotlib.figure import Figure  # no pyplot: no global backend state

    groups, families, index = _groups(results), _families(results), _index(results)
    fig = Figure(figsize=(max(6.0, 1.3 * len(families) * max(1, len(groups)) / 2 + 2), 4.2))
    ax = fig.add_subplot()
    width = 0.8 / max(1, len(groups))
    for j, g in enumerate(groups):
        xs, heights = [], []
        for i, family in enumerate(families):
            r = index.get((family, g))
            if r is not None:
                xs.append(i - 0.4 + width * (j + 0.5))
                heights.append(r["sacrebleu"]["score"])
        bars = ax.bar(xs, heights, width, label=_group_title(g))
        ax.bar_label(bars, fmt="%.1f", fontsize=7)
    ax.set_xticks(range(len(families)), families, rotation=20, ha="right")
    ax.set_ylabel("sacreBLEU (detokenized)")
    ax.set_title("Translation quality by architecture")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path


def main(argv: list[str] | None = None) -> int:
    """Writes the table (and chart) of the results under ``paths``.

    Raises:
        OSError: a given path does not exist.
        ValueError: no results, a file that is not a result (names it), two results for one
            cell of the table.
    """
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Results table (markdown) and bar chart (PNG) of NMT evaluations.",
    )
    parser.add_argument("paths", nargs="+", help="result.json files or directories holding them")
    parser.add_argument("--markdown", type=Path, help="write the table here (default: stdout)")
    parser.add_argument("--png", type=Path, help="write the bar chart here")
    args = parser.parse_args(argv)
    results = load_results(args.paths)
    if not results:
        raise ValueError(f"no result.json under {' '.join(args.paths)}")
    table = markdown_table(results)
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(table, encoding="utf-8")
        print(f"wrote {args.markdown}")
    else:
        print(table, end="")
    if args.png:
        print(f"wrote {bar_chart(results, args.png)}")
    return 0


cli = entry_point(main, PROG)  # the console script

if __name__ == "__main__":
    sys.exit(cli())
