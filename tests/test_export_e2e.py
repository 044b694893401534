"""Export of fairseq-trained checkpoints of every family, through the command line.

Each family trains a few updates with fairseq-train on the tiny slice of the embedded corpus,
``python -m recurnmt.export`` writes the transformers directory, and the model loaded with
``AutoModelForSeq2SeqLM`` must give fairseq's logits on the test set (max difference 1e-5)
and fairseq's beam search output (``SequenceGenerator``, the generator of
``fairseq-generate --beam 4``); its tokenizer must give the binarized ids, and
``pipeline("translation")`` fairseq's detokenized translation.
"""

from __future__ import annotations

import pytest
import torch

from tests import nmt_fixtures
from tests.test_cli_e2e import train

data = nmt_fixtures.data  # the shared fixture, found by pytest under this name

pytestmark = pytest.mark.e2e

FAMILY_ARCHS = [
    "ringformer_tiny",
    "universal_transformer_tiny",
    "universal_transformer_act_tiny",
    "recurrent_transformer_tiny",
    "owf_tiny",
    "sret_tiny",
]
MAX_LEN_B = 20


def _fairseq(checkpoint, data):
    from fairseq import checkpoint_utils

    import recurnmt.nmt  # noqa: F401

    models, _, task = checkpoint_utils.load_model_ensemble_and_task(
        [str(checkpoint)], arg_overrides={"data": str(data)}
    )
    task.load_dataset("test")
    dataset = task.dataset("test")
    batch = dataset.collater([dataset[i] for i in range(len(dataset))])
    return models[0].eval(), task, batch


@pytest.mark.parametrize("arch", FAMILY_ARCHS)
def test_exported_checkpoint_equals_fairseq(arch, data, tmp_path):
    from fairseq.sequence_generator import SequenceGenerator
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    import recurnmt.hf  # noqa: F401
    from recurnmt import export

    train(data, tmp_path / "ckpt", arch, 12)
    checkpoint = tmp_path / "ckpt" / "checkpoint_last.pt"
    out = tmp_path / "hf"
    export.main([str(checkpoint), str(out), "--data", str(data), "--max-len-b", str(MAX_LEN_B)])
    model, task, batch = _fairseq(checkpoint, data)
    hf = AutoModelForSeq2SeqLM.from_pretrained(out).eval()
    net = batch["net_input"]
    src, pad = net["src_tokens"], task.target_dictionary.pad()
    with torch.no_grad():
        theirs, _ = model(**net)
        ours = hf(input_ids=src, decoder_input_ids=net["prev_output_tokens"]).logits
        assert (ours - theirs).abs().max() <= 1e-5

        generator = SequenceGenerator(
            [model], task.target_dictionary, beam_size=4, max_len_b=MAX_LEN_B
        )
        fairseq_out = generator.generate([model], batch)
        generated = hf.generate(input_ids=src, attention_mask=src.ne(pad).long(), num_beams=4)
    matches = [
        [t for t in generated[i, 1:].tolist() if t != pad] == hyps[0]["tokens"].tolist()
        for i, hyps in enumerate(fairseq_out)
    ]
    assert all(matches), f"{sum(matches)} of {len(matches)} beam outputs equal"

    if arch != "ringformer_tiny":
        return
    tokenizer = AutoTokenizer.from_pretrained(out)
    raw = (data / "test.raw.de").read_text(encoding="utf-8").splitlines()
    for i, sample_id in enumerate(batch["id"].tolist()):
        ids = [t for t in src[i].tolist() if t != pad]
        assert tokenizer(raw[sample_id])["input_ids"] == ids
    from transformers import pipeline

    translate = pipeline("translation", model=str(out))
    first = batch["id"].tolist().index(0)
    expected = task.target_dictionary.string(fairseq_out[first][0]["tokens"], "sentencepiece")
    assert translate(raw[0])[0]["translation_text"] == expected
