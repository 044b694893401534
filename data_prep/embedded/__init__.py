"""The embedded German-English corpus built from LibreOffice's help pages.

Debian ships LibreOffice's help as HTML in ``libreoffice-help-<lang>`` packages. The German and
US-English copies of every page share paragraph ids, which gives human-translated sentence
pairs (MPL-2.0). ``python -m data_prep.embedded build`` rebuilds the compact copy shipped in
``data_prep/embedded/lohelp_de_en/``; ``python -m data_prep.embedded prepare`` binarizes it for
fairseq.
"""

from __future__ import annotations

from pathlib import Path

CORPUS_NAME = "lohelp_de_en"
SHIPPED_DIR = Path(__file__).resolve().parent / CORPUS_NAME
LANGS = ("de", "en")


def data_dir(vocab_size: int | None = None) -> Path:
    """Where ``prepare`` puts the corpus by default (relative to the working directory): one
    directory per vocabulary, so that the shipped 8,000-piece one and a learned one coexist."""
    name = CORPUS_NAME if vocab_size is None else f"{CORPUS_NAME}_spm{vocab_size}"
    return Path("data-bin") / name


DEBIAN_VERSION = "4:7.4.7-1+deb12u14"
DEBIAN_SUITE = "bookworm"
PACKAGES = {"de": "libreoffice-help-de", "en": "libreoffice-help-en-us"}
# Directory of each language below usr/share/libreoffice/help/ in the packages.
HELP_DIRS = {"de": "de", "en": "en-US"}
# sha256 of the pinned .deb files (the build refuses others unless told to accept them).
PINNED_SHA256 = {
    "de": "00490b63c509ac96f7f212d6a6e40452d3e0d1f97ccf4b824dd5ec4c01e8277f",
    "en": "8faa840285734d6cfe1ed25537b48f07e74bd6412e3917bf8e5f8a653f7b3712",
}
