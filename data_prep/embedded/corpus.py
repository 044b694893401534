"""From two unpacked help trees to cleaned, document-split sentence pairs.

Pairs are grouped by help page ("document"); whole pages go to one split, chosen by a stable
hash of the page path, so no page of the test set was seen in training. Text that a page embeds
from another page (menu paths, shared notes) recurs across pages, so after splitting every
valid/test pair whose German or English side also occurs in train (and every valid pair that
occurs in test) is dropped.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from data_prep.cleaning import FilterStats, PairFilter, filter_pairs
from data_prep.embedded.help_html import align_pages, parse_help_page

Pair = tuple[str, str]  # (German, English)

# Help paragraphs are UI strings and short prose: ratio on characters with smoothing (German
# compounds make word ratios meaningless), at most 80 words a side (99th percentile ~60).
DEFAULT_FILTER = PairFilter(
    min_words=1, max_words=80, max_ratio=2.0, ratio_unit="chars", smoothing=10, drop_identical=True
)
SPLIT_SALT = "lohelp-split-v1"


@dataclass
class Document:
    """The aligned pairs of one help page.

    Attributes:
        path: Page path relative to the language's help root, e.g. ``text/shared/01/x.html``.
        pairs: ``(German, English)`` unit pairs in page order.
    """

    path: str
    pairs: list[Pair]


@dataclass
class SplitCorpus:
    """Cleaned pairs per split, plus the bookkeeping for the provenance record."""

    pairs: dict[str, list[Pair]]
    documents: dict[str, list[str]]
    stats: dict[str, object] = field(default_factory=dict)


def iter_documents(de_root: Path, en_root: Path, progress: bool = True) -> Iterator[Document]:
    """Align every page present in both help trees, in sorted path order.

    Args:
        de_root: The German help root (``.../help/de``).
        en_root: The English help root (``.../help/en-US``).
        progress: Show a progress bar.

    Yields:
        One document per page found in both trees (pages of one language only are skipped).
    """
    paths = sorted(p.relative_to(en_root).as_posix() for p in en_root.rglob("*.html"))
    for rel in tqdm(paths, desc="parse help pages", unit=" pages", disable=not progress):
        de_page = de_root / rel
        if not de_page.is_file():
            continue
        de_units = parse_help_page(de_page.read_text(encoding="utf-8"))
        en_units = parse_help_page((en_root / rel).read_text(encoding="utf-8"))
        pairs = [(de, en) for _, de, en in align_pages(de_units, en_units)]
        yield Document(rel, pairs)


def split_of(path: str, valid_share: float, test_share: float) -> str:
    """The split of a page: a stable hash of its path mapped to [0, 1).

    Independent of the order and number of pages, the Python version and the platform.
    """
    digest = hashlib.sha256(f"{SPLIT_SALT}:{path}".encode()).digest()
    u = int.from_bytes(digest[:8], "big") / 2**64
    if u < test_share:
        return "test"
    if u < test_share + valid_share:
        return "valid"
    return "train"


def split_corpus(
    documents: list[Document],
    valid_share: float = 0.05,
    test_share: float = 0.05,
    rule: PairFilter = DEFAULT_FILTER,
    seed: int = 1,
) -> SplitCorpus:
    """Clean, split by document, dedupe and de-overlap the pairs.

    Args:
        documents: Aligned pages.
        valid_share: Expected share of pages that go to valid.
        test_share: Expected share of pages that go to test.
        rule: Pair filter applied before splitting.
        seed: Seed of the shuffle of train (so any prefix of train is a random sample).

    Returns:
        Pairs per split (valid/test in page order, train shuffled) and statistics.
    """
    stats = FilterStats()
    raw = {"train": [], "valid": [], "test": []}
    docs: dict[str, list[str]] = {"train": [], "valid": [], "test": []}
    aligned = 0
    for doc in documents:
        aligned += len(doc.pairs)
        split = split_of(doc.path, valid_share, test_share)
        kept = list(filter_pairs(doc.pairs, rule, stats))
        if kept:
            docs[split].append(doc.path)
            raw[split].extend(kept)

    out: dict[str, list[Pair]] = {}
    train = list(dict.fromkeys(raw["train"]))
    out["train"] = train
    seen_sides = {de for de, _ in train} | {en for _, en in train}
    overlap: dict[str, int] = {}
    for split in ("test", "valid"):
        unique = list(dict.fromkeys(raw[split]))
        kept = [(de, en) for de, en in unique if de not in seen_sides and en not in seen_sides]
        overlap[split] = len(unique) - len(kept)
        out[split] = kept
        seen_sides |= {de for de, _ in kept} | {en for _, en in kept}
    random.Random(seed).shuffle(train)

    result = {name: out[name] for name in ("train", "valid", "test")}
    return SplitCorpus(
        pairs=result,
        documents=docs,
        stats={
            "aligned_units": aligned,
            "filter": stats.as_dict(),
            "duplicates_removed": {s: len(raw[s]) - len(set(raw[s])) for s in raw},
            "eval_overlap_removed": overlap,
            "pairs": {s: len(p) for s, p in result.items()},
            "documents": {s: len(d) for s, d in docs.items()},
        },
    )
