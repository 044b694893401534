"""``prepare``: binarize the shipped corpus for fairseq.

Verifies the shipped files against their sha256 manifest, encodes them with the shipped
sentencepiece model (8,000 pieces), or with one of another size learned on the training split
with the shipped model's settings (``vocab_size``), and runs ``fairseq-preprocess
--joined-dictionary``; the output directory appears only when everything succeeded (see
:mod:`data_prep.pipeline`).
"""

from __future__ import annotations

from pathlib import Path

from data_prep.checksums import MANIFEST_NAME, sha256_file, verify_manifest
from data_prep.embedded import CORPUS_NAME, LANGS, SHIPPED_DIR
from data_prep.embedded.build import SPM_SPEC
from data_prep.errors import IntegrityError, PrepError
from data_prep.pipeline import SPLITS, PrepareRequest, prepare_binarized
from data_prep.segment import SegmentationSpec
from data_prep.textio import read_lines, write_lines

REPAIR_HINT = (
    "; restore it with `git checkout -- data_prep/embedded/` "
    "or rebuild it with `python -m data_prep.embedded build`"
)


def load_split(corpus_dir: Path, split: str, limit: int | None = None) -> dict[str, list[str]]:
    """Read one split of the shipped corpus, checking that both sides have as many lines.

    Args:
        corpus_dir: The shipped corpus directory.
        split: ``train``, ``valid`` or ``test``.
        limit: Keep only the first ``limit`` pairs (train is stored shuffled, so this is a
            random sample).

    Returns:
        ``{"de": lines, "en": lines}``.

    Raises:
        IntegrityError: If the two sides differ in length.
    """
    sides = {lang: read_lines(corpus_dir / f"{split}.{lang}.gz") for lang in LANGS}
    if len(sides["de"]) != len(sides["en"]):
        raise IntegrityError(
            f"{corpus_dir}: {split}.de.gz has {len(sides['de'])} lines but "
            f"{split}.en.gz has {len(sides['en'])}{REPAIR_HINT}"
        )
    if limit is not None:
        sides = {lang: lines[:limit] for lang, lines in sides.items()}
    return sides


def prepare(
    out: Path,
    src: str = "de",
    tgt: str = "en",
    max_train: int | None = None,
    workers: int = 1,
    force: bool = False,
    corpus_dir: Path = SHIPPED_DIR,
    vocab_size: int | None = None,
) -> Path:
    """Binarize the shipped corpus into ``out``.

    Args:
        out: Output data directory (e.g. ``data-bin/lohelp_de_en``).
        src: Source language, ``de`` or ``en``.
        tgt: Target language, the other one.
        max_train: Use only the first ``max_train`` training pairs.
        workers: ``fairseq-preprocess`` workers.
        force: Rebuild even if ``out`` is up to date, replacing it.
        corpus_dir: The shipped corpus (tests point this at a tiny copy).
        vocab_size: Learn a joint sentencepiece model of this many pieces on the (German and
            English) training split, with the shipped model's settings and seed, instead of
            using the shipped 8,000-piece model. A small vocabulary suits a small corpus and a
            small compute budget: the output layer costs the vocabulary size per target token.

    Returns:
        The output directory.

    Raises:
        IntegrityError: If a shipped file is missing or corrupt (the message names it).
        PrepError: If the language pair is not de/en, or ``vocab_size`` is not positive.
    """
    if {src, tgt} != set(LANGS):
        raise PrepError(f"--src/--tgt must be de and en in either order, got {src}-{tgt}")
    if vocab_size is not None and vocab_size < 100:
        raise PrepError(f"--vocab-size must be at least 100 pieces, got {vocab_size}")
    corpus_dir = Path(corpus_dir)
    verify_manifest(corpus_dir, hint=REPAIR_HINT)
    stamp = {
        "corpus": CORPUS_NAME,
        "manifest_sha256": sha256_file(corpus_dir / MANIFEST_NAME),
        "src": src,
        "tgt": tgt,
        "max_train": max_train,
    }
    if vocab_size is not None:
        stamp["vocab_size"] = vocab_size  # absent for the shipped model: old stamps still hold
        segmentation = SegmentationSpec(**{**SPM_SPEC.__dict__, "vocab_size": vocab_size})
    else:
        segmentation = SegmentationSpec(kind="spm", pretrained=corpus_dir / "spm.model")

    def write_inputs(work: Path, tmp: Path) -> None:
        for split in SPLITS:
            sides = load_split(corpus_dir, split, max_train if split == "train" else None)
            for lang, lines in sides.items():
                write_lines(work / f"{split}.{lang}", lines)
                write_lines(tmp / f"{split}.raw.{lang}", lines)

    request = PrepareRequest(
        out=Path(out),
        src=src,
        tgt=tgt,
        segmentation=segmentation,
        stamp=stamp,
        workers=workers,
        force=force,
    )
    return prepare_binarized(request, write_inputs)
