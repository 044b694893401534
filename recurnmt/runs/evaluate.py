"""Score ``fairseq-generate`` output: detokenized sacrebleu with its signature, and tokenized BLEU.

The scoring step of an evaluation, as a command: the scores of :mod:`recurnmt.runs.scoring`
(detokenized sacrebleu with its signature; tokenized BLEU of ``H`` against ``T`` lines, with
compound splitting for WMT14 En-De), the ordered hypotheses, and with ``--checkpoint`` the
model's parameter counts (RingFormer P*), written to ``result.json`` for
:mod:`recurnmt.runs.results`. The commands of a whole evaluation (average, generate, this
command) are built by :mod:`recurnmt.runs.evaluation`; the datasets' standard settings are in
:mod:`recurnmt.runs.presets`.

Command line (the scoring step)::

    fairseq-generate DATA --path ckpt.pt --post-process sentencepiece ... > gen.out
    python -m recurnmt.runs.evaluate gen.out --reference DATA/test.raw.en --hyp-out hyp.txt
    # Moses-tokenized BPE data (WMT14): detokenize, plus compound-split tokenized BLEU
    python -m recurnmt.runs.evaluate gen.out --reference DATA/test.raw.de --detokenize moses \\
        --target-lang de --tokenized-bleu --compound-split --json-out result.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from recurnmt.cli import entry_point
from recurnmt.runs.scoring import score

PROG = "python -m recurnmt.runs.evaluate"


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
