"""Elastic depth: a trained shared stack run at another number of levels."""

from __future__ import annotations

import pytest
import torch

from recurnmt.modules import ConfigError, SignalConfig, StackConfig, build_stack, shallow_branch
from recurnmt.nmt.build import build_model
from tests.nmt_helpers import DICT, batch, full_and_stepwise, train_signals

BASE = StackConfig.from_options(embed_dim=16, ffn_dim=32, num_heads=2, num_levels=4, dropout=0.0)
UT = BASE.replace(num_unique=1, signal=SignalConfig(kind="static"))
RING = BASE.replace(num_unique=1, norms_per_level=True, signal=SignalConfig(kind="lowrank", rank=2))
SRET = BASE.replace(num_unique=2, sharing="sequence", nll_ratio=1.0, lrc="both")


def test_fewer_levels_run_the_first_ones():
    stack = build_stack(RING).eval()
    x = torch.randn(2, 3, 16)
    shallow = stack(x, levels=[0, 1]).output
    stack.set_depth(2)
    torch.testing.assert_close(stack(x).output, shallow)
    stack.set_depth(None)
    torch.testing.assert_close(stack(x).output, stack(x, levels=range(4)).output)


@pytest.mark.parametrize("scale", [1.0, 0.25])
def test_ut_runs_deeper_than_it_was_built_with_sinusoidal_level_embeddings(scale):
    cfg = UT.replace(coordinate_scale=scale)
    stack = build_stack(cfg).eval()
    state = {k: v.clone() for k, v in stack.state_dict().items()}
    stack.set_depth(7)
    assert stack.num_levels == 7 and stack.state_dict().keys() == state.keys()
    deep = build_stack(cfg.replace(num_levels=7)).eval()
    deep.load_state_dict(state)  # the same shared block, built for 7 levels
    x = torch.randn(2, 3, 16)
    torch.testing.assert_close(stack(x).output, deep(x).output)


def test_sret_loops_each_block_fewer_times():
    stack = build_stack(SRET)
    assert stack.plan.depth_levels(2) == [0, 2]  # the shallow branch (SReT appendix B)
    assert stack.plan.depth_levels(4) == [0, 1, 2, 3]
    with pytest.raises(ConfigError, match=r"levels=3: .*choose one of \[2, 4\]"):
        stack.plan.depth_levels(3)


@pytest.mark.parametrize(
    ("cfg", "depth", "message"),
    [
        (RING, 5, r"levels=5: .*learned .* choose levels <= 4"),
        (SRET, 6, r"levels=6: .*choose one of \[2, 4\]"),
        (BASE, 3, r"levels=3: a stack of 4 unshared blocks runs at its own depth only"),
        (BASE.replace(num_unique=2, sharing="cycle"), 2, r"levels=2: .*own depth only"),
        (UT, 0, r"levels=0: must be a positive integer"),
    ],
)
def test_undefined_depths_are_refused_naming_the_setting(cfg, depth, message):
    with pytest.raises(ConfigError, match=message):
        build_stack(cfg).set_depth(depth)


@pytest.mark.parametrize(
    ("arch", "levels"),
    [("universal_transformer_tiny", 5), ("ringformer_tiny", 2), ("sret_tiny", 2)],
)
def test_nmt_models_decode_step_by_step_at_another_depth(arch, levels):
    flags = ["--encoder-levels", str(levels), "--decoder-levels", str(levels)]
    model, _, _ = build_model(arch, ["--dropout", "0", *flags], DICT)
    train_signals(model)
    model.eval()
    full, steps, extra, state = full_and_stepwise(model, *batch())
    torch.testing.assert_close(steps, full, atol=1e-5, rtol=1e-4)
    assert extra["attn"][0] is not None  # the alignment of the last level run
    assert len(state) == 1
    (cache,) = state.values()
    assert len(cache.levels) == len(model.decoder.stack.run_levels)


def test_nmt_flag_names_the_impossible_depth():
    with pytest.raises(ConfigError, match=r"--decoder-levels=9: .*learned"):
        build_model("ringformer_tiny", ["--decoder-levels", "9"], DICT)


def test_vision_models_run_at_another_depth():
    from recurnmt.vision import create_model

    small = dict(num_classes=5, img_size=32)
    x = torch.randn(2, 3, 32, 32)
    sret = create_model("sret_mini", **small).eval()  # 3 blocks x 2 loops
    full = sret(x)
    with shallow_branch(sret):
        shallow = sret(x)
    sret.set_depth(3)
    torch.testing.assert_close(sret(x), shallow)
    sret.set_depth(None)
    torch.testing.assert_close(sret(x), full)
    with pytest.raises(ConfigError, match=r"levels=4: .*one of \[3, 6\]"):
        sret.set_depth(4)
    mrla = create_model("ringformer_vit_mini_mrla_patch4", **small)
    mrla.set_depth(3)
    assert mrla(x).shape == (2, 5)
    mixer = create_model("recursive_mixer_mini", **small).eval()
    mixer.set_depth(3)
    with shallow_branch(mixer):
        shallow = mixer(x)
    torch.testing.assert_close(mixer(x), shallow)
    uit_mrla = create_model("uit_mini_patch4", mrla="light", global_pool="avg", class_token=False)
    with pytest.raises(ConfigError, match=r"levels=8: MRLA exists for the 6 levels"):
        uit_mrla.set_depth(8)
