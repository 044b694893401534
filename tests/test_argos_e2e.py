"""An Argos Translate package end to end: a RingFormer trained by ``fairseq-train`` on the
embedded corpus, exported by ``recurnmt-export-ct2 --argos``, installed with Argos Translate's
own ``package.install_from_path`` into a temporary package folder and run through
``argostranslate.translate`` in ``.venv-argos`` (``scripts/argos_env.py``, built here when
missing), with no network: the translations are CTranslate2's own of the package's model at
Argos's decoding settings, and their sacreBLEU is ``fairseq-generate``'s at the same settings
within 0.5.

Where ``.venv-argos`` cannot be built (no package index), the test is skipped with the one-line
reason.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from scripts import argos_env
from tests import nmt_fixtures
from tests.test_cli_e2e import ENV, ROOT, generate, train
from tests.test_ct2_export_e2e import MODELS, SIZES

ctranslate2 = pytest.importorskip("ctranslate2")  # the [deploy] extra: in the locked .venv

data = nmt_fixtures.data  # the shared fixture, found by pytest under this name

pytestmark = pytest.mark.e2e

DRIVER = Path(__file__).with_name("argos_driver.py")
# Argos Translate 1.11's decoding (argostranslate/translate.py, apply_packaged_translation, and
# settings.py's defaults): every paragraph's sentences in one call
ARGOS_DECODING = {
    "beam_size": 4, "num_hypotheses": 1, "length_penalty": 0.2, "replace_unknowns": True,
    "max_batch_size": 32, "batch_type": "tokens", "return_scores": True,
}  # fmt: skip
# fairseq-generate at those settings (its length penalty divides by length ** 0.2 too);
# max-len-b 256: CTranslate2's default max_decoding_length
FAIRSEQ_DECODING = ("--beam", "4", "--lenpen", "0.2", "--max-len-a", "0", "--max-len-b", "256")
UPDATES = 300
# any download (Argos's splitter models, stanza's resources) fails at once
NO_NETWORK = {"http_proxy": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9"}


@pytest.fixture(scope="module")
def argos_python() -> Path:
    try:
        return argos_env.build()
    except argos_env.Unavailable as err:
        pytest.skip(f"Argos Translate's environment not built, its test not run: {err}")


def _test_lines(lang: str) -> list[str]:
    """The raw test sentences the ``data`` fixture binarized (its first lines)."""
    from data_prep.embedded import SHIPPED_DIR

    with gzip.open(SHIPPED_DIR / f"test.{lang}.gz", "rt", encoding="utf-8") as f:
        return [next(f).rstrip("\n") for _ in range(nmt_fixtures.SIZES["test"])]


def _ct2_reference(model_dir: Path, spm_model: Path, sentences: list[list[str]]) -> list[str]:
    """CTranslate2's own translation of each line, given as the sentences Argos split it into:
    the pieces of each line's sentences decoded in one call at Argos's settings, the pieces
    joined and decoded by the sentencepiece model (Argos also writes an underscore as a space,
    and drops the leading space)."""
    import sentencepiece

    spm = sentencepiece.SentencePieceProcessor(model_file=str(spm_model))
    translator = ctranslate2.Translator(str(model_dir), compute_type="auto", intra_threads=1)
    print(f"CTranslate2 {ctranslate2.__version__}, compute type {translator.compute_type}")
    out = []
    for line in sentences:
        results = translator.translate_batch(
            [spm.encode(s, out_type=str) for s in line], **ARGOS_DECODING
        )
        pieces = [p for r in results for p in r.hypotheses[0]]
        text = spm.decode_pieces(pieces).replace("\u2581", " ").replace("_", " ")
        out.append(text[1:] if text.startswith(" ") else text)
    return out


def _bleu(hypotheses: list[str], references: list[str]) -> float:
    import sacrebleu

    return round(sacrebleu.corpus_bleu(hypotheses, [references]).score, 2)


def test_an_argos_package_translates_as_ctranslate2_and_fairseq(data, tmp_path, argos_python):
    recipe = ["--lr", "5e-3", "--dropout", "0", "--save-interval-updates", "1000"]
    train(data, tmp_path / "ckpt", "ringformer", UPDATES, *SIZES, *MODELS["ringformer"], *recipe)
    checkpoint = tmp_path / "ckpt" / "checkpoint_last.pt"
    package = tmp_path / "translate-de_en-1_0.argosmodel"
    proc = subprocess.run(
        [sys.executable, "-m", "recurnmt.nmt.ct2_export", str(checkpoint), str(tmp_path / "ct2"),
         "--data", str(data), "--argos", str(package), "--from-name", "German",
         "--to-name", "English"],
        cwd=ROOT, capture_output=True, text=True, env=ENV,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"wrote {package} (Argos Translate package" in proc.stdout
    with zipfile.ZipFile(package) as archive:
        names = set(archive.namelist())
        meta = json.loads(archive.read("translate-de_en-1_0/metadata.json"))
    assert {n.split("/")[0] for n in names} == {"translate-de_en-1_0"}  # one top folder
    top = "translate-de_en-1_0/"
    assert {f"{top}model/model.bin", f"{top}sentencepiece.model", f"{top}minisbd/de.onnx"} <= names
    assert meta["from_code"] == "de" and meta["to_code"] == "en" and meta["type"] == "translate"

    lines = _test_lines("de")
    argos_home = tmp_path / "argos"
    env = {**os.environ, **argos_env.argos_settings(argos_home), **NO_NETWORK}
    env.pop("PYTHONPATH", None)  # Argos's environment, not this checkout
    request = {"package": str(package), "from": "de", "to": "en", "lines": lines}
    run = subprocess.run(
        [str(argos_python), str(DRIVER)], input=json.dumps(request), capture_output=True,
        text=True, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    argos = json.loads(run.stdout)
    assert argos["installed"] == ["translate-de_en-1_0"]
    assert Path(argos["packages_dir"]) == argos_home / "packages"  # not the user's home
    # the package's own splitter, not one MiniSBD downloads
    assert argos["splitter"] == "MiniSBDSentencizer"
    assert argos["splitter_model"] == str(argos_home / "packages" / top / "minisbd" / "de.onnx")
    sentences = argos["sentences"]
    # the line's text, cut at sentence ends
    assert ["".join(s).replace(" ", "") for s in sentences] == [x.replace(" ", "") for x in lines]
    assert sum(len(s) > 1 for s in sentences) >= 3  # the corpus's multi-sentence lines split
    got = argos["translations"]
    assert len(set(got)) > 1  # translations, not one string repeated

    model_dir = argos_home / "packages" / top / "model"
    want = _ct2_reference(model_dir, argos_home / "packages" / top / "sentencepiece.model",
                          sentences)  # fmt: skip
    assert got == want

    log = generate(data, checkpoint, *FAIRSEQ_DECODING)
    fairseq = {int(i): t for i, t in re.findall(r"^H-(\d+)\t\S+\t(.*)$", log, flags=re.M)}
    refs = {int(i): t for i, t in re.findall(r"^T-(\d+)\t(.*)$", log, flags=re.M)}
    assert sorted(fairseq) == list(range(len(lines)))
    ids = sorted(fairseq)
    references = [refs[i] for i in ids]
    argos_bleu = _bleu([got[i] for i in ids], references)
    fairseq_bleu = _bleu([fairseq[i] for i in ids], references)
    print(f"sacreBLEU, {len(ids)} test lines: Argos {argos_bleu}, fairseq-generate {fairseq_bleu}")
    assert abs(argos_bleu - fairseq_bleu) <= 0.5, (argos_bleu, fairseq_bleu)
