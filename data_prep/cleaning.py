"""Sentence-pair filters shared by every corpus (length, length ratio, untranslated, dupes)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Literal


@dataclass(frozen=True)
class PairFilter:
    """Drop pairs that are empty, too long, untranslated or of implausible length ratio.

    ``ratio_unit="words"`` with ``smoothing=0`` behaves like Moses ``clean-corpus-n.perl``
    (which fairseq's WMT recipe runs on BPE tokens); ``"chars"`` with a small smoothing suits
    short UI strings, where word counts of German compounds and English phrases differ a lot.

    Attributes:
        min_words: Fewest whitespace-separated tokens allowed on each side.
        max_words: Most whitespace-separated tokens allowed on each side.
        max_ratio: Largest allowed ``(longer + smoothing) / (shorter + smoothing)``.
        ratio_unit: Measure lengths for the ratio in ``"words"`` or ``"chars"``.
        smoothing: Added to both lengths before the ratio, so very short pairs are not judged
            on one or two units.
        drop_identical: Drop pairs whose two sides are equal (untranslated text, code).
    """

    min_words: int = 1
    max_words: int = 250
    max_ratio: float = 1.5
    ratio_unit: Literal["words", "chars"] = "words"
    smoothing: int = 0
    drop_identical: bool = False

    def reason(self, src: str, tgt: str) -> str | None:
        """Why the pair should be dropped, or ``None`` to keep it."""
        src_words, tgt_words = len(src.split()), len(tgt.split())
        if min(src_words, tgt_words) < max(self.min_words, 1):
            return "empty" if min(src_words, tgt_words) == 0 else "too_short"
        if max(src_words, tgt_words) > self.max_words:
            return "too_long"
        if self.drop_identical and src == tgt:
            return "identical"
        if self.ratio_unit == "words":
            a, b = src_words, tgt_words
        else:
            a, b = len(src), len(tgt)
        a, b = a + self.smoothing, b + self.smoothing
        if max(a, b) > self.max_ratio * min(a, b):
            return "ratio"
        return None


@dataclass
class FilterStats:
    """Counts of kept pairs and of dropped pairs by reason."""

    kept: int = 0
    dropped: Counter[str] = field(default_factory=Counter)

    def as_dict(self) -> dict[str, int]:
        """Flat ``{"kept": n, "<reason>": n, ...}`` for reports."""
        return {"kept": self.kept, **dict(sorted(self.dropped.items()))}


def filter_pairs(
    pairs: Iterable[tuple[str, str]], rule: PairFilter, stats: FilterStats | None = None
) -> Iterator[tuple[str, str]]:
    """Yield the pairs that ``rule`` keeps, counting drops in ``stats``."""
    for src, tgt in pairs:
        why = rule.reason(src, tgt)
        if why is None:
            if stats is not None:
                stats.kept += 1
            yield src, tgt
        elif stats is not None:
            stats.dropped[why] += 1


def dedupe(pairs: Iterable[tuple[str, str]], seen: set[tuple[str, str]]) -> list[tuple[str, str]]:
    """Pairs not yet in ``seen``, in order; ``seen`` is updated in place."""
    out = []
    for pair in pairs:
        if pair not in seen:
            seen.add(pair)
            out.append(pair)
    return out
