"""ACT's paper rule (``--act-rule paper``, issue 74 item 3; recurnmt/modules/act_rule.py):
halted positions leave the level loop, stay keys and values, and do no other work."""

from __future__ import annotations

import json

import pytest
import torch

from recurnmt.modules import StackConfig
from recurnmt.modules.act_rule import set_act_rule
from recurnmt.modules.declarations import option_keywords
from recurnmt.modules.errors import ConfigError
from recurnmt.modules.halting import HaltingUnit
from tests import test_depth_map
from tests.nmt_helpers import batch, build, full_and_stepwise
from tests.test_depth_map import SENTENCES

ARCH = "universal_transformer_act_tiny"
data = test_depth_map.data  # random sentences over the toy dictionary, found by pytest


def act_model(rule: str = "paper", *flags: str, seed: int = 1, spread: float = 1.0):
    """A tiny UT-ACT model whose halting units send positions to different depths (their
    weights drawn wide; ``spread`` 0 and a low bias: nobody halts before the last level)."""
    torch.manual_seed(seed)
    model, _, _ = build(ARCH, "--act-rule", rule, "--decoder-layers", "4",
                        "--encoder-layers", "4", *flags)  # fmt: skip
    for unit in model.modules():
        if isinstance(unit, HaltingUnit):
            torch.nn.init.normal_(unit.proj.weight, std=spread)
            torch.nn.init.constant_(unit.proj.bias, -1.0 if spread else -20.0)
    return model.eval()


def halting_probabilities(model, side: str):
    """Records the halting probabilities (B x T per level) of ``side``'s stack."""
    records: list[torch.Tensor] = []
    unit = getattr(model, side).stack.halting
    return records, unit.register_forward_hook(lambda m, i, out: records.append(out.detach()))


def running_counts(probs: list[torch.Tensor], threshold: float, pad=None) -> list[torch.Tensor]:
    """The positions running each level (B x T bool), by ACT's rule from the recorded p."""
    total = torch.zeros_like(probs[0])
    halted = torch.zeros_like(probs[0], dtype=torch.bool)
    if pad is not None:
        halted |= pad
    masks = []
    for p in probs:
        masks.append(~halted)
        total = total + p
        halted = halted | (total > threshold)
    return masks


def ffn_inputs(model, side: str) -> tuple[list[int], object]:
    """Records how many positions enter the FFN of ``side``'s blocks, per call."""
    sizes: list[int] = []
    hooks = [
        block.ffn.register_forward_hook(lambda m, i, o: sizes.append(i[0].shape[:-1].numel()))
        for block in getattr(model, side).stack.blocks
    ]
    return sizes, hooks


# ------------------------------------------------------------------------------- the option


def test_the_rule_is_declared_once_and_refused_without_act():
    assert option_keywords(StackConfig)["act_rule"] == "act_rule"
    assert StackConfig().halting.rule == "authors"
    with pytest.raises(ConfigError, match=r"^act_rule='paper': a halting rule needs ACT"):
        StackConfig().replace(act_rule="paper")
    with pytest.raises(ConfigError, match=r"^--act-rule='paper': .*--act='on'"):
        build("universal_transformer_tiny", "--act-rule", "paper")
    with pytest.raises(SystemExit):  # argparse refuses other values
        build(ARCH, "--act-rule", "both")
    model, _, _ = build(ARCH, "--act-rule", "paper")
    assert model.encoder.stack.skips_halted and model.decoder.stack.skips_halted
    assert not build(ARCH)[0].encoder.stack.skips_halted
    assert set_act_rule(model, "authors") == 2 and not model.decoder.stack.skips_halted


# ---------------------------------------------------------------------------- equivalences


def test_positions_halt_at_different_levels():
    """The models of these tests do exercise the rule (else every test would pass trivially)."""
    model = act_model()
    src, lengths, prev = batch(bsz=4, tgt_len=7)
    for side in ("encoder", "decoder"):
        probs, handle = halting_probabilities(model, side)
        with torch.no_grad():
            model.decoder(prev, model.encoder(src, lengths))
        handle.remove()
        masks = running_counts(probs, 0.99, src.eq(1) if side == "encoder" else None)
        counts = [int(m.sum()) for m in masks]
        assert counts[0] > counts[1] > counts[-1] > 0, (side, counts)


def test_stepwise_decoding_equals_the_full_pass():
    model = act_model()
    src, lengths, prev = batch(bsz=4, tgt_len=7)
    full, steps, extra, _ = full_and_stepwise(model, src, lengths, prev)
    torch.testing.assert_close(steps, full, atol=1e-5, rtol=1e-5)
    assert extra["ponder"].min() < extra["ponder"].max()  # rows halted at different levels


def test_without_early_halting_the_rules_agree():
    """Halting units that give p ~ 0 (no threshold 1 - eps <= 1 keeps p ~ 0.7 from halting
    at the second level): every position runs to the last level under both rules, which then
    give the same outputs and ponder costs (the encoder's at its real positions: padding is
    halted from the start under the paper rule)."""
    src, lengths, prev = batch()
    pad = src.eq(1)
    outs = {}
    for rule in ("authors", "paper"):
        model = act_model(rule, spread=0.0)
        with torch.no_grad():
            enc = model.encoder(src, lengths)
            dec, extra = model.decoder(prev, enc)
        outs[rule] = (enc["encoder_out"][0].transpose(0, 1)[~pad], dec, extra["ponder"])
    for a, b in zip(outs["authors"], outs["paper"], strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_compaction_equals_the_masked_pass_of_training():
    """In inference the running positions are gathered; with gradients every position runs
    and the halted ones' results are dropped: the same values."""
    model = act_model()
    src, lengths, prev = batch(bsz=4)
    pad = src.eq(1)
    with torch.no_grad():
        enc = model.encoder(src, lengths)
        dec, extra = model.decoder(prev, enc)
    with torch.enable_grad():
        enc_m = model.encoder(src, lengths)
        dec_m, extra_m = model.decoder(prev, enc_m)
    out = enc["encoder_out"][0].transpose(0, 1)
    torch.testing.assert_close(out[~pad], enc_m["encoder_out"][0].transpose(0, 1)[~pad].detach())
    torch.testing.assert_close(dec, dec_m.detach(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(enc["ponder"][0][~pad], enc_m["ponder"][0][~pad].detach())
    torch.testing.assert_close(extra["ponder"], extra_m["ponder"].detach())


def test_training_gets_gradients_through_the_rule():
    model = act_model().train()
    src, lengths, prev = batch()
    enc = model.encoder(src, lengths)
    dec, extra = model.decoder(prev, enc)
    (dec.logsumexp(-1).sum() + extra["ponder"].sum() + enc["ponder"][0].sum()).backward()
    assert model.encoder.stack.halting.proj.weight.grad.abs().sum() > 0
    assert model.decoder.stack.blocks[0].ffn.parameters().__next__().grad is not None


def test_a_sentence_decodes_alike_alone_and_in_a_batch():
    model = act_model()
    src, lengths, prev = batch(bsz=4)
    full, steps, _, _ = full_and_stepwise(model, src, lengths, prev)
    real = ~src[1].eq(1)  # row 1 is left-padded: alone it has no padding
    alone_full, alone_steps, _, _ = full_and_stepwise(
        model, src[1:2, real], lengths[1:2], prev[1:2]
    )
    torch.testing.assert_close(alone_steps, steps[1:2], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(alone_full, full[1:2], atol=1e-5, rtol=1e-5)


def _beam_hypotheses(generator_cls, model, src, lengths, beam: int = 3):
    sample = {"net_input": {"src_tokens": src, "src_lengths": lengths}}
    generator = generator_cls([model], model.decoder.dictionary, beam_size=beam, max_len_b=10)
    with torch.no_grad():
        return [
            (h[0]["tokens"].tolist(), h[0]["score"]) for h in generator.generate([model], sample)
        ]


def test_beam_search_alone_in_a_batch_and_over_static_shapes():
    """fairseq's beam search (the cache reordered between steps) gives a sentence the same
    best hypothesis in a batch as alone, and the static-shape decoder (its cache has no
    compaction: the masked pass) the same as fairseq's, in float64 (near-ties)."""
    from fairseq.sequence_generator import SequenceGenerator

    from recurnmt.nmt.static_decoding import StaticSequenceGenerator
    from tests.test_speculative import _eos_likelier

    model = act_model().double()
    _eos_likelier(model)  # sentences end at various steps
    src, lengths, _ = batch(bsz=4, seed=3)
    together = _beam_hypotheses(SequenceGenerator, model, src, lengths)
    real = ~src[1].eq(1)
    alone = _beam_hypotheses(SequenceGenerator, model, src[1:2, real], lengths[1:2])
    assert alone[0][0] == together[1][0]
    torch.testing.assert_close(alone[0][1], together[1][1])
    static = _beam_hypotheses(StaticSequenceGenerator, model, src, lengths)
    assert [h[0] for h in static] == [h[0] for h in together]


# ------------------------------------------------------------------------- the work skipped


def test_the_encoder_ffn_sees_only_the_running_positions():
    """One sentence: the FFN's positions at every level are exactly the running ones; in a
    batch each row's running positions, padded to the row with most (B' x T')."""
    model = act_model()
    src, lengths, _ = batch(bsz=3)
    for rows in (slice(0, 1), slice(0, 3)):
        probs, handle = halting_probabilities(model, "encoder")
        sizes, hooks = ffn_inputs(model, "encoder")
        with torch.no_grad():
            model.encoder(src[rows], lengths[rows])
        for h in (handle, *hooks):
            h.remove()
        masks = running_counts(probs, 0.99, src[rows].eq(1))
        busy = [m for m in masks if m.any()]
        expected = [int(m.any(1).sum()) * int(m.sum(1).max()) for m in busy]
        assert sizes == expected
        if rows == slice(0, 1):
            assert sizes == [int(m.sum()) for m in busy]
        assert sum(sizes) < src[rows].numel() * len(masks)  # work skipped


def test_decoding_ffn_rows_are_the_running_rows():
    """Step by step each row enters the FFN at the levels it runs, no more: as many row-levels
    as the full pass's running positions."""
    model = act_model()
    src, lengths, prev = batch(bsz=4, tgt_len=7)
    probs, handle = halting_probabilities(model, "decoder")
    with torch.no_grad():
        enc = model.encoder(src, lengths)
        model.decoder(prev, enc)  # the full pass: p of every position at every level
        handle.remove()
        masks = running_counts(probs, 0.99)
        sizes, hooks = ffn_inputs(model, "decoder")
        state: dict = {}
        for t in range(prev.size(1)):
            model.decoder(prev[:, : t + 1], enc, incremental_state=state)
    for h in hooks:
        h.remove()
    assert sum(sizes) == sum(int(m.sum()) for m in masks)
    assert max(sizes) <= src.size(0) and sum(sizes) < prev.numel() * len(masks)


def test_the_default_rule_runs_every_position():
    model = act_model("authors")
    src, lengths, _ = batch(bsz=1)
    sizes, hooks = ffn_inputs(model, "encoder")
    with torch.no_grad():
        model.encoder(src, lengths)
    for h in hooks:
        h.remove()
    assert set(sizes) == {src.numel()}


# ------------------------------------------------------------------- the comparison script


def test_the_script_compares_both_rules_on_a_checkpoint(data, tmp_path, capsys):
    """scripts/act_rule.py's CPU path on an untrained checkpoint (its halting units spread
    out as in :func:`act_model`)."""
    from scripts import act_rule

    model = act_model("authors")
    _, args, _ = build(ARCH, "--decoder-layers", "4", "--encoder-layers", "4")
    args.data = str(data)
    history = [{"criterion_name": "x", "optimizer_name": "x", "lr_scheduler_state": {}}]
    path = tmp_path / "ut_act.pt"
    state = {"args": args, "model": model.state_dict(), "optimizer_history": history}
    torch.save({**state, "extra_state": {"epoch": 1}}, path)
    out = tmp_path / "out"
    act_rule.main(["--checkpoint", str(path), "--data", str(data), "--batch", "4",
                   "--beam", "2", "--max-len-b", "6", "--single", "2", "--post-process", "none", "--device", "cpu",
                   "--out", str(out)])  # fmt: skip
    record = json.loads((out / "act_rule.json").read_text())
    assert record["sentences"] == SENTENCES and 0 <= record["identical_share"] <= 1
    authors, paper = record["rules"]["authors"], record["rules"]["paper"]
    assert authors["levels_decoder"] == 4  # a cache: every row runs every level
    assert paper["levels_decoder"] < 4 and paper["levels_encoder"] < authors["levels_encoder"]
    for r in (authors, paper):
        assert r["ms_per_sentence_batch"] > 0 and r["ms_per_sentence_single"] > 0
        assert 0 <= r["sacrebleu"] <= 100
    assert "| paper |" in capsys.readouterr().out
    assert (out / "act_rule.md").read_text().startswith(f"{SENTENCES} sentences, beam 2")


# ------------------------------------------------------------------------- fairseq's CLI


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory):
    """The shared tiny real corpus of the CLI tests (tests/nmt_fixtures.py)."""
    from tests import nmt_fixtures

    return nmt_fixtures._once("tiny", nmt_fixtures.build_tiny_corpus, tmp_path_factory)


@pytest.mark.e2e
def test_fairseq_trains_and_generates_with_the_paper_rule(corpus, tmp_path):
    """``fairseq-train --act-rule paper`` keeps the rule in the checkpoint, logs the ponder
    cost, and ``fairseq-generate`` (beam 3, batches of 16) translates the whole test set."""
    import re

    from tests.nmt_fixtures import SIZES
    from tests.test_cli_e2e import generate, train

    log = train(corpus, tmp_path, ARCH, 2, "--act-rule", "paper")
    assert '"ponder"' in log
    checkpoint = tmp_path / "checkpoint_last.pt"
    saved = torch.load(checkpoint, map_location="cpu", weights_only=False)
    assert saved["cfg"]["model"].act_rule == "paper"
    out = generate(corpus, checkpoint)
    assert "BLEU" in out and len(re.findall(r"^H-\d+\t", out, flags=re.M)) == SIZES["test"]


def test_the_image_models_take_the_rule_as_a_keyword():
    from tests.test_vision_models import build_small

    model = build_small("vit_mini_patch4", act=True, act_rule="paper")
    assert model.stack.skips_halted if hasattr(model, "stack") else True
    images = torch.randn(2, 3, 32, 32)
    assert model.eval()(images).shape == model.train()(images).shape
    with pytest.raises(ConfigError, match=r"^act_rule='paper': a halting rule needs ACT"):
        build_small("vit_mini_patch4", act_rule="paper")
