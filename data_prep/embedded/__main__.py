"""``python -m data_prep.embedded {build,prepare}``: the embedded German-English corpus."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from data_prep.embedded import SHIPPED_DIR, data_dir
from recurnmt.cli import entry_point

PROG = "python -m data_prep.embedded"


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Parse the command line."""
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    build = sub.add_parser("build", help="rebuild the shipped corpus from the Debian packages")
    build.add_argument("--deb-dir", type=Path, help="use the .deb files in DIR (no download)")
    build.add_argument("--out", type=Path, default=SHIPPED_DIR, help="corpus dir to write")
    build.add_argument("--work-dir", type=Path, help="keep downloads/unpacked pages here")
    build.add_argument("--vocab-size", type=int, default=8000)
    build.add_argument("--valid-share", type=float, default=0.05, help="share of pages")
    build.add_argument("--test-share", type=float, default=0.05, help="share of pages")
    build.add_argument(
        "--allow-unpinned", action="store_true", help="accept .deb files with other sha256"
    )

    prep = sub.add_parser("prepare", help="binarize the shipped corpus for fairseq")
    prep.add_argument(
        "--out",
        type=Path,
        help="output directory (default: data-bin/lohelp_de_en, or "
        "data-bin/lohelp_de_en_spmN with --vocab-size N)",
    )
    prep.add_argument("--src", default="de", choices=["de", "en"])
    prep.add_argument("--tgt", default="en", choices=["de", "en"])
    prep.add_argument("--max-train", type=int, help="use only the first N training pairs")
    prep.add_argument("--workers", type=int, default=1, help="fairseq-preprocess workers")
    prep.add_argument("--force", action="store_true", help="rebuild and replace --out")
    prep.add_argument(
        "--vocab-size",
        type=int,
        help="learn a joint sentencepiece model of N pieces on the training split "
        "(default: the shipped 8,000-piece model)",
    )
    prep.add_argument("--corpus-dir", type=Path, default=SHIPPED_DIR, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Builds or prepares the corpus.

    Raises:
        PrepError: a step failed (names it); a partial output is removed.
    """
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.command == "build":
        from data_prep.embedded.build import BuildOptions, build, format_command

        build(
            BuildOptions(
                out=args.out,
                deb_dir=args.deb_dir,
                work_dir=args.work_dir,
                allow_unpinned=args.allow_unpinned,
                vocab_size=args.vocab_size,
                valid_share=args.valid_share,
                test_share=args.test_share,
                command=format_command(argv),
            )
        )
    else:
        from data_prep.embedded.prepare import prepare

        prepare(
            args.out or data_dir(args.vocab_size),
            src=args.src,
            tgt=args.tgt,
            max_train=args.max_train,
            workers=args.workers,
            force=args.force,
            corpus_dir=args.corpus_dir,
            vocab_size=args.vocab_size,
        )


cli = entry_point(main, PROG)

if __name__ == "__main__":
    sys.exit(cli())
