"""Step-by-step decoding equals the full pass; weight sharing equals untied copies."""

from __future__ import annotations

import pytest
import torch
from fairseq.sequence_generator import SequenceGenerator

from recurnmt.nmt.architectures import FAMILIES
from tests.nmt_helpers import DICT, batch, build, full_and_stepwise, train_signals, untied

# every family at the tiny size, so that a new family cannot skip the decoding checks ...
FAMILY_CASES = [(f"{family}_tiny",) for family in FAMILIES]
# ... plus options the families leave at their defaults
OPTION_CASES = [
    ("ringformer_tiny", "--encoder-normalize-before", "--decoder-normalize-before"),
    ("ringformer_tiny", "--attn-signal", "before", "--ffn-signal", "inter"),
    ("ringformer_tiny", "--level-signal", "full"),
    ("ringformer_tiny", "--level-signal", "static"),
    ("ringformer_tiny", "--positions", "every-level"),
    ("ringformer_tiny", "--act", "on"),
    (
        "recurrent_transformer_tiny",
        "--decoder-unique-layers",
        "2",
        "--sharing-scheme",
        "cycle_rev",
        "--decoder-layers",
        "4",
    ),
    ("owf_tiny", "--decoder-ffn-sharing", "shared"),
    ("sret_tiny", "--lrc", "identity", "--decoder-normalize-before"),
    # sliced encoder attention: contiguous slices at loop 0, permuted at loop 1 (Algorithm 1)
    ("sret_tiny", "--encoder-attn-groups", "2,2"),
    ("universal_transformer_act_tiny", "--act-threshold", "0.5"),
    # relaxed recursion: two blocks over four levels, pre-LN; and on RingFormer and the UT
    (
        "relaxed_transformer_tiny",
        "--decoder-layers",
        "4",
        "--decoder-unique-layers",
        "2",
        "--encoder-normalize-before",
        "--decoder-normalize-before",
    ),
    ("ringformer_tiny", "--level-lora-rank", "4"),
    ("universal_transformer_tiny", "--level-lora-rank", "full", "--block-bias", "off"),
]
DECODERS = FAMILY_CASES + OPTION_CASES


def _ids(case):
    return " ".join(case)


@pytest.mark.parametrize("case", DECODERS, ids=_ids)
@pytest.mark.smoke
def test_incremental_decoding_equals_full_pass(case, device):
    model, _, _ = build(*case)
    train_signals(model)
    model.to(device).eval()
    src, lengths, prev = (t.to(device) for t in batch())
    full, steps, _, _ = full_and_stepwise(model, src, lengths, prev)
    with torch.no_grad():
        enc = model.encoder(src, lengths)  # in evaluation mode, as for the passes above
        # in training (dropout is 0 here) an ACT stack may stop once every position has
        # halted; with a cache it runs every level, whose keys and values later steps read
        trained, _ = model.train().decoder(prev, enc)
    diff = (steps - full).abs().max().item()
    assert diff <= 1e-5, diff
    torch.testing.assert_close(trained, full, atol=1e-5, rtol=1e-5)


def test_act_decoders_halt_before_the_last_level():
    """The ACT cases above exercise halting, and at least one the early stop in training."""
    stopped_early = []
    for case in DECODERS:
        model, _, _ = build(*case)
        stack = model.decoder.stack
        if stack.halting is None:
            continue
        src, lengths, prev = batch()
        with torch.no_grad():
            enc = model.encoder(src, lengths)
            _, extra = model.eval().decoder(prev, enc)
            assert (extra["ponder"] < stack.num_levels).all(), case
            stopped_early.append(_levels_run(model.train().decoder, prev, enc) < stack.num_levels)
    assert any(stopped_early)


def _levels_run(decoder, prev, enc) -> int:
    """How many levels one full decoder pass runs."""
    calls = []
    handles = [b.register_forward_hook(lambda *_: calls.append(1)) for b in decoder.stack.blocks]
    decoder(prev, enc)
    for handle in handles:
        handle.remove()
    return len(calls)


def _generate(model, src, lengths, beam=4):
    gen = SequenceGenerator([model], DICT, beam_size=beam, max_len_b=12, min_len=1)
    sample = {"net_input": {"src_tokens": src, "src_lengths": lengths}}
    with torch.no_grad():
        hyps = gen.generate([model], sample)
    return [[(h["tokens"].tolist(), round(h["score"].item(), 4)) for h in sent] for sent in hyps]


@pytest.mark.parametrize("case", DECODERS, ids=_ids)
def test_beam_search_matches_untied_reference(case, device):
    model, _, _ = build(*case, "--share-all-embeddings")
    train_signals(model)
    model.to(device).eval()
    reference = untied(model)
    assert len(reference.decoder.stack.blocks) == reference.decoder.stack.num_levels
    src, lengths, _ = (t.to(device) for t in batch(seed=1, bsz=4))
    out = _generate(model, src, lengths)
    assert out == _generate(reference, src, lengths)
    assert any(len(hyp[0][0]) > 2 for hyp in out)  # really decoded several steps


@pytest.mark.parametrize("case", DECODERS, ids=_ids)
def test_beam_search_reads_the_memory_once_per_sentence(case, device, monkeypatch):
    """The hypotheses of a sentence share its projected memory (``Memory.group``); the search
    is the one with a memory per hypothesis."""
    import recurnmt.nmt.decoder as decoder_module

    model, _, _ = build(*case, "--share-all-embeddings")
    train_signals(model)
    model.to(device).eval()
    src, lengths, _ = (t.to(device) for t in batch(seed=1, bsz=4))
    groups = []
    rows_per_sentence = decoder_module.rows_per_sentence
    monkeypatch.setattr(
        decoder_module,
        "rows_per_sentence",
        lambda encoder_out: groups.append(rows_per_sentence(encoder_out)) or groups[-1],
    )
    grouped = _generate(model, src, lengths)
    assert groups == [4]  # beam 4, read once at the first step
    monkeypatch.setattr(decoder_module, "rows_per_sentence", lambda encoder_out: 1)
    per_row = _generate(model, src, lengths)
    assert [[h[0] for h in sent] for sent in grouped] == [[h[0] for h in s] for s in per_row]
    for sent, ref in zip(grouped, per_row, strict=True):
        for (_, score), (_, ref_score) in zip(sent, ref, strict=True):
            assert abs(score - ref_score) <= 1e-3


@pytest.mark.parametrize("case", DECODERS, ids=_ids)
def test_memory_per_sentence_survives_finished_sentences(case, device, monkeypatch):
    """Steps with beam search's reorders (hypotheses reshuffled within their sentence, then a
    sentence leaving the batch) give what a memory per hypothesis gives, step by step."""
    import recurnmt.nmt.decoder as decoder_module

    model, _, _ = build(*case)
    train_signals(model)
    model.to(device).eval()
    src, lengths, prev = (t.to(device) for t in batch(seed=2, bsz=3))
    beam = 2
    orders = [
        [1, 0, 3, 3, 4, 5],  # same batch: beams reshuffled within each sentence
        [5, 4, 1, 1],  # sentence 1 finished: sentences 2 and 0 stay
        [0, 1, 3, 2],
    ]

    def steps() -> list[torch.Tensor]:
        with torch.no_grad():
            enc = model.encoder(src, lengths)
            expand = torch.arange(src.size(0), device=device).repeat_interleave(beam)
            enc = model.encoder.reorder_encoder_out(enc, expand)
            tokens, state, outs = prev.repeat_interleave(beam, 0), {}, []
            for t in range(len(orders) + 1):
                outs.append(model.decoder(tokens[:, : t + 1], enc, incremental_state=state)[0])
                if t < len(orders):
                    order = torch.tensor(orders[t], device=device)
                    model.decoder.reorder_incremental_state(state, order)
                    enc = model.encoder.reorder_encoder_out(enc, order)
                    tokens = tokens.index_select(0, order)
            memory = state[next(iter(state))].memory
            return outs, {kv.group for kv in memory.values()}

    grouped, groups = steps()
    assert groups == {beam}
    monkeypatch.setattr(decoder_module, "rows_per_sentence", lambda encoder_out: 1)
    per_row, groups = steps()
    assert groups == {1}
    for a, b in zip(grouped, per_row, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_shared_parameters_are_identical_across_levels():
    model, _, _ = build("ringformer_tiny")
    for stack in (model.encoder.stack, model.decoder.stack):
        levels = stack.num_levels
        first = stack.block_of_level(0)
        for level in range(1, levels):
            block = stack.block_of_level(level)
            for (n1, p1), (n2, p2) in zip(
                first.named_parameters(), block.named_parameters(), strict=True
            ):
                assert n1 == n2 and p1 is p2
        assert stack.levels[0].attn_signal.down is not stack.levels[1].attn_signal.down
    names = [n for n, _ in model.named_parameters()]
    assert len(names) == len(set(names))


def test_training_pass_runs_with_right_padded_targets():
    model, _, _ = build("ringformer_tiny")
    src, lengths, prev = batch()
    prev[0, -2:] = DICT.pad()
    logits, _ = model(src, lengths, prev)
    assert logits.shape == (3, prev.size(1), len(DICT))
    logits.sum().backward()
    assert torch.isfinite(logits).all()


def test_alignment_weights_match_between_full_and_incremental_decoding():
    model, _, _ = build("ringformer_tiny")
    train_signals(model)
    model.eval()
    src, lengths, prev = batch()
    with torch.no_grad():
        enc = model.encoder(src, lengths)
        _, extra = model.decoder(prev, enc)
        state: dict = {}
        steps = [
            model.decoder(prev[:, : t + 1], enc, incremental_state=state)[1]["attn"][0]
            for t in range(prev.size(1))
        ]
    full = extra["attn"][0]
    assert full.shape == (3, prev.size(1), src.size(1))
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-4)
    model.train()
    assert model.decoder(prev, model.encoder(src, lengths))[1]["attn"][0] is None
