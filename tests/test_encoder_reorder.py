"""Beam search's reorders of the encoder output: exact, and free while sentences keep their rows."""

from __future__ import annotations

import torch

from recurnmt.nmt.encoder import SENTENCE
from tests.nmt_helpers import batch, build

BEAM = 2


def expanded():
    """A ringformer's encoder, its output for 3 sentences, and that output expanded to 2 beams."""
    model = build("ringformer_tiny")[0].eval()
    src, lengths, _ = batch()
    with torch.no_grad():
        out = model.encoder(src, lengths)
    rows = torch.arange(3).repeat_interleave(BEAM)  # fairseq's expansion: 0 0 1 1 2 2
    return model.encoder, out, model.encoder.reorder_encoder_out(out, rows), rows


def reference(out, order):
    """Every tensor of ``out`` with its batch rows selected by ``order``."""
    dims = {"encoder_out": 1, "encoder_states": 1}
    return {k: [t.index_select(dims.get(k, 0), order) for t in v] for k, v in out.items()}


def assert_same(a, b):
    assert a.keys() == b.keys()
    for key in a:
        for x, y in zip(a[key], b[key], strict=True):
            torch.testing.assert_close(x, y, rtol=0, atol=0)


def test_expansion_selects_rows_and_records_their_sentences():
    _, out, grown, rows = expanded()
    assert_same(grown, reference(out, rows))
    assert grown[SENTENCE][0].tolist() == [0, 0, 1, 1, 2, 2]


def test_reshuffling_beams_within_sentences_copies_nothing():
    encoder, _, grown, _ = expanded()
    within = torch.tensor([1, 1, 2, 3, 5, 4])  # every row from a row of its own sentence
    assert encoder.reorder_encoder_out(grown, within) is grown
    assert_same(grown, reference(grown, within))  # and that is exactly the reordered output


def test_a_reorder_across_sentences_moves_the_rows():
    encoder, _, grown, _ = expanded()
    across = torch.tensor([2, 3, 0, 1, 4, 5])  # sentences 0 and 1 swap places
    moved = encoder.reorder_encoder_out(grown, across)
    assert_same(moved, reference(grown, across))
    assert moved[SENTENCE][0].tolist() == [1, 1, 0, 0, 2, 2]


def test_a_finished_sentence_leaves_and_later_reshuffles_stay_free():
    encoder, _, grown, _ = expanded()
    kept = torch.tensor([0, 1, 4, 5])  # sentence 1 finished
    shrunk = encoder.reorder_encoder_out(grown, kept)
    assert_same(shrunk, reference(grown, kept))
    assert encoder.reorder_encoder_out(shrunk, torch.tensor([1, 0, 3, 3])) is shrunk
