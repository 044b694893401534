"""``recurnmt-params``: parameter counts (RingFormer P*) of fairseq architectures.

Builds each architecture as ``fairseq-train --arch ARCH`` would, on a toy vocabulary, and
prints its counts from :func:`recurnmt.parameters.parameter_report`.

Command line::

    recurnmt-params ringformer_wmt_en_de ringformer_wmt_en_de_big
    recurnmt-params ringformer_tiny -- --level-signal-rank 8
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from recurnmt.cli import entry_point, split_extra_args
from recurnmt.parameters import parameter_report


def main(argv: list[str] | None = None) -> None:
    """``recurnmt-params ARCH [ARCH ...] [-- FLAGS]``: prints P* of architectures."""
    argv, extra = split_extra_args(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="recurnmt-params",
        description="Parameter counts (RingFormer P*) of fairseq architectures; "
        "flags after -- go to the model as on the fairseq-train command line.",
    )
    parser.add_argument("archs", nargs="+", help="registered architectures")
    parser.add_argument("--vocab", type=int, default=100, help="toy vocabulary size")
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    opts = parser.parse_args(argv)

    from recurnmt.nmt.build import build_model, toy_dictionary

    if not opts.json:
        print(
            f"{'architecture':<36} {'H/FF':>11} {'N':>3} {'P*':>12} {'embeddings':>12} {'total':>12}"
        )
    for arch in opts.archs:
        model, args, _ = build_model(arch, extra, toy_dictionary(opts.vocab))
        report = parameter_report(model)
        if opts.json:
            print(json.dumps({"arch": arch, **asdict(report)}))
            continue
        hff = f"{args.encoder_embed_dim}/{args.encoder_ffn_embed_dim}"
        print(
            f"{arch:<36} {hff:>11} {args.encoder_layers:>3} {report.p_star / 1e6:>11.2f}M "
            f"{report.embeddings / 1e6:>11.2f}M {report.total / 1e6:>11.2f}M"
        )


cli = entry_point(main, "recurnmt-params")  # the console script

if __name__ == "__main__":
    sys.exit(cli())
