"""An Argos Translate package (``.argosmodel``) around a CTranslate2 model directory.

What Argos Translate 1.11 reads from a package (``argostranslate/package.py``: ``Package``,
``install_from_path``; ``translate.py``; ``sbd.py``): a zip archive whose one top folder is
extracted into Argos's package directory as it is, and holds

* ``metadata.json``: ``type`` (``translate``), ``from_code`` / ``from_name``, ``to_code`` /
  ``to_name`` (the languages Argos and LibreTranslate list), ``package_version`` and
  ``argos_version``;
* ``model/``: the CTranslate2 model directory, which Argos decodes with beam 4
  (``ARGOS_BEAM_SIZE``), length penalty 0.2 and ``replace_unknowns``;
* ``sentencepiece.model``: the pieces the model reads (Argos's other tokenizer, ``bpe.model``,
  is Moses + BPE);
* ``minisbd/<from_code>.onnx``: the sentence splitter. Argos's default splitter, MiniSBD,
  downloads its model of the language on first use unless the package carries one here; a
  package from this module carries :mod:`recurnmt.nmt.sentence_splitter`'s rule-based one (or
  a given MiniSBD model), so it translates on a machine without a network.

A model whose data is segmented into BiBERT's word pieces (``tokenizer/vocab.txt``) is refused:
Argos tokenizes with sentencepiece or BPE only.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from recurnmt.nmt import sentence_splitter

ARGOS_VERSION = "1.11"  # the Argos Translate release these packages are written for and tested on
SUFFIX = ".argosmodel"


@dataclass(frozen=True)
class ArgosOptions:
    """What ``recurnmt-export-ct2 --argos`` writes: the package file, its languages (``None``:
    the model's task's), their names, its version and a MiniSBD model to carry."""

    out: Path
    from_code: str | None = None
    to_code: str | None = None
    from_name: str | None = None
    to_name: str | None = None
    package_version: str = "1.0"
    splitter: Path | None = None

    def check(self) -> None:
        """Raises ``ValueError`` on a package name or splitter file that cannot work."""
        if self.out.suffix != SUFFIX:
            raise ValueError(f"--argos {self.out}: an Argos Translate package is NAME{SUFFIX}")
        if self.splitter is not None and (
            self.splitter.suffix != ".onnx" or not self.splitter.is_file()
        ):
            raise ValueError(f"--splitter {self.splitter}: no MiniSBD model file (NAME.onnx)")


def sentencepiece_model(data: Path) -> Path:
    """The sentencepiece model of the binarized data ``data`` (``data_prep`` writes
    ``spm.model`` beside the dictionaries).

    Raises:
        ValueError: word-piece (BiBERT) data, or data without a sentencepiece model.
    """
    spm = data / "spm.model"
    if spm.is_file():
        return spm
    if (data / "tokenizer" / "vocab.txt").is_file():
        raise ValueError(
            f"{data} is segmented into BiBERT word pieces (tokenizer/vocab.txt), which Argos "
            "Translate cannot tokenize: it reads sentencepiece.model or bpe.model only"
        )
    raise ValueError(f"{data} has no spm.model: an Argos package needs the model's sentencepiece")


def metadata(
    from_code: str,
    to_code: str,
    *,
    from_name: str | None = None,
    to_name: str | None = None,
    package_version: str = "1.0",
) -> dict[str, str]:
    """``metadata.json`` as Argos reads it (``IPackage.load_metadata_from_json``)."""
    return {
        "type": "translate",
        "package_version": package_version,
        "argos_version": ARGOS_VERSION,
        "from_code": from_code,
        "from_name": from_name or from_code,
        "to_code": to_code,
        "to_name": to_name or to_code,
    }


def write(
    out: Path,
    ct2_dir: Path,
    spm: Path,
    meta: dict[str, str],
    *,
    splitter: Path | None = None,
    readme: str = "",
) -> Path:
    """Writes the package ``out`` (``NAME.argosmodel``, its top folder ``NAME``) from the
    CTranslate2 directory ``ct2_dir``, the sentencepiece model ``spm`` and ``meta``
    (:func:`metadata`); ``splitter``: a MiniSBD ``.onnx`` model to carry in place of the
    rule-based one.

    Raises:
        ValueError: ``out`` does not end in ``.argosmodel``, or ``splitter`` is no ``.onnx``.
    """
    ArgosOptions(out, splitter=splitter).check()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / out.stem
        shutil.copytree(ct2_dir, root / "model")
        shutil.copy(spm, root / "sentencepiece.model")
        onnx = root / "minisbd" / f"{meta['from_code']}.onnx"
        if splitter is not None:
            onnx.parent.mkdir()
            shutil.copy(splitter, onnx)
        else:
            sentence_splitter.write(onnx, meta["from_code"])
        (root / "metadata.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        if readme:
            (root / "README.md").write_text(readme, encoding="utf-8")
        out.parent.mkdir(parents=True, exist_ok=True)
        part = out.with_name(f".{out.name}.part")
        with zipfile.ZipFile(part, "w", zipfile.ZIP_DEFLATED) as archive:
            for path in sorted(p for p in root.rglob("*") if p.is_file()):
                archive.write(path, path.relative_to(root.parent).as_posix())
        part.replace(out)
    return out
