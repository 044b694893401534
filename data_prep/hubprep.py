"""Shared command-line options and text handling of the hub corpora (IWSLT14, WMT14)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from data_prep.cleaning import PairFilter
from data_prep.hub import HubSource
from data_prep.moses import MosesRecipe, Pair, make_pair_processor
from data_prep.parallel import imap_ordered
from data_prep.segment import SegmentationSpec


@dataclass(frozen=True)
class HubDefaults:
    """Per-corpus defaults of the shared options."""

    out: str
    src: str
    tgt: str
    vocab_size: int
    spm_max_sentences: int = 0


def add_hub_arguments(parser: argparse.ArgumentParser, defaults: HubDefaults) -> None:
    """Add the options every hub corpus command understands."""
    parser.add_argument("--out", type=Path, default=Path(defaults.out), help="output data dir")
    parser.add_argument("--src", default=defaults.src, choices=["de", "en"])
    parser.add_argument("--tgt", default=defaults.tgt, choices=["de", "en"])
    parser.add_argument(
        "--from-local",
        type=Path,
        metavar="DIR",
        help="read the hub files (same layout) or a datasets save_to_disk dir from DIR",
    )
    parser.add_argument("--revision", help="hub revision to read (default: the pinned one)")
    parser.add_argument("--cache-dir", type=Path, help="datasets cache directory")
    parser.add_argument("--redownload", action="store_true", help="ignore cached downloads")
    parser.add_argument(
        "--segmentation",
        choices=["bpe", "spm"],
        default="bpe",
        help="bpe: Moses tokens + joint subword-nmt BPE (the fairseq recipe); "
        "spm: joint sentencepiece on untokenized text",
    )
    parser.add_argument(
        "--vocab-size",
        type=int,
        default=defaults.vocab_size,
        help="BPE merges or sentencepiece vocabulary size",
    )
    parser.add_argument("--spm-model-type", choices=["bpe", "unigram"], default="bpe")
    parser.add_argument("--workers", type=int, default=1, help="processes for text processing")
    parser.add_argument("--max-train", type=int, help="use only the first N training pairs")
    parser.add_argument("--force", action="store_true", help="rebuild and replace --out")


def segmentation_from_args(args: argparse.Namespace, spm_max_sentences: int) -> SegmentationSpec:
    """The segmentation spec selected on the command line."""
    return SegmentationSpec(
        kind=args.segmentation,
        vocab_size=args.vocab_size,
        spm_model_type=args.spm_model_type,
        spm_normalization="nmt_nfkc",
        spm_max_sentences=spm_max_sentences,
    )


def source_with_revision(source: HubSource, revision: str | None) -> HubSource:
    """``source`` at another revision (row counts are still checked)."""
    if revision is None:
        return source
    return HubSource(
        source.dataset, revision, source.data_files, source.expected_rows, source.column
    )


def stamp_for(source: HubSource, args: argparse.Namespace, **extra: Any) -> dict[str, Any]:
    """What identifies a preparation: the source, the options, and the local copy if any."""
    return {
        "dataset": source.dataset,
        "revision": source.revision,
        "from_local": str(Path(args.from_local).resolve()) if args.from_local else None,
        "src": args.src,
        "tgt": args.tgt,
        "segmentation": args.segmentation,
        "vocab_size": args.vocab_size,
        "spm_model_type": args.spm_model_type if args.segmentation == "spm" else None,
        "max_train": args.max_train,
        **extra,
    }


def _keep_raw(src: MosesRecipe, tgt: MosesRecipe) -> Callable[[Pair], tuple[Pair, Pair]]:
    process = make_pair_processor(src, tgt)
    return lambda pair: (pair, process(pair))


def process_pairs(
    pairs: Iterable[Pair], src: MosesRecipe, tgt: MosesRecipe, workers: int
) -> Iterator[tuple[Pair, Pair]]:
    """Yield ``(raw pair, processed pair)`` in order, processing in ``workers`` processes."""
    return imap_ordered(_keep_raw, (src, tgt), pairs, workers)


def write_split(
    rows: Iterable[tuple[Pair, Pair]],
    work: Path,
    split: str,
    langs: tuple[str, str],
    raw_dir: Path | None = None,
    keep: PairFilter | None = None,
) -> int:
    """Write processed pairs to ``work/{split}.{lang}`` (and raw ones to ``raw_dir``).

    Args:
        rows: ``(raw pair, processed pair)`` items.
        work: Directory of the text to segment.
        split: Split name used in file names.
        langs: ``(source, target)`` language codes.
        raw_dir: If given, also write ``{split}.raw.{lang}`` (references) there.
        keep: Drop pairs whose processed text this filter rejects.

    Returns:
        The number of pairs written.
    """
    count = 0
    with ExitStack() as stack:

        def opener(path: Path) -> Any:
            return stack.enter_context(open(path, "w", encoding="utf-8", newline="\n"))

        out = [opener(work / f"{split}.{lang}") for lang in langs]
        raw = [opener(raw_dir / f"{split}.raw.{lang}") for lang in langs] if raw_dir else None
        for raw_pair, pair in rows:
            if keep is not None and keep.reason(*pair) is not None:
                continue
            for handle, text in zip(out, pair, strict=True):
                handle.write(text + "\n")
            if raw is not None:
                for handle, text in zip(raw, raw_pair, strict=True):
                    handle.write(" ".join(text.split()) + "\n")
            count += 1
    return count
