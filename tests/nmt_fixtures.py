"""Data fixtures shared by the NMT end-to-end tests.

``data``: a binarized slice of the embedded LibreOffice help corpus (real German-English text,
sentencepiece, the demo's pipeline). ``wmt14_bpe``: the WMT14 hub-format fixture prepared by
``data_prep.wmt14`` (Moses tokenization + joint BPE, as the real recipe). Each is built once per
test session, however many test modules import it.

Use: ``from tests.nmt_fixtures import data  # noqa: F401``.
"""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import pytest

SIZES = {"train": 1500, "valid": 40, "test": 24}
HUB_FIXTURES = Path(__file__).resolve().parent / "fixtures" / "data_prep" / "hub"
_BUILT: dict[str, Path] = {}


def build_tiny_corpus(root: Path) -> Path:
    """Binarizes the first :data:`SIZES` pairs of the shipped corpus under ``root``."""
    from data_prep.checksums import write_manifest
    from data_prep.embedded import SHIPPED_DIR
    from data_prep.embedded.prepare import prepare

    corpus = root / "corpus"
    corpus.mkdir(parents=True)
    for split, n in SIZES.items():
        for lang in ("de", "en"):
            with gzip.open(SHIPPED_DIR / f"{split}.{lang}.gz", "rt", encoding="utf-8") as f:
                lines = [next(f) for _ in range(n)]
            with gzip.open(corpus / f"{split}.{lang}.gz", "wt", encoding="utf-8") as f:
                f.writelines(lines)
    for name in ("spm.model", "spm.vocab"):
        shutil.copy(SHIPPED_DIR / name, corpus / name)
    write_manifest(corpus, sorted(p.name for p in corpus.iterdir()))
    return prepare(root / "bin" / "tiny", corpus_dir=corpus)


def build_wmt14_bpe(root: Path, direction: tuple[str, str] = ("en", "de")) -> Path:
    """``python -m data_prep.wmt14 --from-local FIXTURE`` with a 300-merge BPE."""
    from data_prep import wmt14

    out = root / "wmt14_bpe"
    args = ["--from-local", str(HUB_FIXTURES / "wmt14"), "--out", str(out)]
    args += ["--src", direction[0], "--tgt", direction[1]]
    args += ["--cache-dir", str(root / "cache"), "--vocab-size", "300"]
    wmt14.main(args)
    return out


def _once(key: str, factory, tmp_path_factory: pytest.TempPathFactory) -> Path:
    if key not in _BUILT:
        _BUILT[key] = factory(tmp_path_factory.mktemp(key))
    return _BUILT[key]


@pytest.fixture(scope="session")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A binarized slice of the shipped corpus (real text, same pipeline as the demo)."""
    return _once("tiny", build_tiny_corpus, tmp_path_factory)


@pytest.fixture(scope="session")
def wmt14_bpe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The WMT14 fixture, Moses-tokenized and BPE-segmented by data_prep (8 test pairs)."""
    return _once("wmt14", build_wmt14_bpe, tmp_path_factory)


@pytest.fixture(scope="session")
def wmt14_de_en_bpe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The WMT14 fixture in RingFormer's direction, German to English."""
    return _once("wmt14_de_en", lambda root: build_wmt14_bpe(root, ("de", "en")), tmp_path_factory)
