"""Score ``fairseq-generate`` output: detokenized sacrebleu with its signature, and tokenized BLEU.

fairseq-generate prints hypotheses out of order, as ``D-<id>\\t<score>\\t<text>`` lines (the
detokenized text when ``--post-process`` is given), ``H-`` lines with the tokenized text and
``T-<id>\\t<text>`` lines with the reference. This module collects them in corpus order and
scores them two ways:

* **detokenized sacrebleu** (Post 2018), the comparable number: hypotheses are detokenized
  (Moses, as fairseq's ``--tokenizer moses`` does, for Moses-tokenized BPE data; sentencepiece
  output is already plain text) and scored against the raw references with sacrebleu, which
  prints its signature;
* **tokenized BLEU**, the number most NMT papers report: ``H`` against ``T`` lines, both
  Moses-tokenized with BPE removed, no further tokenization (fairseq-score / multi-bleu.perl);
  for WMT14 En-De with compound splitting: every ``a-b`` becomes ``a ##AT##-##AT## b`` in both,
  as fairseq's ``scripts/compound_split_bleu.sh`` does (the convention of Vaswani et al. 2017).

The standard generation settings per dataset live in :data:`PRESETS` (IWSLT14: beam 5,
length penalty 1; WMT14: beam 4, length penalty 0.6, Vaswani et al. 2017 sec. 6.1), and
:func:`evaluation_steps` builds the three commands of an evaluation: average the last
checkpoints, ``fairseq-generate``, score. ``scripts/evaluate_nmt.py`` runs them.

Command line (the scoring step)::

    fairseq-generate DATA --path ckpt.pt --post-process sentencepiece ... > gen.out
    python -m recurnmt.nmt.evaluate gen.out --reference DATA/test.raw.en --hyp-out hyp.txt
    # Moses-tokenized BPE data (WMT14): detokenize, plus compound-split tokenized BLEU
    python -m recurnmt.nmt.evaluate gen.out --reference DATA/test.raw.de --detokenize moses \\
        --target-lang de --tokenized-bleu --compound-split --json-out result.json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sacrebleu

_LINE = re.compile(r"^(?P<kind>[HD])-(?P<id>\d+)\t(?P<score>[^\t]*)\t(?P<text>.*)$")
_TARGET = re.compile(r"^T-(?P<id>\d+)\t(?P<text>.*)$")
# fairseq's scripts/compound_split_bleu.sh: perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g'
_COMPOUND = re.compile(r"(\S)-(\S)")


def _in_order(found: dict[int, str], what: str) -> list[str]:
    if not found:
        raise ValueError(f"no {what} in the fairseq-generate output")
    missing = sorted(set(range(max(found) + 1)) - set(found))
    if missing:
        raise ValueError(f"fairseq-generate output lacks sentence id {missing[0]} (truncated?)")
    return [found[i] for i in range(len(found))]


def read_hypotheses(lines: Iterable[str], kind: str = "D") -> list[str]:
    """Hypotheses in corpus order from fairseq-generate output.

    Args:
        lines: the output lines.
        kind: ``D`` (detokenized) or ``H`` (tokenized) lines.

    Raises:
        ValueError: the output holds no such lines, or sentence ids are missing (a truncated
            run), naming the first missing id.
    """
    found: dict[int, str] = {}
    for line in lines:
        m = _LINE.match(line.rstrip("\n"))
        if m and m["kind"] == kind:
            found.setdefault(int(m["id"]), m["text"])  # first = best hypothesis of a beam
    return _in_order(found, f"{kind}-lines")


def read_targets(lines: Iterable[str]) -> list[str]:
    """The ``T-`` (reference) lines of fairseq-generate output, in corpus order.

    Raises:
        ValueError: as :func:`read_hypotheses`.
    """
    found: dict[int, str] = {}
    for line in lines:
        m = _TARGET.match(line.rstrip("\n"))
        if m:
            found.setdefault(int(m["id"]), m["text"])
    return _in_order(found, "T-lines")


def corpus_bleu(
    hypotheses: list[str], references: list[str], tokenize: str = "13a", lowercase: bool = False
):
    """sacrebleu corpus BLEU of aligned hypotheses and references.

    Returns:
        ``(BLEUScore, signature)``.

    Raises:
        ValueError: the two lists differ in length.
    """
    if len(hypotheses) != len(references):
        raise ValueError(
            f"{len(hypotheses)} hypotheses but {len(references)} references: "
            "did fairseq-generate translate the whole test set?"
        )
    metric = sacrebleu.metrics.BLEU(tokenize=tokenize, lowercase=lowercase)
    return metric.corpus_score(hypotheses, [references]), metric.get_signature()


def compound_split(line: str) -> str:
    """``a-b`` -> ``a ##AT##-##AT## b``, exactly as fairseq's ``compound_split_bleu.sh``.

    Non-overlapping, left to right, like Perl's ``s///g``: ``a-b-c`` becomes
    ``a ##AT##-##AT## b-c``.
    """
    return _COMPOUND.sub(r"\1 ##AT##-##AT## \2", line)


def tokenized_bleu(hypotheses: list[str], references: list[str], split_compounds: bool = False):
    """BLEU of already tokenized text, as ``fairseq-score`` / ``multi-bleu.perl`` compute it.

    Whitespace tokens, case-sensitive, no smoothing (a zero n-gram precision gives 0).

    Args:
        hypotheses: tokenized hypotheses (``H`` lines, BPE removed).
        references: tokenized references (``T`` lines).
        split_compounds: apply :func:`compound_split` to both first (WMT14 En-De).

    Returns:
        sacrebleu's ``BLEUScore``.
    """
    if split_compounds:
        hypotheses = [compound_split(h) for h in hypotheses]
        references = [compound_split(r) for r in references]
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    metric = sacrebleu.metrics.BLEU(tokenize="none", smooth_method="none", force=True)
    return metric.corpus_score(hypotheses, [references])


def detokenize(lines: Sequence[str], lang: str) -> list[str]:
    """Moses detokenization (as fairseq's ``--tokenizer moses`` decodes output)."""
    from sacremoses import MosesDetokenizer

    detok = MosesDetokenizer(lang=lang)
    return [detok.detokenize(line.split()) for line in lines]


def score(
    generate_lines: Sequence[str],
    references: Sequence[str],
    *,
    kind: str = "D",
    detok: str = "none",
    target_lang: str | None = None,
    tokenize: str = "13a",
    lowercase: bool = False,
    with_tokenized: bool = False,
    split_compounds: bool = False,
) -> tuple[dict[str, Any], list[str]]:
    """Every score of one fairseq-generate output.

    Args:
        generate_lines: the fairseq-generate output.
        references: raw (untokenized) references, one per sentence.
        kind: which hypothesis lines sacrebleu scores (``D`` or ``H``).
        detok: ``moses`` to detokenize them first (Moses-tokenized data) or ``none``.
        target_lang: the Moses detokenizer's language.
        tokenize: sacrebleu's tokenizer.
        lowercase: case-insensitive sacrebleu (for lowercased data such as IWSLT14).
        with_tokenized: also compute tokenized BLEU of ``H`` against ``T`` lines.
        split_compounds: with compound splitting (WMT14 En-De).

    Returns:
        ``(result, detokenized hypotheses)``; ``result`` holds ``n_sentences``,
        ``sacrebleu`` (score, signature, text) and ``tokenized_bleu`` (or ``None``).
    """
    hyps = read_hypotheses(generate_lines, kind)
    if detok == "moses":
        if not target_lang:
            raise ValueError("Moses detokenization needs the target language")
        hyps = detokenize(hyps, target_lang)
    elif detok != "none":
        raise ValueError(f"detok={detok!r}: choose moses or none")
    bleu, signature = corpus_bleu(hyps, list(references), tokenize, lowercase)
    result: dict[str, Any] = {
        "n_sentences": len(hyps),
        "sacrebleu": {
            "score": round(bleu.score, 2),
            "signature": str(signature),
            "text": str(bleu),
            "detokenizer": detok,
        },
        "tokenized_bleu": None,
    }
    if with_tokenized:
        tok = tokenized_bleu(
            read_hypotheses(generate_lines, "H"), read_targets(generate_lines), split_compounds
        )
        result["tokenized_bleu"] = {
            "score": round(tok.score, 2),
            "compound_split": split_compounds,
            "text": str(tok),
        }
    return result, hyps


def model_report(checkpoint: str | Path, data: str | Path) -> dict[str, Any]:
    """Architecture and parameter counts (RingFormer P*) of a checkpoint's model.

    Returns:
        ``{"arch": name, "params": {"total", "embeddings", "output_projection", "p_star"}}``.
    """
    from dataclasses import asdict

    from fairseq import checkpoint_utils

    import recurnmt.nmt  # noqa: F401  (registers the architectures)
    from recurnmt.analysis.params import count_parameters

    models, cfg = checkpoint_utils.load_model_ensemble([str(checkpoint)], {"data": str(data)})
    arch = getattr(cfg.model, "arch", None) or getattr(cfg.model, "_name", None)
    return {"arch": arch, "params": asdict(count_parameters(models[0]))}


# --- the standard evaluation of each dataset ---------------------------------------------------


@dataclass(frozen=True)
class DatasetPreset:
    """How a dataset is prepared, decoded and scored.

    Attributes:
        name: the key (``iwslt14``, ``wmt14``, ``lohelp``).
        title: for tables.
        data: default data directory (``data_prep``'s default ``--out``).
        source_lang: source language.
        target_lang: target language.
        prepare: the command that writes ``{data}``.
        beam: beam size.
        lenpen: length penalty.
        lowercase: the data is lowercased, so sacrebleu compares case-insensitively.
        compound_split: tokenized BLEU with compound splitting.
        segmentation: ``bpe`` (Moses + subword-nmt) or ``spm``, when the data directory does
            not say (its ``spm.model`` / ``bpe.codes``).
    """

    name: str
    title: str
    data: str
    source_lang: str
    target_lang: str
    prepare: str
    beam: int
    lenpen: float
    lowercase: bool = False
    compound_split: bool = False
    segmentation: str = "bpe"


PRESETS: dict[str, DatasetPreset] = {
    # fairseq examples/translation (IWSLT14 transformer): beam 5, --remove-bpe; lowercased data
    "iwslt14": DatasetPreset(
        "iwslt14",
        "IWSLT14 De-En",
        "data-bin/iwslt14_de_en",
        "de",
        "en",
        "python -m data_prep.iwslt14 --out {data}",
        beam=5,
        lenpen=1.0,
        lowercase=True,
    ),
    # Vaswani et al. 2017 sec. 6.1 / fairseq scaling NMT: beam 4, lenpen 0.6, compound split
    "wmt14": DatasetPreset(
        "wmt14",
        "WMT14 En-De",
        "data-bin/wmt14_en_de",
        "en",
        "de",
        "python -m data_prep.wmt14 --out {data}",
        beam=4,
        lenpen=0.6,
        compound_split=True,
    ),
    # RingFormer Table 1 direction (sec. 4.1): German to English, same test set and decoding
    "wmt14_de_en": DatasetPreset(
        "wmt14_de_en",
        "WMT14 De-En",
        "data-bin/wmt14_de_en",
        "de",
        "en",
        "python -m data_prep.wmt14 --src de --tgt en --out {data}",
        beam=4,
        lenpen=0.6,
    ),
    "lohelp": DatasetPreset(
        "lohelp",
        "LibreOffice help De-En",
        "data-bin/lohelp_de_en",
        "de",
        "en",
        "python -m data_prep.embedded prepare --out {data}",
        beam=5,
        lenpen=1.0,
        segmentation="spm",
    ),
}


def segmentation_of(data: str | Path, default: str = "bpe") -> str:
    """``spm`` or ``bpe``: what ``data_prep`` segmented ``data`` with (``default`` if unknown)."""
    data = Path(data)
    if (data / "spm.model").is_file():
        return "spm"
    if (data / "bpe.codes").is_file():
        return "bpe"
    return default


@dataclass(frozen=True)
class EvalSettings:
    """The ``evaluate:`` section of a recipe.

    Attributes:
        average_last: average the last N checkpoints (Vaswani et al. 2017: 5 for base
            models); 0 or 1 evaluates ``checkpoint`` instead.
        average_by: ``update`` (``checkpoint_E_U.pt``) or ``epoch`` (``checkpointE.pt``).
        checkpoint: without averaging: ``last``, ``best`` or a path.
        subset: the split to translate.
        sacrebleu_tokenize: sacrebleu's tokenizer.
        lowercase: case-insensitive sacrebleu; ``None``: the dataset's preset.
        tokenized_bleu: also report tokenized BLEU; ``None``: for Moses-tokenized (BPE) data.
        compound_split: with compound splitting; ``None``: the dataset's preset.
    """

    average_last: int = 5
    average_by: str = "update"
    checkpoint: str = "last"
    subset: str = "test"
    sacrebleu_tokenize: str = "13a"
    lowercase: bool | None = None
    tokenized_bleu: bool | None = None
    compound_split: bool | None = None


def checkpoint_to_evaluate(save_dir: Path, settings: EvalSettings) -> Path:
    """The checkpoint the evaluation translates with (the average, when averaging)."""
    if settings.average_last > 1:
        return save_dir / f"checkpoint_avg{settings.average_last}.pt"
    if settings.checkpoint in ("last", "best"):
        return save_dir / f"checkpoint_{settings.checkpoint}.pt"
    return Path(settings.checkpoint)


def evaluation_steps(
    preset: DatasetPreset,
    data: Path,
    save_dir: Path,
    run_dir: Path,
    settings: EvalSettings,
    generate_options: Mapping[str, Any] | None = None,
    meta: Mapping[str, Any] | None = None,
) -> list:
    """The commands of one evaluation: average, ``fairseq-generate``, score.

    Args:
        preset: the dataset's standard settings.
        data: the binarized data directory.
        save_dir: the training run's ``--save-dir``.
        run_dir: where the generation output and ``result.json`` go.
        settings: averaging and scoring options.
        generate_options: fairseq-generate options over the preset's (``beam``, ...);
            a ``None`` value removes the flag.
        meta: extra fields of ``result.json`` (``name``, ``arch``, ...).

    Returns:
        :class:`recurnmt.nmt.steps.Step` objects, in order.
    """
    from recurnmt.nmt.steps import Step, fairseq_flags, fairseq_tool, user_dir

    segmentation = segmentation_of(data, preset.segmentation)
    steps = []
    checkpoint = checkpoint_to_evaluate(save_dir, settings)
    if settings.average_last > 1:
        steps.append(
            Step(
                (
                    sys.executable,
                    "-m",
                    "recurnmt.nmt.averaging",
                    "--dir",
                    str(save_dir),
                    "--last",
                    str(settings.average_last),
                    "--by",
                    settings.average_by,
                    "--output",
                    str(checkpoint),
                )
            )
        )
    options: dict[str, Any] = {
        "user_dir": str(user_dir()),
        "path": str(checkpoint),
        "gen_subset": settings.subset,
        "source_lang": preset.source_lang,
        "target_lang": preset.target_lang,
        "beam": preset.beam,
        "lenpen": preset.lenpen,
        "batch_size": 128,
        # fairseq (main, fairseq-fixed) drops a last batch whose size is not a multiple of
        # this (default 8): 3 of newstest2014's 3,003 sentences would go untranslated
        "required_batch_size_multiple": 1,
        "post_process": "sentencepiece" if segmentation == "spm" else "subword_nmt",
    }
    options.update(generate_options or {})
    gen_out = run_dir / f"generate-{settings.subset}.txt"
    steps.append(Step((*fairseq_tool("generate"), str(data), *fairseq_flags(options)), gen_out))

    moses = segmentation == "bpe"
    tokenized = moses if settings.tokenized_bleu is None else settings.tokenized_bleu
    compound = preset.compound_split if settings.compound_split is None else settings.compound_split
    lowercase = preset.lowercase if settings.lowercase is None else settings.lowercase
    target = options.get("target_lang") or preset.target_lang
    score_cmd = [
        sys.executable,
        "-m",
        "recurnmt.nmt.evaluate",
        str(gen_out),
        "--reference",
        str(data / f"{settings.subset}.raw.{target}"),
        "--tokenize",
        settings.sacrebleu_tokenize,
        "--hyp-out",
        str(run_dir / f"{settings.subset}.hyp.{target}"),
        "--json-out",
        str(run_dir / "result.json"),
        "--checkpoint",
        str(checkpoint),
        "--data",
        str(data),
    ]
    if moses:
        score_cmd += ["--detokenize", "moses", "--target-lang", target]
    if lowercase:
        score_cmd.append("--lowercase")
    if tokenized:
        score_cmd.append("--tokenized-bleu")
        if compound:
            score_cmd.append("--compound-split")
    fields = {"dataset": preset.name, "subset": settings.subset, **(meta or {})}
    fields.update(beam=options.get("beam"), lenpen=options.get("lenpen"))
    for key, value in fields.items():
        score_cmd += ["--meta", f"{key}={value}"]
    steps.append(Step(tuple(score_cmd)))
    return steps


# --- command line ------------------------------------------------------------------------------


def _meta(items: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--meta {item!r}: expected KEY=VALUE")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m recurnmt.nmt.evaluate", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("generate_output", type=Path, help="fairseq-generate stdout ('-': stdin)")
    parser.add_argument("--reference", type=Path, required=True, help="raw reference text")
    parser.add_argument("--hyp-out", type=Path, help="write the ordered hypotheses here")
    parser.add_argument("--kind", choices=("D", "H"), default="D")
    parser.add_argument("--tokenize", default="13a", help="sacrebleu tokenizer")
    parser.add_argument("--lowercase", action="store_true", help="case-insensitive sacrebleu")
    parser.add_argument(
        "--detokenize", choices=("none", "moses"), default="none", help="before sacrebleu"
    )
    parser.add_argument("--target-lang", help="language of the Moses detokenizer")
    parser.add_argument(
        "--tokenized-bleu", action="store_true", help="also BLEU of H- against T-lines"
    )
    parser.add_argument(
        "--compound-split", action="store_true", help="tokenized BLEU with ##AT## splitting"
    )
    parser.add_argument("--json", action="store_true", help="print a JSON line")
    parser.add_argument("--json-out", type=Path, help="write every score to this JSON file")
    parser.add_argument("--meta", action="append", default=[], help="KEY=VALUE for the JSON")
    parser.add_argument("--checkpoint", type=Path, help="count this checkpoint's parameters")
    parser.add_argument("--data", type=Path, help="its data directory (with --checkpoint)")
    args = parser.parse_args(argv)
    if args.compound_split and not args.tokenized_bleu:
        parser.error("--compound-split applies to --tokenized-bleu")
    if bool(args.checkpoint) != bool(args.data):
        parser.error("--checkpoint and --data go together")

    try:
        if str(args.generate_output) == "-":
            lines = sys.stdin.read().splitlines()
        else:
            lines = args.generate_output.read_text(encoding="utf-8").splitlines()
        refs = args.reference.read_text(encoding="utf-8").splitlines()
        result, hyps = score(
            lines,
            refs,
            kind=args.kind,
            detok=args.detokenize,
            target_lang=args.target_lang,
            tokenize=args.tokenize,
            lowercase=args.lowercase,
            with_tokenized=args.tokenized_bleu,
            split_compounds=args.compound_split,
        )
        result = {**_meta(args.meta), **result}
    except (ValueError, OSError) as e:
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return 1
    if args.hyp_out:
        args.hyp_out.write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
    if args.checkpoint:
        report = model_report(args.checkpoint, args.data)
        result["checkpoint"] = str(args.checkpoint)
        result.setdefault("arch", report["arch"])
        result["params"] = report["params"]
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    if args.json:
        sacre = result["sacrebleu"]
        print(json.dumps({"bleu": sacre["score"], "signature": sacre["signature"], **result}))
    else:
        print(result["sacrebleu"]["text"])
        print(f"signature: {result['sacrebleu']['signature']}")
        if result["tokenized_bleu"]:
            name = "compound-split " if args.compound_split else ""
            print(f"tokenized {name}BLEU: {result['tokenized_bleu']['text']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
