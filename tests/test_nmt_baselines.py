"""Universal Transformer (with ACT), One Wide FFN, sharing schemes and SReT as fairseq models."""

from __future__ import annotations

import pytest
import torch

from recurnmt.modules import ConfigError, shallow_branch
from recurnmt.nmt.criterion import RecurrentLabelSmoothedCrossEntropy, lrc_coefficients
from recurnmt.parameters import parameter_report
from tests.nmt_helpers import DICT, batch, build


@pytest.mark.parametrize(
    ("arch", "paper"),
    [
        ("universal_transformer_wmt_en_de", 7.34e6),  # RingFormer Table 1
        ("universal_transformer_wmt_en_de_big", 29.37e6),
        ("owf_wmt_en_de", 20.98e6),
        ("owf_wmt_en_de_big", 83.91e6),
        ("universal_transformer_act_wmt_en_de", 7.34e6),  # + one halting unit per side
    ],
)
def test_table1_baselines(arch, paper):
    assert parameter_report(build(arch)[0]).p_star == pytest.approx(paper, rel=0.01)


def test_universal_transformer_shares_one_block_and_adds_coordinates():
    model, _, _ = build("universal_transformer_tiny")
    for side in (model.encoder, model.decoder):
        assert len(side.stack.blocks) == 1 and side.positions_every_level
        assert all(parts.level_embedding is not None for parts in side.stack.levels)
    assert not model.encoder.embed.add_positions


def test_owf_shares_the_encoder_ffn_and_drops_the_decoder_ffn():
    model, _, _ = build("owf_tiny")
    ffns = {id(b.ffn) for b in model.encoder.stack.blocks}
    assert len(ffns) == 1 and len(model.encoder.stack.blocks) == 3
    assert all(b.ffn is None for b in model.decoder.stack.blocks)
    shared, _, _ = build("owf_tiny", "--decoder-ffn-sharing", "shared")
    assert len({id(b.ffn) for b in shared.decoder.stack.blocks}) == 1


@pytest.mark.parametrize(
    ("scheme", "expected"),
    [
        ("sequence", (0, 0, 1, 1, 2, 2)),
        ("cycle", (0, 1, 2, 0, 1, 2)),
        ("cycle_rev", (0, 1, 2, 2, 1, 0)),
    ],
)
def test_sharing_schemes_map_levels_by_identity(scheme, expected):
    model, _, _ = build(
        "recurrent_transformer_tiny",
        "--encoder-layers",
        "6",
        "--decoder-layers",
        "6",
        "--encoder-unique-layers",
        "3",
        "--decoder-unique-layers",
        "3",
        "--sharing-scheme",
        scheme,
    )
    for stack in (model.encoder.stack, model.decoder.stack):
        weights = [stack.block_of_level(i).self_attn.qkv_proj.weight for i in range(6)]
        unique = [stack.blocks[b].self_attn.qkv_proj.weight for b in range(3)]
        assert tuple(next(b for b in range(3) if w is unique[b]) for w in weights) == expected


def test_more_unique_layers_than_levels_fails_at_build():
    with pytest.raises(ConfigError, match="--encoder-unique-layers=4"):
        build("recurrent_transformer_tiny", "--encoder-unique-layers", "4")


def test_sret_shares_blocks_across_loops_but_not_nlls():
    model, _, _ = build("sret_tiny")
    stack = model.encoder.stack
    assert stack.plan.block_of_level == (0, 0, 1, 1)
    assert stack.block_of_level(0) is stack.block_of_level(1)
    assert stack.levels[0].nll is not stack.levels[1].nll
    assert stack.blocks[0].lrc.main is not None


def _criterion(task, **kw):
    return RecurrentLabelSmoothedCrossEntropy(task, False, 0.1, **kw)


def _sample(model):
    src, lengths, prev = batch()
    target = torch.cat([prev[:, 1:], torch.full((prev.size(0), 1), DICT.eos())], dim=1)
    return {
        "net_input": {"src_tokens": src, "src_lengths": lengths, "prev_output_tokens": prev},
        "target": target,
        "ntokens": int(target.ne(DICT.pad()).sum()),
    }


def test_ponder_cost_is_added_to_the_loss():
    model, _, task = build("universal_transformer_act_tiny")
    sample = _sample(model)
    torch.manual_seed(0)
    loss, _, log = _criterion(task, act_loss_weight=0.5)(model.eval(), sample)
    base, _, _ = _criterion(task, act_loss_weight=0.0)(model, sample)
    assert log["ponder"] > 0
    torch.testing.assert_close(loss, base + 0.5 * log["ponder"])
    loss.backward()
    assert model.encoder.stack.halting.proj.weight.grad.abs().sum() > 0


def test_act_model_refuses_a_criterion_without_ponder_cost():
    with pytest.raises(ConfigError, match="--criterion recurrent_label_smoothed_cross_entropy"):
        build("universal_transformer_act_tiny", "--criterion", "label_smoothed_cross_entropy")


def test_mixed_depth_adds_the_shallow_branch_loss():
    model, _, task = build("sret_tiny", "--mixed-depth", "on")
    sample = _sample(model)
    model.train()
    loss, _, log = _criterion(task)(model, sample)
    assert "shallow_loss" in log
    model.eval()
    deep, _, _ = _criterion(task)(model, sample)
    with shallow_branch(model):
        shallow_out = model(**sample["net_input"])
    shallow, _ = _criterion(task).compute_loss(model, shallow_out, sample)
    torch.testing.assert_close(loss, deep + shallow)


@pytest.mark.parametrize("levels", ["1", "2", "random"])
def test_mixed_depth_levels_trains_the_decoders_first_levels_as_a_draft(levels):
    """--mixed-depth-levels R: the shallow pass is the decoder's first R levels over the full
    encoder (what --draft-levels R decodes with); random draws R for every batch."""
    model, _, task = build(
        "ringformer_tiny", "--mixed-depth", "on", "--mixed-depth-levels", levels,
        "--decoder-layers", "4",
    )  # fmt: skip
    sample = _sample(model)
    model.train()
    runs = {"encoder": [], "decoder": []}
    for side in runs:
        stack = getattr(model, side).stack
        real = stack.forward

        def record(x, *, _real=real, _side=side, **kwargs):
            out = _real(x, **kwargs)
            runs[_side].append(list(getattr(model, _side).stack.active_levels))
            return out

        stack.forward = record
    drawn = set()
    for seed in range(8):
        torch.manual_seed(seed)
        loss, _, log = _criterion(task)(model, sample)
        assert "shallow_loss" in log
        deep, shallow = runs["decoder"][-2:]
        assert deep == [0, 1, 2, 3] and runs["encoder"][-1] == [0, 1, 2]  # encoder: full
        drawn.add(len(shallow))
        assert shallow == list(range(len(shallow)))
    assert drawn == ({1, 2, 3} if levels == "random" else {int(levels)})


def test_shallow_distillation_adds_the_kl_from_the_full_depth():
    """--shallow-distill W: the shallow pass's loss is (1 - W) x its label loss + W x KL(full
    depth, detached || shallow), summed over the target's tokens."""
    model, _, task = build("ringformer_tiny", "--mixed-depth", "on", "--mixed-depth-levels", "1")
    sample = _sample(model)
    model.train()
    labels_only, _, _ = _criterion(task)(model, sample)
    loss, _, log = _criterion(task, shallow_distill=0.25)(model, sample)
    deep_out = model(**sample["net_input"])
    deep, _ = _criterion(task).compute_loss(model, deep_out, sample)
    with model.shallow_pass():
        shallow_out = model(**sample["net_input"])
    shallow, _ = _criterion(task).compute_loss(model, shallow_out, sample)
    p = model.get_normalized_probs(deep_out, log_probs=True)
    q = model.get_normalized_probs(shallow_out, log_probs=True)
    kl = ((p.exp() * (p - q)).sum(-1) * sample["target"].ne(DICT.pad())).sum()
    torch.testing.assert_close(log["shallow_kl"], kl.detach())
    torch.testing.assert_close(loss, deep + 0.75 * shallow + 0.25 * kl, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(labels_only, deep + shallow, rtol=1e-5, atol=1e-4)
    with pytest.raises(ValueError, match="--shallow-distill=1.5: a weight in 0 .. 1"):
        _criterion(task, shallow_distill=1.5)


@pytest.mark.parametrize(
    "flags,message",
    [
        (("--mixed-depth-levels", "1"), "--mixed-depth-levels='1': trains the shallow pass"),
        (("--mixed-depth", "on", "--mixed-depth-levels", "3"), "levels 1 .. 2"),
        (("--mixed-depth", "on", "--mixed-depth-levels", "deep"), "first-loop, random or"),
    ],
)
def test_impossible_mixed_depth_levels_fail_naming_the_flag(flags, message):
    with pytest.raises(ConfigError, match=message):
        build("ringformer_tiny", *flags)


def test_lrc_coefficients_are_logged_in_training():
    model, _, task = build("sret_tiny")
    _, _, log = _criterion(task)(model.train(), _sample(model))
    keys = {k for k in log if k.startswith("lrc_")}
    assert "lrc_enc_b0_self_attn_main" in keys and "lrc_dec_b0_cross_attn_skip" in keys
    assert "lrc_enc_l0_nll_main" in keys
    assert all(log[k] == 1.0 for k in keys)  # initialised to 1
    assert len(lrc_coefficients(model, "all")) > len(keys)
