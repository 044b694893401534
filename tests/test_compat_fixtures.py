"""Models saved by earlier code load in today's and compute what they computed then
(``scripts/make_compat_fixtures.py`` wrote them; issue 41: a change of names, flags or modules
must not break a user's checkpoints): every ``*_tiny`` translation architecture through
fairseq's own loader, an image model through the trainer's checkpoint, and an export to
``transformers`` through ``from_pretrained``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.script_modules import load_script

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "compat"
made = load_script("make_compat_fixtures")


def close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(actual, expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("arch", made.NMT_ARCHS)
def test_a_saved_translation_checkpoint_loads_with_fairseq_and_computes_the_same(arch):
    from fairseq import checkpoint_utils, tasks

    from recurnmt.nmt.build import toy_dictionary

    path = FIXTURES / "nmt" / f"{arch}.pt"
    saved = torch.load(path, weights_only=False)
    dictionary = toy_dictionary(made.VOCAB)
    task = tasks.get_task("translation")(saved["args"], dictionary, dictionary)
    models, _ = checkpoint_utils.load_model_ensemble([str(path)], task=task)
    close(made.nmt_logits(models[0], saved), saved["logits"])


@pytest.mark.parametrize("name", sorted(made.VISION))
def test_a_saved_image_model_rebuilds_and_computes_the_same(name):
    from recurnmt.vision.checkpoint import load_checkpoint, model_from_checkpoint

    saved = load_checkpoint(FIXTURES / "vision" / f"{name}.pt")
    model = model_from_checkpoint(saved).eval()
    with torch.no_grad():
        close(model(saved["x"]), saved["logits"])


def test_an_exported_transformers_model_loads_and_computes_the_same():
    from recurnmt.hf import RecurnmtForConditionalGeneration

    folder = FIXTURES / "hf" / made.HF_ARCH
    saved = torch.load(folder / "expected.pt", weights_only=True)
    model = RecurnmtForConditionalGeneration.from_pretrained(folder).eval()
    with torch.no_grad():
        out = model(
            input_ids=saved["src"],
            attention_mask=saved["src"].ne(1),
            decoder_input_ids=saved["prev"],
        ).logits
    close(out, saved["logits"])


def test_the_fixtures_are_what_the_script_writes_today(tmp_path):
    """Today's code writes the same models and logits (a changed default would show here
    first, before a user's checkpoint computes something else)."""
    made.write(tmp_path)
    for arch in made.NMT_ARCHS:
        old = torch.load(FIXTURES / "nmt" / f"{arch}.pt", weights_only=False)
        new = torch.load(tmp_path / "nmt" / f"{arch}.pt", weights_only=False)
        assert old["model"].keys() == new["model"].keys(), arch
        close(new["logits"], old["logits"])
