"""The standard preparation, decoding and scoring of each translation dataset.

IWSLT14: beam 5, length penalty 1, lowercased data; WMT14: beam 4, length penalty 0.6 and
compound-split tokenized BLEU (Vaswani et al. 2017, sec. 6.1); the LibreOffice help corpus
shipped with ``data_prep``: sentencepiece, beam 5. Recipes (:mod:`recurnmt.experiments.recipe`), the
evaluation plan (:mod:`recurnmt.experiments.evaluation`) and the results table
(:mod:`recurnmt.experiments.results`) read them from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class DatasetPreset:
    """How a dataset is prepared, decoded and scored.

    Attributes:
        name: the key (``iwslt14``, ``wmt14``, ``lohelp``).
        title: for tables.
        data: default data directory (``data_prep``'s default ``--out``).
        source_lang: source language.
        target_lang: target language.
        prepare: the command that writes ``{data}``.
        beam: beam size.
        lenpen: length penalty.
        lowercase: the data is lowercased, so sacrebleu compares case-insensitively.
        compound_split: tokenized BLEU with compound splitting.
        segmentation: ``bpe`` (Moses + subword-nmt), ``spm`` or ``bibert`` (a word-piece
            tokenizer), when the data directory does not say (its ``spm.model`` /
            ``bpe.codes`` / ``tokenizer/``).
    """

    name: str
    title: str
    data: str
    source_lang: str
    target_lang: str
    prepare: str
    beam: int
    lenpen: float
    lowercase: bool = False
    compound_split: bool = False
    segmentation: str = "bpe"


PRESETS: dict[str, DatasetPreset] = {
    # fairseq examples/translation (IWSLT14 transformer): beam 5, --remove-bpe; lowercased data
    "iwslt14": DatasetPreset(
        "iwslt14",
        "IWSLT14 De-En",
        "data-bin/iwslt14_de_en",
        "de",
        "en",
        "python -m data_prep.iwslt14 --out {data}",
        beam=5,
        lenpen=1.0,
        lowercase=True,
    ),
    # Vaswani et al. 2017 sec. 6.1 / fairseq scaling NMT: beam 4, lenpen 0.6, compound split
    "wmt14": DatasetPreset(
        "wmt14",
        "WMT14 En-De",
        "data-bin/wmt14_en_de",
        "en",
        "de",
        "python -m data_prep.wmt14 --out {data}",
        beam=4,
        lenpen=0.6,
        compound_split=True,
    ),
    # RingFormer Table 1 direction (sec. 4.1): German to English, same test set and decoding
    "wmt14_de_en": DatasetPreset(
        "wmt14_de_en",
        "WMT14 De-En",
        "data-bin/wmt14_de_en",
        "de",
        "en",
        "python -m data_prep.wmt14 --src de --tgt en --out {data}",
        beam=4,
        lenpen=0.6,
    ),
    # RingFormer sec. 4.1 / Table 1 exactly: the same sentences, tokenized with the 52K BiBERT
    # vocabulary (data_prep.bibert); decoded with fairseq's BERT word-piece decoder
    "wmt14_de_en_bibert": DatasetPreset(
        "wmt14_de_en_bibert",
        "WMT14 De-En (BiBERT vocabulary)",
        "data-bin/wmt14_de_en_bibert",
        "de",
        "en",
        "python -m data_prep.wmt14 --src de --tgt en --tokenizer bibert --out {data}",
        beam=4,
        lenpen=0.6,
        segmentation="bibert",
    ),
    "lohelp": DatasetPreset(
        "lohelp",
        "LibreOffice help De-En",
        "data-bin/lohelp_de_en",
        "de",
        "en",
        "python -m data_prep.embedded prepare --out {data}",
        beam=5,
        lenpen=1.0,
        segmentation="spm",
    ),
}


def segmentation_of(data: str | Path, default: str = "bpe") -> str:
    """``spm``, ``bpe`` or ``bibert``: what ``data_prep`` segmented ``data`` with (``default``
    if unknown)."""
    data = Path(data)
    if (data / "tokenizer" / "vocab.txt").is_file():
        return "bibert"
    if (data / "spm.model").is_file():
        return "spm"
    if (data / "bpe.codes").is_file():
        return "bpe"
    return default
