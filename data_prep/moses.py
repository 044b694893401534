"""Moses-style text processing (via ``sacremoses``), as fairseq's translation recipes do it.

``prepare-iwslt14.sh`` runs ``tokenizer.perl -l L`` then ``lowercase.perl``;
``prepare-wmt14en2de.sh`` runs ``normalize-punctuation.perl -l L``,
``remove-non-printing-char.perl`` and ``tokenizer.perl -a -l L``. :class:`MosesRecipe` names
those steps; :func:`make_pair_processor` builds the function applied to each sentence pair.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable
from dataclasses import dataclass

Pair = tuple[str, str]


@dataclass(frozen=True)
class MosesRecipe:
    """Which Moses steps to run on one language.

    Attributes:
        lang: Language code for the language-specific rules.
        normalize_punctuation: ``normalize-punctuation.perl``.
        remove_non_printing: ``remove-non-printing-char.perl`` (control/format chars -> space).
        tokenize: ``tokenizer.perl`` (with its default escaping of ``& < > ' " [ ] |``).
        aggressive_dashes: ``tokenizer.perl -a`` (split hyphenated words: ``a @-@ b``).
        lowercase: ``lowercase.perl``.
    """

    lang: str
    normalize_punctuation: bool = False
    remove_non_printing: bool = False
    tokenize: bool = True
    aggressive_dashes: bool = False
    lowercase: bool = False


def remove_non_printing(text: str) -> str:
    """Replace Unicode "other" characters (control, format, unassigned, ...) by spaces."""
    return "".join(" " if unicodedata.category(ch).startswith("C") else ch for ch in text)


def make_processor(recipe: MosesRecipe) -> Callable[[str], str]:
    """Build the function that applies ``recipe`` to one sentence."""
    from sacremoses import MosesPunctNormalizer, MosesTokenizer

    normalizer = MosesPunctNormalizer(recipe.lang) if recipe.normalize_punctuation else None
    tokenizer = MosesTokenizer(recipe.lang) if recipe.tokenize else None

    def process(text: str) -> str:
        if normalizer is not None:
            text = normalizer.normalize(text)
        if recipe.remove_non_printing:
            text = remove_non_printing(text)
        if tokenizer is not None:
            text = tokenizer.tokenize(
                text, aggressive_dash_splits=recipe.aggressive_dashes, return_str=True, escape=True
            )
        text = " ".join(text.split())
        return text.lower() if recipe.lowercase else text

    return process


def make_pair_processor(src: MosesRecipe, tgt: MosesRecipe) -> Callable[[Pair], Pair]:
    """Build the function that processes a ``(source, target)`` pair (see :mod:`parallel`)."""
    process_src, process_tgt = make_processor(src), make_processor(tgt)

    def process(pair: Pair) -> Pair:
        return process_src(pair[0]), process_tgt(pair[1])

    return process
