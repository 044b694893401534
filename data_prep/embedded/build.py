"""``build``: rebuild the shipped corpus from the Debian help packages.

Steps: obtain the two ``.deb`` files (``apt-get download`` or a local directory), check their
sha256 against the pinned ones, unpack them, align the help pages, clean and split by page,
learn a joint sentencepiece model on train, and write the compact copy (gzipped text, model,
licence, provenance, sha256 manifest) atomically.
"""

from __future__ import annotations

import json
import platform
import shlex
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from data_prep.atomic import atomic_output_dir
from data_prep.checksums import write_manifest
from data_prep.embedded import (
    DEBIAN_SUITE,
    DEBIAN_VERSION,
    HELP_DIRS,
    LANGS,
    SHIPPED_DIR,
)
from data_prep.embedded.corpus import (
    DEFAULT_FILTER,
    SPLIT_SALT,
    SplitCorpus,
    iter_documents,
    split_corpus,
)
from data_prep.embedded.debs import (
    DebInfo,
    describe_debs,
    download_debs,
    extract_deb,
    find_debs,
)
from data_prep.segment import SegmentationSpec, train_sentencepiece
from data_prep.textio import write_lines

HELP_ROOT = Path("usr/share/libreoffice/help")
COPYRIGHT = "usr/share/doc/{package}/copyright"
MPL_TEXT = Path(__file__).resolve().parent / "MPL-2.0.txt"
# Joint model on German+English train; identity normalization keeps text byte-exact, so
# decoded hypotheses compare fairly with the raw references.
SPM_SPEC = SegmentationSpec(
    kind="spm", vocab_size=8000, spm_model_type="unigram", spm_normalization="identity"
)


@dataclass(frozen=True)
class BuildOptions:
    """Options of a corpus build.

    Attributes:
        out: Where to write the corpus (default: the shipped copy in the package).
        deb_dir: Local directory holding the two ``.deb`` files; ``None`` downloads them.
        work_dir: Where to download/unpack (kept); ``None`` uses a temporary directory.
        allow_unpinned: Accept packages whose sha256 differs from the pinned ones.
        vocab_size: Sentencepiece vocabulary size.
        valid_share: Expected share of help pages in valid.
        test_share: Expected share of help pages in test.
        command: The command line, recorded in PROVENANCE.md.
    """

    out: Path = SHIPPED_DIR
    deb_dir: Path | None = None
    work_dir: Path | None = None
    allow_unpinned: bool = False
    vocab_size: int = 8000
    valid_share: float = 0.05
    test_share: float = 0.05
    command: str = "python -m data_prep.embedded build"


def write_corpus(corpus: SplitCorpus, out: Path, vocab_size: int) -> list[str]:
    """Write split text (gzipped) and the joint sentencepiece model into ``out``.

    Returns:
        The names of the files written (the ones the manifest covers).
    """
    names = []
    for split, pairs in corpus.pairs.items():
        for index, lang in enumerate(LANGS):
            name = f"{split}.{lang}.gz"
            write_lines(out / name, (pair[index] for pair in pairs))
            names.append(name)
    spec = SegmentationSpec(**{**SPM_SPEC.__dict__, "vocab_size": vocab_size})
    print(f"training joint sentencepiece model (vocab {vocab_size}) ...", flush=True)
    train_sentencepiece([out / "train.de.gz", out / "train.en.gz"], out / "spm.model", spec)
    return names + ["spm.model", "spm.vocab"]


def _license_text() -> str:
    notice = (
        "The German and English text in this directory is extracted from LibreOffice's help\n"
        f"pages as shipped in Debian {DEBIAN_SUITE} "
        f"(libreoffice-help-de / libreoffice-help-en-us {DEBIAN_VERSION}).\n"
        "Copyright 2000, 2010 Oracle and/or its affiliates; (c) 2000, 2010 LibreOffice\n"
        "contributors and/or their affiliates. It is licensed under the Mozilla Public\n"
        "License 2.0 (MPL-2.0), reproduced below; its source form is the LibreOffice help\n"
        "(https://git.libreoffice.org/help) and the Debian source package `libreoffice`.\n"
        "The sentencepiece model (spm.model, spm.vocab) is derived from that text.\n\n"
    )
    return notice + "=" * 72 + "\n\n" + MPL_TEXT.read_text(encoding="utf-8")


def _provenance(
    corpus: SplitCorpus, debs: dict[str, DebInfo], options: BuildOptions, seconds: float
) -> str:
    import sentencepiece

    rows = "\n".join(
        f"| `{d.package}` | `{d.version}` | {d.size} | `{d.sha256}` |" for d in debs.values()
    )
    counts = "\n".join(
        f"| {split} | {len(pairs)} | {len(corpus.documents[split])} |"
        for split, pairs in corpus.pairs.items()
    )
    return f"""# Provenance of `lohelp_de_en`

German-English sentence pairs aligned from LibreOffice help pages (MPL-2.0, see `LICENSE`).

## Source packages (Debian {DEBIAN_SUITE}, main, architecture `all`)

| package | version | bytes | sha256 |
| --- | --- | --- | --- |
{rows}

Pinned in `data_prep/embedded/__init__.py`; the build refuses other files unless given
`--allow-unpinned`.

## Build

```
{options.command}
```

Built on {datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")} in {seconds:.0f} s
(Python {platform.python_version()}, sentencepiece {sentencepiece.__version__}).

1. Unpack both packages (`dpkg-deb -x`) and pair every page under
   `usr/share/libreoffice/help/{{de,en-US}}/` present in both.
2. Units are `<p>`/`<h1-6>` elements with an `id`; German and English units are aligned by
   that id. Markup is stripped (inline platform switches keep their `default` variant),
   entities unescaped, whitespace collapsed.
3. Pairs are dropped if empty, identical on both sides (untranslated), longer than
   {DEFAULT_FILTER.max_words} words a side, or with a character-length ratio above \
{DEFAULT_FILTER.max_ratio} (lengths + {DEFAULT_FILTER.smoothing}).
4. Whole pages go to one split by the sha256 of `{SPLIT_SALT}:<page path>` (test: first
   {options.test_share:.0%} of the hash range, valid: next {options.valid_share:.0%}).
   Duplicates are removed within each split; valid/test pairs whose German or English side
   occurs in train (and valid pairs overlapping test) are removed. Train is shuffled (seed 1).
5. A joint sentencepiece model ({SPM_SPEC.spm_model_type}, vocabulary {options.vocab_size}, \
`identity` normalization, one thread, fixed seed) is trained on train German + English.

## Counts

| split | pairs | help pages |
| --- | --- | --- |
{counts}

```json
{json.dumps(corpus.stats, indent=2)}
```

## Files

`{{train,valid,test}}.{{de,en}}.gz`: detokenized text, one unit per line, line *i* of `.de`
translates line *i* of `.en`. `spm.model` / `spm.vocab`: the joint sentencepiece model.
`pages.json`: the help pages of each split. `stats.json`: the counts above.
`MANIFEST.sha256`: checksums of the text and model files (`sha256sum -c MANIFEST.sha256`), verified by
`python -m data_prep.embedded prepare`.
"""


def _obtain_debs(options: BuildOptions, work: Path) -> dict[str, Path]:
    if options.deb_dir is not None:
        return find_debs(options.deb_dir)
    download = work / "debs"
    download.mkdir(parents=True, exist_ok=True)
    print(f"apt-get download {DEBIAN_VERSION} into {download} ...", flush=True)
    return download_debs(download, DEBIAN_VERSION)


def build(options: BuildOptions) -> SplitCorpus:
    """Rebuild the corpus into ``options.out`` (replacing it atomically).

    Returns:
        The split corpus that was written.
    """
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="lohelp-build-") as scratch:
        work = Path(options.work_dir or scratch)
        debs = describe_debs(_obtain_debs(options, work), options.allow_unpinned)
        roots: dict[str, Path] = {}
        for lang, info in debs.items():
            print(f"unpacking {info.path.name} ...", flush=True)
            extract_deb(info.path, work / f"unpacked-{lang}")
            roots[lang] = work / f"unpacked-{lang}" / HELP_ROOT / HELP_DIRS[lang]
        documents = list(iter_documents(roots["de"], roots["en"]))
        corpus = split_corpus(documents, options.valid_share, options.test_share)
        print(json.dumps(corpus.stats["pairs"]), flush=True)
        with atomic_output_dir(options.out, replace=True) as tmp:
            names = write_corpus(corpus, tmp, options.vocab_size)
            (tmp / "LICENSE").write_text(_license_text(), encoding="utf-8")
            # Debian's machine-readable copyright file of the German package, for the record.
            debian_copyright = work / "unpacked-de" / COPYRIGHT.format(package=debs["de"].package)
            if debian_copyright.is_file():
                (tmp / "COPYRIGHT.debian").write_bytes(debian_copyright.read_bytes())
            (tmp / "stats.json").write_text(json.dumps(corpus.stats, indent=2) + "\n")
            (tmp / "pages.json").write_text(json.dumps(corpus.documents, indent=0) + "\n")
            write_manifest(tmp, names)
            provenance = _provenance(corpus, debs, options, time.monotonic() - start)
            (tmp / "PROVENANCE.md").write_text(provenance, encoding="utf-8")
    print(f"wrote {options.out}", flush=True)
    return corpus


def format_command(argv: list[str]) -> str:
    """The command line as a user would type it."""
    return "python -m data_prep.embedded " + shlex.join(argv)
