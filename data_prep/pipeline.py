"""The shared tail of every preparation: segment, filter, binarize, publish atomically.

A corpus-specific command only writes its cleaned text; :func:`prepare_binarized` does the
rest in a temporary directory that is renamed to the output path when everything succeeded:

```
out/
  dict.{src,tgt}.txt  {split}.{src}-{tgt}.{src,tgt}.{bin,idx}   # fairseq-preprocess output
  {split}.raw.{src,tgt}    # detokenized text: sacrebleu references and interactive input
  spm.model | bpe.codes | tokenizer/   # the segmentation model, to encode new input / decode
                                       # output (tokenizer/: a word-piece tokenizer, whose
                                       # vocabulary is the dictionary one to one)
  prepare.json             # what was prepared from what; written last
```
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from data_prep.atomic import atomic_output_dir
from data_prep.binarize import binarize
from data_prep.cleaning import FilterStats, PairFilter, filter_pairs
from data_prep.segment import SegmentationSpec, fit_segmenter, segment_file
from data_prep.textio import iter_lines
from data_prep.wordpiece import WordPieceSegmenter, write_fairseq_dictionary

SPLITS = ("train", "valid", "test")
STAMP_NAME = "prepare.json"
WORK_NAME = "_work"


@dataclass(frozen=True)
class PrepareRequest:
    """One preparation of a binarized fairseq data directory.

    Attributes:
        out: The data directory to produce (``data-bin/...``).
        src: Source language code (file suffix).
        tgt: Target language code.
        segmentation: How to segment (learnt on the train split unless pretrained).
        stamp: JSON-able description of the inputs and options; an existing ``out`` whose
            ``prepare.json`` holds the same stamp is up to date and left alone.
        train_filter: Pair filter applied to the segmented training pairs (fairseq's WMT
            recipe cleans after BPE); valid and test are never filtered.
        workers: ``fairseq-preprocess`` workers.
        force: Rebuild and replace ``out`` even if it is up to date or was made differently.
    """

    out: Path
    src: str
    tgt: str
    segmentation: SegmentationSpec
    stamp: dict[str, Any] = field(default_factory=dict)
    train_filter: PairFilter | None = None
    workers: int = 1
    force: bool = False


InputWriter = Callable[[Path, Path], None]
"""``write_inputs(work, out)``: write ``work/{split}.{lang}`` (text to segment, one sentence per
line, all splits and both languages) and optionally ``out/{split}.raw.{lang}`` references."""


def read_stamp(out: Path) -> dict[str, Any] | None:
    """The stamp of a prepared directory, or ``None`` if absent or unreadable."""
    try:
        return json.loads((out / STAMP_NAME).read_text(encoding="utf-8"))["stamp"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _filter_train(work: Path, src: str, tgt: str, rule: PairFilter) -> FilterStats:
    """Filter the segmented train pairs into ``train.clean.{src,tgt}``, streaming."""
    stats = FilterStats()
    pairs = zip(
        iter_lines(work / f"train.seg.{src}"), iter_lines(work / f"train.seg.{tgt}"), strict=True
    )
    with (
        open(work / f"train.clean.{src}", "w", encoding="utf-8", newline="\n") as out_src,
        open(work / f"train.clean.{tgt}", "w", encoding="utf-8", newline="\n") as out_tgt,
    ):
        for s, t in filter_pairs(pairs, rule, stats):
            out_src.write(s + "\n")
            out_tgt.write(t + "\n")
    return stats


def prepare_binarized(request: PrepareRequest, write_inputs: InputWriter) -> Path:
    """Produce ``request.out`` atomically (see the module docstring for its layout).

    Args:
        request: Output path, languages, segmentation and stamp.
        write_inputs: Writes the cleaned text of every split (see :data:`InputWriter`).

    Returns:
        The output directory.

    Raises:
        FileExistsError: If ``out`` exists, was prepared differently (or not by us) and
            ``force`` is false.
    """
    out, src, tgt = Path(request.out), request.src, request.tgt
    stamp = json.loads(json.dumps(request.stamp, default=str))
    if out.exists() and not request.force:
        if read_stamp(out) == stamp:
            print(f"{out} is up to date (same {STAMP_NAME}); nothing to do", file=sys.stderr)
            return out
        raise FileExistsError(
            f"{out} exists but was prepared from other inputs or options "
            f"(its {STAMP_NAME} differs or is missing); pass --force to replace it"
        )
    with atomic_output_dir(out, replace=request.force) as tmp:
        work = tmp / WORK_NAME
        work.mkdir()
        write_inputs(work, tmp)
        for split in SPLITS:
            for lang in (src, tgt):
                if not (work / f"{split}.{lang}").is_file():
                    raise FileNotFoundError(f"input writer did not produce {split}.{lang}")
        spec = request.segmentation
        model = tmp / spec.model_file_name
        print(f"learning/loading {spec.kind} segmentation ...", file=sys.stderr)
        segmenter = fit_segmenter(spec, [work / f"train.{src}", work / f"train.{tgt}"], model)
        srcdict = None  # a dictionary learnt from train, unless the tokenizer fixes one
        if isinstance(segmenter, WordPieceSegmenter):
            srcdict = write_fairseq_dictionary(segmenter.tokenizer, work / "dict.txt")
        counts: dict[str, int] = {}
        for split in SPLITS:
            for lang in (src, tgt):
                name = f"{split}.{lang}"
                seg = work / f"{split}.seg.{lang}"
                counts[name] = segment_file(spec.kind, model, work / name, seg, request.workers)
        prefixes = {split: work / f"{split}.seg" for split in SPLITS}
        filter_stats = None
        if request.train_filter is not None:
            filter_stats = _filter_train(work, src, tgt, request.train_filter).as_dict()
            prefixes["train"] = work / "train.clean"
        binarize(prefixes, tmp, src, tgt, workers=request.workers, srcdict=srcdict)
        shutil.rmtree(work)
        record = {
            "stamp": stamp,
            "lines": counts,
            "train_filter": filter_stats,
            "segmentation_model": spec.model_file_name,
        }
        (tmp / STAMP_NAME).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {out}", file=sys.stderr)
    return out
