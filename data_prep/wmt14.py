"""``python -m data_prep.wmt14``: WMT14 English-German for fairseq.

Follows fairseq's ``examples/translation/prepare-wmt14en2de.sh`` on the hub copy of WMT14
(``wmt/wmt14``, config ``de-en``: Europarl v7, Common Crawl and News Commentary, 4,508,785
pairs), with the usual evaluation sets of the literature: newstest2013 (the hub's
``validation``) as valid and the full newstest2014 (``test``, 3,003 pairs) as test.

1. Training text: ``normalize-punctuation.perl``, ``remove-non-printing-char.perl``,
   ``tokenizer.perl -a`` per language. Valid/test: ``’`` -> ``'`` then ``tokenizer.perl -a``.
2. Joint BPE with 40,000 merges (subword-nmt) learnt on train, applied to all.
3. Training pairs of 1-250 BPE units a side with a length ratio of at most 1.5 are kept
   (``clean-corpus-n.perl -ratio 1.5 ... 1 250``); ``fairseq-preprocess --joined-dictionary``.

``--segmentation spm`` skips the tokenization (normalization stays) and learns a joint
sentencepiece model (on a 4M-line sample of train) instead of BPE.

``--tokenizer bibert`` (RingFormer sec. 4.1) also skips the tokenization and segments with
the BiBERT authors' 52K word-piece tokenizer (``jhu-clsp/bibert-ende`` through
``transformers``, or ``--tokenizer-path DIR``), binarized with a fairseq dictionary that is the
tokenizer's vocabulary one to one (see :mod:`data_prep.wordpiece`); the tokenizer is saved in
``OUT/tokenizer/`` for decoding (``fairseq-generate --bpe bert --bpe-vocab-file
OUT/tokenizer/vocab.txt``) and for ``python -m recurnmt.export``.
"""

from __future__ import annotations

import argparse
import sys
from itertools import islice
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
from data_prep.moses import MosesRecipe
from data_prep.pipeline import PrepareRequest, prepare_binarized
from data_prep.segment import SegmentationSpec
from data_prep.wordpiece import BIBERT
from recurnmt.cli import entry_point

PROG = "python -m data_prep.wmt14"

SOURCE = HubSource(
    dataset="wmt/wmt14",
    revision="99a5abb5d3d446e54a4cf512c77dc4fd8dc95e42",
    data_files={
        "train": "de-en/train-*.parquet",
        "validation": "de-en/validation-*.parquet",
        "test": "de-en/test-*.parquet",
    },
    expected_rows={"train": 4_508_785, "validation": 3_000, "test": 3_003},
)
DEFAULTS = HubDefaults(
    out="data-bin/wmt14_en_de", src="en", tgt="de", vocab_size=40_000, spm_max_sentences=4_000_000
)
TRAIN_FILTER = PairFilter(min_words=1, max_words=250, max_ratio=1.5)
EVAL_SPLITS = {"valid": "validation", "test": "test"}


def train_recipe(lang: str, tokenize: bool) -> MosesRecipe:
    """Moses steps on training text."""
    return MosesRecipe(
        lang,
        normalize_punctuation=True,
        remove_non_printing=True,
        tokenize=tokenize,
        aggressive_dashes=True,
    )


def eval_recipe(lang: str, tokenize: bool) -> MosesRecipe:
    """Moses steps on newstest text (the recipe does not normalize punctuation there)."""
    return MosesRecipe(lang, tokenize=tokenize, aggressive_dashes=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Parse the command line."""
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    add_hub_arguments(parser, DEFAULTS)
    parser.add_argument(
        "--tokenizer",
        choices=["bibert"],
        help="segment with a pretrained word-piece tokenizer instead of --segmentation: "
        "bibert, the 52K BiBERT vocabulary of RingFormer sec. 4.1",
    )
    parser.add_argument(
        "--tokenizer-path",
        default=BIBERT,
        metavar="NAME_OR_DIR",
        help=f"hub name or local directory of the --tokenizer (default: {BIBERT})",
    )
    return parser.parse_args(argv)


def segmentation_spec(args: argparse.Namespace) -> SegmentationSpec:
    """The segmentation: --segmentation's, or the pretrained --tokenizer's word pieces."""
    if args.tokenizer is None:
        return segmentation_from_args(args, DEFAULTS.spm_max_sentences)
    if args.segmentation != "bpe":  # bpe is the default, so it was not asked for
        raise PrepError(
            f"--tokenizer {args.tokenizer} segments with its own word pieces; "
            f"drop --segmentation {args.segmentation}"
        )
    return SegmentationSpec(kind="wordpiece", tokenizer=str(args.tokenizer_path))


def prepare(args: argparse.Namespace) -> Path:
    """Run the whole preparation for parsed ``args``; returns the output directory."""
    if {args.src, args.tgt} != {"de", "en"}:
        raise PrepError(f"--src/--tgt must be de and en in either order, got {args.src}-{args.tgt}")
    segmentation = segmentation_spec(args)
    source = source_with_revision(SOURCE, args.revision)
    splits = load_splits(source, args.from_local, args.cache_dir, args.redownload)
    tokenize = segmentation.kind == "bpe"
    langs = (args.src, args.tgt)

    def write_inputs(work: Path, out: Path) -> None:
        pairs = iter_pairs(splits["train"], *langs, desc="read train")
        pairs = islice(pairs, args.max_train)  # max_train None: everything
        recipes = (train_recipe(args.src, tokenize), train_recipe(args.tgt, tokenize))
        write_split(process_pairs(pairs, *recipes, args.workers), work, "train", langs)
        recipes = (eval_recipe(args.src, tokenize), eval_recipe(args.tgt, tokenize))
        for split, hub_split in EVAL_SPLITS.items():
            pairs = (
                (s.replace("\u2019", "'"), t.replace("\u2019", "'"))
                for s, t in iter_pairs(splits[hub_split], *langs, desc=f"read {hub_split}")
            )
            rows = process_pairs(pairs, *recipes, args.workers)
            write_split(rows, work, split, langs, raw_dir=out)

    request = PrepareRequest(
        out=args.out,
        src=args.src,
        tgt=args.tgt,
        segmentation=segmentation,
        stamp=stamp_for(source, args, corpus="wmt14", **_tokenizer_stamp(args)),
        train_filter=TRAIN_FILTER,
        workers=args.workers,
        force=args.force,
    )
    return prepare_binarized(request, write_inputs)


def _tokenizer_stamp(args: argparse.Namespace) -> dict[str, str]:
    """The stamp's tokenizer entry (none without --tokenizer: older stamps stay valid)."""
    if args.tokenizer is None:
        return {}
    path = Path(args.tokenizer_path)
    return {"tokenizer": str(path.resolve()) if path.is_dir() else str(args.tokenizer_path)}


def main(argv: list[str] | None = None) -> Path:
    """Prepares the data set; returns the output directory.

    Raises:
        PrepError: a step failed (names it); a partial output is removed.
    """
    return prepare(parse_args(argv))


cli = entry_point(main, PROG)

if __name__ == "__main__":
    sys.exit(cli())
