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

The scoring step of an evaluation, as a command (:func:`main`): these scores, the ordered
hypotheses, and with ``--checkpoint`` the model's parameter counts (RingFormer P*), written to
``result.json`` for :mod:`recurnmt.experiments.results`. The commands of a whole evaluation (average,
generate, this command) are built by :mod:`recurnmt.experiments.evaluation`.

Command line (the scoring step)::

    fairseq-generate DATA --path ckpt.pt --post-process sentencepiece ... > gen.out
    python -m recurnmt.experiments.scoring gen.out --reference DATA/test.raw.en --hyp-out hyp.txt
    # Moses-tokenized BPE data (WMT14): detokenize, plus compound-split tokenized BLEU
    python -m recurnmt.experiments.scoring gen.out --reference DATA/test.raw.de --detokenize moses \\
        --target-lang de --tokenized-bleu --compound-split --json-out result.json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import sacrebleu

from recurnmt.cli import entry_point

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


def paired_bootstrap(baseline: list[str], system: list[str], references: list[str]) -> float:
    """The p-value of sacreBLEU's paired bootstrap resampling (1,000 resamples, Koehn 2004) of
    ``system`` against ``baseline`` on the same ``references``: how likely the difference of
    their BLEU is by chance (below 0.05: a reliable difference)."""
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    test = PairedTest(
        [("baseline", baseline), ("system", system)],
        {"BLEU": BLEU(references=[references])},
        references=None,
        test_type="bs",
        n_samples=1000,
    )
    _, scores = test()
    return float(scores["BLEU"][1].p_value)


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


PROG = "python -m recurnmt.experiments.scoring"


def model_report(checkpoint: str | Path, data: str | Path) -> dict[str, Any]:
    """Architecture and parameter counts (RingFormer P*) of a checkpoint's model.

    Returns:
        ``{"arch": name, "params": {"total", "embeddings", "output_projection", "p_star"}}``.
    """
    from dataclasses import asdict

    from fairseq import checkpoint_utils

    import recurnmt.nmt  # noqa: F401  (registers the architectures)
    from recurnmt.parameters import parameter_report

    models, cfg = checkpoint_utils.load_model_ensemble([str(checkpoint)], {"data": str(data)})
    arch = getattr(cfg.model, "arch", None) or getattr(cfg.model, "_name", None)
    return {"arch": arch, "params": asdict(parameter_report(models[0]))}


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
    """Scores one fairseq-generate output.

    Raises:
        OSError: an input file is missing or unreadable.
        ValueError: the output and the references do not match, or a bad ``--meta``.
    """
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
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


cli = entry_point(main, PROG)

if __name__ == "__main__":
    sys.exit(cli())
