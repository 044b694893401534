"""``recurnmt-export-ct2`` end to end on real text: a RingFormer, a relaxed model and fairseq's
transformer trained by ``fairseq-train`` on the embedded corpus, exported by the command, give
CTranslate2 the greedy translations ``fairseq-generate --beam 1`` gives."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests import nmt_fixtures
from tests.test_cli_e2e import ENV, ROOT, generate, train

ctranslate2 = pytest.importorskip("ctranslate2")  # the [deploy] extra: in the locked .venv

data = nmt_fixtures.data  # the shared fixture, found by pytest under this name

pytestmark = pytest.mark.e2e

SIZES = [
    "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
    "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
    "--encoder-layers", "3", "--decoder-layers", "3",
    "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
    "--encoder-normalize-before", "--decoder-normalize-before", "--share-all-embeddings",
]  # fmt: skip
MODELS = {
    "transformer": [],
    "ringformer": ["--level-signal-rank", "4"],
    "relaxed_transformer": ["--encoder-unique-layers", "1", "--decoder-unique-layers", "1"],
}
MAX_LEN = 20  # generate()'s --max-len-b (and --max-len-a 0): CTranslate2's max_decoding_length


def _sources(data) -> dict[int, list[str]]:
    from recurnmt.experiments.benchmark import translation_task

    task = translation_task(data, "test")
    dataset, vocab = task.dataset("test"), task.source_dictionary
    return {i: [vocab[t] for t in dataset[i]["source"].tolist()[:-1]]  # without </s>
            for i in range(len(dataset))}  # fmt: skip


@pytest.mark.parametrize("arch", MODELS)
def test_ctranslate2_translates_as_fairseq_generate(data, tmp_path, arch):
    recipe = ["--lr", "5e-3", "--dropout", "0", "--save-interval-updates", "1000"]
    train(data, tmp_path / "ckpt", arch, 60, *SIZES, *MODELS[arch], *recipe)
    checkpoint = tmp_path / "ckpt" / "checkpoint_last.pt"
    out = tmp_path / "ct2"
    proc = subprocess.run(
        [sys.executable, "-m", "recurnmt.nmt.ct2_export", str(checkpoint), str(out),
         "--data", str(data)],
        cwd=ROOT, capture_output=True, text=True, env=ENV,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"wrote {out} (float32" in proc.stdout
    log = generate(data, checkpoint, "--beam", "1")
    want = {int(i): text for i, text in re.findall(r"^H-(\d+)\t\S+\t(.*)$", log, flags=re.M)}
    sources = _sources(data)
    assert want.keys() == sources.keys() and len(want) == nmt_fixtures.SIZES["test"]
    assert len(set(want.values())) > 1  # translations, not one string repeated
    translator = ctranslate2.Translator(str(out), intra_threads=1)
    ids = sorted(sources)
    results = translator.translate_batch(
        [sources[i] for i in ids], beam_size=1, max_decoding_length=MAX_LEN
    )
    pieces = dict(zip(ids, (r.hypotheses[0] for r in results), strict=True))
    got = {i: "".join(p).replace("\u2581", " ").strip() for i, p in pieces.items()}
    assert got == want
