"""``python -m data_prep.iwslt14``: IWSLT14 German-English (TED talks) for fairseq.

Follows fairseq's ``examples/translation/prepare-iwslt14.sh``:

1. Training text: drop the TED metadata lines (``<url>``, ``<talkid>``, ``<keywords>``, ...)
   and the ``<title>``/``<description>`` markup; Moses-tokenize each language.
2. Keep pairs of 1-175 tokens a side with a length ratio of at most 1.5
   (``clean-corpus-n.perl -ratio 1.5 ... 1 175``); lowercase.
3. Valid is every 23rd of those pairs; train is the rest.
4. Test: the hub's evaluation sets (segments stripped, ``’`` -> ``'``), tokenized, lowercased.
5. Joint BPE with 10,000 merges (subword-nmt, as the recipe) learnt on train, applied to all;
   ``fairseq-preprocess --joined-dictionary``.

``--segmentation spm`` replaces steps 1's tokenization and 5 by a joint sentencepiece model on
untokenized (still lowercased) text. Source: ``may-ohta/iwslt14`` on the hub, raw text
(171,721 training pairs, the input of the recipe's cleaning).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

from data_prep.cleaning import PairFilter
from data_prep.errors import PrepError
from data_prep.hub import HubSource, iter_pairs, load_splits
from data_prep.hubprep import (
    HubDefaults,
    add_hub_arguments,
    process_pairs,
    segmentation_from_args,
    source_with_revision,
    stamp_for,
    write_split,
)
from data_prep.moses import MosesRecipe, Pair
from data_prep.pipeline import PrepareRequest, prepare_binarized
from recurnmt.cli import entry_point

PROG = "python -m data_prep.iwslt14"

SOURCE = HubSource(
    dataset="may-ohta/iwslt14",
    revision="main",
    data_files={
        "train": "data/train-*.parquet",
        "validation": "data/validation-*.parquet",
        "test": "data/test-*.parquet",
    },
    expected_rows={"train": 171_721, "validation": 2_082, "test": 4_782},
)
DEFAULTS = HubDefaults(out="data-bin/iwslt14_de_en", src="de", tgt="en", vocab_size=10_000)
VALID_EVERY = 23
TRAIN_FILTER = PairFilter(min_words=1, max_words=175, max_ratio=1.5)
_METADATA = re.compile(r"<(url|talkid|keywords|speaker|reviewer|translator)>")
_MARKUP = re.compile(r"</?(title|description)>")
_SEGMENT = re.compile(r'^\s*<seg id="?\d*"?>\s*|\s*</seg>\s*$')


def clean_train_pairs(pairs: Iterable[Pair]) -> Iterator[Pair]:
    """Drop TED metadata lines and strip title/description markup (recipe step 1)."""
    for src, tgt in pairs:
        if _METADATA.search(src) or _METADATA.search(tgt):
            continue
        yield _MARKUP.sub("", src).strip(), _MARKUP.sub("", tgt).strip()


def clean_eval_text(text: str) -> str:
    """Strip a ``<seg>`` wrapper if present and normalize the typographic apostrophe."""
    return _SEGMENT.sub("", text).replace("\u2019", "'").strip()


def recipes(src: str, tgt: str, tokenize: bool) -> tuple[MosesRecipe, MosesRecipe]:
    """Moses steps of the recipe: tokenize (unless sentencepiece) and lowercase."""
    return (
        MosesRecipe(src, tokenize=tokenize, lowercase=True),
        MosesRecipe(tgt, tokenize=tokenize, lowercase=True),
    )


def carve_valid(rows: Iterable[tuple[Pair, Pair]]) -> tuple[list, list]:
    """Split cleaned training rows into (train, valid): valid is every 23rd row (1-based)."""
    train, valid = [], []
    for number, row in enumerate(rows, 1):
        (valid if number % VALID_EVERY == 0 else train).append(row)
    return train, valid


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Parse the command line."""
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    add_hub_arguments(parser, DEFAULTS)
    parser.add_argument(
        "--test-splits",
        default="test",
        help="comma-separated hub splits concatenated into our test set (default: test)",
    )
    return parser.parse_args(argv)


def prepare(args: argparse.Namespace) -> Path:
    """Run the whole preparation for parsed ``args``; returns the output directory."""
    if {args.src, args.tgt} != {"de", "en"}:
        raise PrepError(f"--src/--tgt must be de and en in either order, got {args.src}-{args.tgt}")
    source = source_with_revision(SOURCE, args.revision)
    test_splits = [s for s in args.test_splits.split(",") if s]
    if unknown := set(test_splits) - set(source.data_files):
        raise PrepError(f"--test-splits: unknown hub split(s) {sorted(unknown)}")
    splits = load_splits(source, args.from_local, args.cache_dir, args.redownload)
    src_recipe, tgt_recipe = recipes(args.src, args.tgt, tokenize=args.segmentation == "bpe")
    langs = (args.src, args.tgt)

    def write_inputs(work: Path, out: Path) -> None:
        raw_train = clean_train_pairs(iter_pairs(splits["train"], *langs, desc="read train"))
        rows = process_pairs(raw_train, src_recipe, tgt_recipe, args.workers)
        kept = (row for row in rows if TRAIN_FILTER.reason(*row[1]) is None)
        train, valid = carve_valid(kept)
        if args.max_train is not None:
            train = train[: args.max_train]
        write_split(train, work, "train", langs)
        write_split(valid, work, "valid", langs, raw_dir=out)
        test_raw = (
            (clean_eval_text(s), clean_eval_text(t))
            for split in test_splits
            for s, t in iter_pairs(splits[split], *langs, desc=f"read {split}")
        )
        rows = process_pairs(test_raw, src_recipe, tgt_recipe, args.workers)
        write_split(rows, work, "test", langs, raw_dir=out)

    request = PrepareRequest(
        out=args.out,
        src=args.src,
        tgt=args.tgt,
        segmentation=segmentation_from_args(args, spm_max_sentences=0),
        stamp=stamp_for(source, args, corpus="iwslt14", test_splits=test_splits),
        workers=args.workers,
        force=args.force,
    )
    return prepare_binarized(request, write_inputs)


def main(argv: list[str] | None = None) -> Path:
    """Prepares the data set; returns the output directory.

    Raises:
        PrepError: a step failed (names it); a partial output is removed.
    """
    return prepare(parse_args(argv))


cli = entry_point(main, PROG)

if __name__ == "__main__":
    sys.exit(cli())
