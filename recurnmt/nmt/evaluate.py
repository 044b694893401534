"""Score ``fairseq-generate`` output with sacrebleu, printing the signature.

fairseq-generate prints hypotheses out of order, as ``D-<id>\\t<score>\\t<text>`` lines (the
detokenized text when ``--post-process`` is given). This module collects them in corpus order,
writes them to a file and scores them against the raw references with sacrebleu, so the
score is the standard detokenized BLEU and comes with its signature.

Command line::

    fairseq-generate DATA --path ckpt.pt --post-process sentencepiece ... > gen.out
    python -m recurnmt.nmt.evaluate gen.out --reference DATA/test.raw.en --hyp-out hyp.txt
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterable
from pathlib import Path

import sacrebleu

_LINE = re.compile(r"^(?P<kind>[HD])-(?P<id>\d+)\t(?P<score>[^\t]*)\t(?P<text>.*)$")


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
    if not found:
        raise ValueError(f"no {kind}-lines in the fairseq-generate output")
    missing = sorted(set(range(max(found) + 1)) - set(found))
    if missing:
        raise ValueError(f"fairseq-generate output lacks sentence id {missing[0]} (truncated?)")
    return [found[i] for i in range(len(found))]


def corpus_bleu(hypotheses: list[str], references: list[str], tokenize: str = "13a"):
    """sacrebleu corpus BLEU of aligned hypotheses and references.

    Raises:
        ValueError: the two lists differ in length.
    """
    if len(hypotheses) != len(references):
        raise ValueError(
            f"{len(hypotheses)} hypotheses but {len(references)} references: "
            "did fairseq-generate translate the whole test set?"
        )
    metric = sacrebleu.metrics.BLEU(tokenize=tokenize)
    return metric.corpus_score(hypotheses, [references]), metric.get_signature()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("generate_output", type=Path, help="fairseq-generate stdout ('-': stdin)")
    parser.add_argument("--reference", type=Path, required=True, help="raw reference text")
    parser.add_argument("--hyp-out", type=Path, help="write the ordered hypotheses here")
    parser.add_argument("--kind", choices=("D", "H"), default="D")
    parser.add_argument("--tokenize", default="13a", help="sacrebleu tokenizer")
    parser.add_argument("--json", action="store_true", help="print a JSON line")
    args = parser.parse_args(argv)

    if str(args.generate_output) == "-":
        lines = sys.stdin.readlines()
    else:
        lines = args.generate_output.read_text(encoding="utf-8").splitlines()
    hyps = read_hypotheses(lines, args.kind)
    refs = args.reference.read_text(encoding="utf-8").splitlines()
    if args.hyp_out:
        args.hyp_out.write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
    bleu, signature = corpus_bleu(hyps, refs, args.tokenize)
    if args.json:
        print(json.dumps({"bleu": round(bleu.score, 2), "signature": str(signature)}))
    else:
        print(f"{bleu}")
        print(f"signature: {signature}")


if __name__ == "__main__":
    main()
