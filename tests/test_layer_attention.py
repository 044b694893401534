"""MRLA layer attention (recurnmt.modules.layer_attention) and its vision transformers."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from recurnmt.modules import shallow_branch
from recurnmt.vision import create_model
from recurnmt.vision.layers.layer_attention import (
    LayerAttention,
    MRLABase,
    MRLALight,
    eca_kernel_size,
)

GRID = (3, 4)  # a non-square token grid: N = 12 patch tokens
C, D_K = 8, 2  # 4 heads of 2 channels


def tokens(b: int = 2, prefix: int = 1, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, prefix + GRID[0] * GRID[1], C, generator=g)  # B x T x C


def randomise(module: torch.nn.Module) -> None:
    """Non-trivial norms and lambdas, so the reference checks see every factor."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5 + (1.0 if p.dim() == 1 else 0.0))


# ---------------------------------------------------------------- slow explicit reference


def ref_projections(proj, x: torch.Tensor):
    """f_Q, f_K, f_V written out: LayerNorm, GAP, a Conv1D as a loop over channels with zero
    padding, and a 3 x 3 depth-wise convolution as a sum of nine shifted grids."""
    b, n, c = x.shape
    x = F.layer_norm(x, (c,), proj.norm.weight, proj.norm.bias, proj.norm.eps)
    y = x.mean(dim=1)  # B x C

    def conv1d(weight):
        w = weight.view(-1)
        k = w.numel()
        padded = F.pad(y, (k // 2, k // 2))
        return torch.stack([(padded[:, i : i + k] * w).sum(-1) for i in range(c)], dim=-1)

    grid = x.transpose(1, 2).reshape(b, c, *GRID)
    padded = F.pad(grid, (1, 1, 1, 1))
    w = proj.value.weight.view(c, 3, 3)
    v = sum(
        padded[:, :, i : i + GRID[0], j : j + GRID[1]] * w[:, i, j, None, None]
        for i in range(3)
        for j in range(3)
    )
    v = proj.value_act(v).flatten(2).transpose(1, 2)  # B x N x C
    q = conv1d(proj.query.weight) if proj.query is not None else None
    return q, conv1d(proj.key.weight), v


def ref_light_terms(mrla: LayerAttention, xs: list[torch.Tensor]) -> list[torch.Tensor]:
    """Q^s (K^s_s)^T V^s_s of every level, head by head, with the sigmoid score."""
    terms = []
    for level, x in enumerate(xs):
        q, k, v = ref_projections(mrla.levels[level].proj, x)
        out = torch.empty_like(v)
        for h in range(C // D_K):
            sl = slice(h * D_K, (h + 1) * D_K)
            score = torch.sigmoid((q[:, sl] * k[:, sl]).sum(-1) / math.sqrt(D_K))  # B
            out[:, :, sl] = score[:, None, None] * v[:, :, sl]
        terms.append(out)
    return terms


def run_stage(mrla: LayerAttention, xs: list[torch.Tensor]) -> list[torch.Tensor]:
    """The states O^t after each level when level t's patch tokens are xs[t]."""
    states, state = [], None
    for level, x in enumerate(xs):
        if mrla.starts_stage(level):
            state = None
        _, state = mrla.levels[level](x, GRID, state)
        states.append(state)
    return states


# ---------------------------------------------------------------- the modules


def test_eca_kernel_size_rule():
    # |(log2 C + 1) / 2|_odd (ECA eq. 12): DeiT-T/S/B widths give 5, the mini models' 3
    assert [eca_kernel_size(c) for c in (16, 32, 64, 192, 384, 768, 2048)] == [3, 3, 3, 5, 5, 5, 7]


@pytest.mark.parametrize("cls", [MRLALight, MRLABase])
def test_level_shapes(cls):
    x = tokens(prefix=0)
    level = cls(C, D_K, recurrent=True)
    out, state = level(x, GRID, None)
    assert out.shape == x.shape
    out2, state2 = level(x, GRID, state)
    assert out2.shape == x.shape
    if cls is MRLABase:
        assert state2[0].shape == (2, 2, C // D_K, D_K)  # B x L x H x d keys
        assert state2[1].shape == (2, 2, 12, C // D_K, D_K)  # B x L x N x H x d values
    else:
        assert state2 is out2


def test_light_matches_eq_8_unrolled():
    """O^t = sum_l beta_l * [Q^{t-l} K^{t-l} V^{t-l}], beta_l = lambda^t ... lambda^{t-l+1}
    (MRLA eq. 8, second equality), against the module's recurrence."""
    mrla = LayerAttention(C, 4, head_dim=D_K, stages=1)
    randomise(mrla)
    xs = [tokens(prefix=0, seed=s) for s in range(4)]
    states = run_stage(mrla, xs)
    terms = ref_light_terms(mrla, xs)
    lambdas = [None] + [mrla.levels[t].lambda_o for t in range(1, 4)]
    for t in range(4):
        expected = torch.zeros_like(terms[0])
        for lag in range(t + 1):
            beta = torch.ones(C)
            for s in range(t - lag + 1, t + 1):
                beta = beta * lambdas[s]
            expected = expected + beta * terms[t - lag]
        torch.testing.assert_close(states[t], expected)


def test_base_matches_eq_6_explicit():
    """O^t_h = softmax_s(Q^t_h . K^s_h / sqrt(d_k)) V^s_h over the stage's levels s <= t."""
    mrla = LayerAttention(C, 3, variant="base", head_dim=D_K, stages=1)
    randomise(mrla)
    xs = [tokens(prefix=0, seed=s) for s in range(3)]
    outs, state = [], None
    for level, x in enumerate(xs):
        out, state = mrla.levels[level](x, GRID, state)
        outs.append(out)
    proj = [ref_projections(mrla.levels[t].proj, xs[t]) for t in range(3)]
    assert mrla.levels[0].proj.query is None  # a stage's first level attends to itself only
    torch.testing.assert_close(outs[0], proj[0][2])
    for t in (1, 2):
        q = proj[t][0]
        expected = torch.empty_like(proj[t][2])
        for h in range(C // D_K):
            sl = slice(h * D_K, (h + 1) * D_K)
            scores = torch.stack(
                [(q[:, sl] * proj[s][1][:, sl]).sum(-1) / math.sqrt(D_K) for s in range(t + 1)],
                dim=-1,
            ).softmax(-1)  # B x (t + 1)
            expected[:, :, sl] = sum(
                scores[:, s, None, None] * proj[s][2][:, :, sl] for s in range(t + 1)
            )
        torch.testing.assert_close(outs[t], expected)


@pytest.mark.parametrize("variant", ["light", "base"])
def test_state_resets_at_stage_boundaries(variant):
    mrla = LayerAttention(C, 6, variant=variant, head_dim=D_K, stages=(2, 4))
    randomise(mrla)
    assert mrla.stage_of_level == (0, 0, 1, 1, 1, 1)
    assert [mrla.starts_stage(i) for i in range(6)] == [True, False, True, False, False, False]

    def branches(xs):
        hook = mrla.start(GRID, num_prefix_tokens=0)
        return [
            hook.after_level(i, x) - x for i, x in enumerate(xs)
        ]  # the MRLA branch of each level

    xs = [tokens(prefix=0, seed=s) for s in range(6)]
    out = branches(xs)
    # level 2 starts stage 1: it retrieves nothing from levels 0-1
    torch.testing.assert_close(out[2], mrla.levels[2](xs[2], GRID, None)[0])
    # other inputs in stage 0 change stage 0 only
    changed = branches([tokens(prefix=0, seed=99), *xs[1:]])
    assert not torch.allclose(changed[1], out[1])
    for level in range(2, 6):
        torch.testing.assert_close(changed[level], out[level])
    # other inputs at level 2 reach the rest of stage 1
    changed = branches([*xs[:2], tokens(prefix=0, seed=99), *xs[3:]])
    assert all(not torch.allclose(changed[i], out[i]) for i in range(3, 6))


def test_stage_count_splits_the_levels_evenly():
    assert LayerAttention(C, 12, head_dim=D_K).stage_lengths == (4, 4, 4)  # MRLA App. B.1.1
    mrla = LayerAttention(C, 24, head_dim=D_K, stages=3)
    assert [i for i in range(24) if mrla.starts_stage(i)] == [0, 8, 16]
    first = [level.lambda_o is None for level in mrla.levels]
    assert first == [mrla.starts_stage(i) for i in range(24)]


def test_class_token_bypasses_mrla():
    mrla = LayerAttention(C, 2, head_dim=D_K, stages=1)
    x = tokens(prefix=1)
    y, state = mrla.step(0, x, GRID, None, num_prefix_tokens=1)
    torch.testing.assert_close(y[:, :1], x[:, :1])
    torch.testing.assert_close(y[:, 1:], x[:, 1:] + state)
    assert state.shape == (2, 12, C)  # the state holds patch tokens only
    # without a class token every token is a patch token
    y0, _ = mrla.step(0, x[:, 1:], GRID, None, num_prefix_tokens=0)
    torch.testing.assert_close(y0, y[:, 1:])


def test_gradients_reach_every_parameter_and_the_tokens():
    mrla = LayerAttention(C, 4, head_dim=D_K, stages=2).train()
    x = tokens().requires_grad_()
    hook = mrla.start(GRID)
    y = x
    for level in range(4):
        y = hook.after_level(level, y)
    (y * torch.randn_like(y)).sum().backward()
    assert x.grad is not None and x.grad[:, 1:].abs().sum() > 0
    missing = [n for n, p in mrla.named_parameters() if p.grad is None or not p.grad.any()]
    assert not missing


def test_drop_path_drops_whole_samples_in_training_only():
    mrla = LayerAttention(C, 1, head_dim=D_K, stages=1, drop_path=0.5)
    x = tokens(b=64)
    torch.manual_seed(0)
    y, state = mrla.train().step(0, x, GRID, None)
    branch = (y - x)[:, 1:]
    kept = branch.flatten(1).abs().sum(-1) > 0
    assert 0 < kept.sum() < 64
    torch.testing.assert_close(branch[kept], 2 * state[kept])  # rescaled by 1 / (1 - p)
    y_eval, state_eval = mrla.eval().step(0, x, GRID, None)
    torch.testing.assert_close(y_eval[:, 1:], x[:, 1:] + state_eval)


def test_invalid_settings_name_the_setting():
    with pytest.raises(ValueError, match="variant='fast'"):
        LayerAttention(C, 4, variant="fast", head_dim=D_K)
    with pytest.raises(ValueError, match="head_dim=3"):
        LayerAttention(C, 4, head_dim=3)
    with pytest.raises(ValueError, match="stages=3"):
        LayerAttention(C, 4, head_dim=D_K, stages=3)
    with pytest.raises(ValueError, match=r"stages=\(2, 3\)"):
        LayerAttention(C, 4, head_dim=D_K, stages=(2, 3))
    with pytest.raises(ValueError, match="drop_path"):
        LayerAttention(C, 4, head_dim=D_K, stages=2, drop_path=[0.1, 0.2])
    small = dict(embed_dim=32, ffn_dim=64, num_heads=2, img_size=32, patch_size=8)
    with pytest.raises(ValueError, match="mrla_head_dim"):
        create_model("vit_mini_patch4", mrla_head_dim=8, **small)
    with pytest.raises(ValueError, match="head_dim=12"):
        create_model("vit_mini_mrla_patch4", mrla_head_dim=12, **small)
    with pytest.raises(ValueError, match="stages=4"):
        create_model("vit_mini_mrla_patch4", mrla_stages=4, **small)
    with pytest.raises(ValueError, match="variant='lite'"):
        create_model("vit_mini_patch4", mrla="lite", **small)


def test_a_first_level_refuses_a_previous_state():
    level = MRLALight(C, D_K, recurrent=False)
    with pytest.raises(ValueError, match="starts a stage"):
        level(tokens(prefix=0), GRID, tokens(prefix=0))


# ---------------------------------------------------------------- vision transformers

SMALL = dict(embed_dim=32, ffn_dim=64, num_heads=2, img_size=32, patch_size=8, num_classes=5)


def test_mrla_off_leaves_the_model_unchanged():
    torch.manual_seed(0)
    plain = create_model("vit_mini_patch4", **SMALL).eval()
    torch.manual_seed(0)
    off = create_model("vit_mini_patch4", mrla=None, **SMALL).eval()
    assert off.layer_attn is None
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(off(x), plain(x), rtol=0, atol=0)


@pytest.mark.parametrize("name", ["vit_mini_patch4", "ringformer_vit_mini_patch4"])
def test_mrla_with_zero_values_equals_the_base_model(name):
    """With zero value convolutions MRLA adds nothing: the same weights give the base model."""
    model = create_model(name, mrla="light", **SMALL).eval()
    with torch.no_grad():
        for level in model.layer_attn.levels:
            level.proj.value.weight.zero_()
    base = create_model(name, **SMALL).eval()
    missing, unexpected = base.load_state_dict(model.state_dict(), strict=False)
    assert not missing and all(k.startswith("layer_attn.") for k in unexpected)
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(model(x), base(x))


def test_mrla_changes_the_output_and_pool_decides_the_last_level():
    model = create_model("vit_mini_mrla_patch4", **SMALL)
    assert len(model.layer_attn.levels) == 5  # class-token head: no MRLA after level 6
    avg = create_model("vit_mini_mrla_patch4", global_pool="avg", class_token=False, **SMALL)
    assert len(avg.layer_attn.levels) == 6
    assert avg(torch.randn(1, 3, 32, 32)).shape == (1, 5)


def test_shared_blocks_keep_per_level_mrla():
    model = create_model("ringformer_vit_mini_mrla_patch4", **SMALL)
    assert len(model.stack.blocks) == 1
    ids = {id(level) for level in model.layer_attn.levels}
    assert len(ids) == len(model.layer_attn.levels) == model.stack.num_levels - 1
    # tying the stack's block leaves MRLA as it is: the untied model computes the same
    model.eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1 and not p.any():
                p.normal_(std=0.02)  # RingFormer's zero-initialised up-projections
    untied = copy.deepcopy(model)
    untied.stack = model.stack.untied()
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(model(x), untied(x))


def test_mrla_drop_path_follows_the_levels():
    model = create_model("deit_tiny_mrla_patch16_224", **SMALL)
    assert model.layer_attn.drop_path == tuple(p.drop_path for p in model.stack.levels)
    assert model.layer_attn.drop_path[-1] == pytest.approx(0.1)


def test_recursive_mrla_runs_the_shallow_branch_and_other_grids():
    model = create_model("deit_tiny_recursive_mrla_patch16_224", **SMALL).eval()
    assert model.layer_attn.stage_lengths == (8, 8, 8)
    x = torch.randn(1, 3, 32, 32)
    with shallow_branch(model):
        assert model(x).shape == (1, 5)
    assert torch.isfinite(model(torch.randn(1, 3, 64, 48))).all()


# ---------------------------------------------------------------- SReT (a pyramid)

SRET_SMALL = dict(dims=(16, 32, 64), heads=(1, 2, 4), img_size=32, stem_dims=(8, 16), num_classes=5)


def test_sret_mrla_has_one_stage_per_pyramid_stage_and_zero_values_give_sret():
    model = create_model("sret_t_mrla", **SRET_SMALL).eval()
    assert [la.stage_lengths for la in model.layer_attn] == [(4,), (10,), (6,)]
    # average pooling reads every token: the last level keeps its MRLA
    assert [len(la.levels) for la in model.layer_attn] == [4, 10, 6]
    with torch.no_grad():
        for la in model.layer_attn:
            for level in la.levels:
                level.proj.value.weight.zero_()
    base = create_model("sret_t", **SRET_SMALL).eval()
    missing, unexpected = base.load_state_dict(model.state_dict(), strict=False)
    assert not missing and all(k.startswith("layer_attn.") for k in unexpected)
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(model(x), base(x))
    with shallow_branch(model):
        assert model(x).shape == (2, 5)  # mixed depth: the first loop only


def test_sret_mrla_head_dim_must_divide_every_width():
    with pytest.raises(ValueError, match="head_dim=16"):
        create_model("sret_s", mrla="light")  # SReT-S's 126 channels
    assert create_model("sret_s", mrla="light", mrla_head_dim=14, groups=None) is not None
