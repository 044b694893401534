"""SReT pieces: LRC (eq. 9-10), NLL (eq. 5), sliced group self-attention (sec. 4)."""

from __future__ import annotations

import pytest
import torch

from recurnmt.modules import (
    AttentionTerms,
    ConfigError,
    LevelOutputs,
    SelfAttention,
    SlicedGroups,
    StackConfig,
    build_stack,
)
from recurnmt.modules.nll import NonLinearProjection
from recurnmt.modules.residual import ResidualCoefficients
from recurnmt.modules.sliced_attention import group_permutation, sliced_group_attention

SRET = StackConfig.from_options(
    embed_dim=32,
    ffn_dim=64,
    num_heads=4,
    num_levels=4,
    num_unique=2,
    sharing="sequence",
    lrc="both",
    nll_ratio=1.0,
    attn_groups=(3, 1),
    normalize_before=True,
    dropout=0.0,
)


@pytest.mark.parametrize(
    ("mode", "names"),
    [("both", {"main", "skip"}), ("identity", {"skip"}), ("main", {"main"}), ("none", set())],
)
def test_lrc_designs_of_appendix_i(mode, names):
    lrc = ResidualCoefficients(2, mode)
    assert {n for n, _ in lrc.named_parameters()} == names
    assert all(torch.equal(p, torch.ones(2)) for p in lrc.parameters())  # initialised to 1


def test_lrc_weights_each_branch():
    lrc = ResidualCoefficients(2, "both")
    with torch.no_grad():
        lrc.main.copy_(torch.tensor([2.0, 3.0]))
        lrc.skip.copy_(torch.tensor([5.0, 7.0]))
    skip, main = torch.randn(4), torch.randn(4)
    torch.testing.assert_close(lrc(skip, main, 1), 3.0 * main + 7.0 * skip)


@pytest.mark.parametrize("pre", [True, False])
def test_lrc_off_is_exactly_the_plain_residual(pre):
    cfg = SRET.replace(lrc="none", nll_ratio=0.0, attn_groups=(), normalize_before=pre)
    with_lrc = build_stack(cfg.replace(lrc="both")).eval()
    plain = build_stack(cfg).eval()
    plain.load_state_dict(with_lrc.state_dict(), strict=False)
    x = torch.randn(2, 5, 32)
    assert torch.equal(with_lrc(x).output, plain(x).output)  # coefficients at 1 change nothing
    assert not any("lrc" in n for n, _ in plain.named_parameters())


def test_nll_is_mlp_of_layernorm_plus_identity():
    nll = NonLinearProjection(16, ratio=2.0, lrc="none")
    assert nll.mlp.up.out_features == 32
    z = torch.randn(3, 16)
    torch.testing.assert_close(nll(z), nll.mlp(nll.norm(z)) + z)


def test_blocks_shared_across_loops_and_nlls_are_not():
    stack = build_stack(SRET)
    assert stack.plan.block_of_level == (0, 0, 1, 1)  # internal loop, R = 2
    assert stack.block_of_level(0) is stack.block_of_level(1)
    assert stack.block_of_level(0) is not stack.block_of_level(2)
    nlls = [parts.nll for parts in stack.levels]
    assert all(n is not None for n in nlls)
    ids = {id(p) for n in nlls for p in n.parameters()}
    assert len(ids) == sum(1 for n in nlls for _ in n.parameters())  # four separate NLLs
    # loop 0 of each block is sliced (contiguously, Algorithm 1), loop 1 is global
    assert [p.slicing for p in stack.levels] == [
        SlicedGroups(3, permute=False, seed=0),
        None,
        SlicedGroups(3, permute=False, seed=2),
        None,
    ]


def test_external_loop_cycles_all_blocks():
    stack = build_stack(SRET.replace(sharing="cycle"))
    assert stack.plan.block_of_level == (0, 1, 0, 1)


def _qkv(b=2, h=2, t=7, d=4):
    return torch.randn(b, h, t, d), torch.randn(b, h, t, d), torch.randn(b, h, t, d)


def test_one_group_equals_ordinary_attention_exactly():
    attn = SelfAttention(16, 4).eval()
    x = torch.randn(2, 9, 16)
    pad = torch.zeros(2, 9, dtype=torch.bool)
    pad[0, 6:] = True
    one = AttentionTerms(slicing=SlicedGroups(1))
    assert torch.equal(attn(x, key_padding_mask=pad, terms=one), attn(x, key_padding_mask=pad))


@pytest.mark.parametrize("t", [7, 8, 2])  # not divisible by 3, divisible... and shorter than G
def test_groups_attend_within_their_slice_only(t):
    q, k, v = _qkv(t=t)
    perm = torch.randperm(t)
    out = sliced_group_attention(q, k, v, 3, perm)
    size = -(-t // 3)
    group = torch.empty(t, dtype=torch.long)
    group[perm] = torch.arange(t) // size  # slice of each original position
    same = group[:, None] == group[None, :]
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=same)
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-5)


def test_padding_never_leaks_into_real_tokens():
    attn = SelfAttention(16, 4).eval()
    x = torch.randn(2, 10, 16)
    pad = torch.zeros(2, 10, dtype=torch.bool)
    pad[0, :4] = True  # left padding, as fairseq pads sources
    y1 = attn(x, key_padding_mask=pad, terms=AttentionTerms(slicing=SlicedGroups(4)))
    x2 = x.clone()
    x2[0, :4] = 1e3 * torch.randn(4, 16)
    y2 = attn(x2, key_padding_mask=pad, terms=AttentionTerms(slicing=SlicedGroups(4)))
    torch.testing.assert_close(y1[0, 4:], y2[0, 4:])
    assert torch.isfinite(y2).all()


def test_evaluation_is_deterministic_and_training_is_not():
    stack = build_stack(SRET.replace(attn_groups=(3, 2))).eval()  # loop 1 permutes
    x = torch.randn(2, 11, 32)
    assert torch.equal(stack(x).output, stack(x).output)
    again = build_stack(SRET.replace(attn_groups=(3, 2))).eval()
    again.load_state_dict(stack.state_dict())
    assert torch.equal(stack(x).output, again(x).output)  # a fresh model: the same function
    assert torch.equal(
        group_permutation(11, False, x.device, seed=3),
        group_permutation(11, False, x.device, seed=3),
    )
    stack.train()
    torch.manual_seed(1)
    first = stack(x).output
    assert not torch.equal(first, stack(x).output)


def test_an_evaluation_permutation_first_made_under_inference_mode_serves_autograd_later():
    stack = build_stack(SRET.replace(attn_groups=(3, 2))).eval()
    x = torch.randn(2, 13, 32)  # a length no other test caches
    with torch.inference_mode():
        first = stack(x).output
    out = stack(x.requires_grad_()).output  # the cached permutation, now saved for backward
    out.sum().backward()
    assert torch.equal(first, out.detach()) and x.grad is not None


def test_sliced_attention_is_refused_for_causal_decoders():
    with pytest.raises(ConfigError, match="encoder self-attention only"):
        SRET.replace(cross_attention=True)
    with pytest.raises(ConfigError, match="encoder self-attention only"):
        SRET.replace(causal=True)
    with pytest.raises(ValueError, match="non-causal"):
        SelfAttention(8, 2, causal=True)(
            torch.randn(1, 4, 8), terms=AttentionTerms(slicing=SlicedGroups(2))
        )


def test_too_few_group_entries_for_the_loops():
    with pytest.raises(ConfigError, match="attn_groups"):
        build_stack(SRET.replace(attn_groups=(2,)))


def test_untied_copy_keeps_groups_and_function():
    stack = build_stack(SRET).eval()
    untied = stack.untied().eval()
    assert [p.slicing for p in untied.levels] == [p.slicing for p in stack.levels]
    assert stack.levels[0].slicing == SlicedGroups(3, False) and stack.levels[1].slicing is None
    x = torch.randn(2, 7, 32)
    torch.testing.assert_close(stack(x).output, untied(x).output)


def test_shallow_branch_runs_each_block_once():
    stack = build_stack(SRET).eval()
    assert stack.plan.first_loop_levels() == [0, 2]
    states = LevelOutputs()
    stack(torch.randn(1, 3, 32), levels=[0, 2], hooks=[states])
    assert len(states.outputs) == 2


def test_unpermuted_slices_are_contiguous_runs():
    attn = SelfAttention(16, 4).eval()
    x = torch.randn(1, 6, 16)
    out = attn(x, terms=AttentionTerms(slicing=SlicedGroups(2, permute=False)))
    halves = torch.cat([attn(x[:, :3]), attn(x[:, 3:])], dim=1)
    torch.testing.assert_close(out, halves, atol=1e-6, rtol=1e-5)


def test_permutation_per_loop():
    stack = build_stack(SRET.replace(attn_groups=(3, 2), attn_permute=(True, False)))
    assert [(p.slicing.groups, p.slicing.permute) for p in stack.levels] == [
        (3, True),
        (2, False),
    ] * 2


def test_default_follows_algorithm_1():
    # SReT appendix D, Algorithm 1: recursion == False slices contiguously, later loops
    # permute before slicing and invert after
    stack = build_stack(SRET.replace(num_levels=6, attn_groups=(2, 2, 2)))
    assert [p.slicing.permute for p in stack.levels] == [False, True, True] * 2
    attn = SelfAttention(16, 4).train()  # training: where Algorithm 1 draws its randperm
    x = torch.randn(1, 6, 16)
    first = AttentionTerms(slicing=stack.levels[0].slicing)
    halves = torch.cat([attn(x[:, :3]), attn(x[:, 3:])], dim=1)
    torch.testing.assert_close(attn(x, terms=first), halves, atol=1e-6, rtol=1e-5)
    later = AttentionTerms(slicing=stack.levels[1].slicing)
    torch.manual_seed(0)
    draws = [attn(x, terms=later) for _ in range(4)]
    assert any(not torch.allclose(draws[0], d) for d in draws[1:])  # a fresh permutation


def test_evaluation_permutations_differ_between_levels():
    # SReT-T's first stage: [8, 2] groups over 8 x 8 tokens, both loops permuted. One
    # permutation per length would put every 8-group slice inside one 2-group slice.
    t = 64
    stack = build_stack(SRET.replace(attn_groups=(8, 2), attn_permute=(True, True))).eval()
    perms = [p.slicing.permutation(t, False, torch.device("cpu")) for p in stack.levels]
    assert all(not torch.equal(a, b) for i, a in enumerate(perms) for b in perms[i + 1 :])

    def slice_of(perm: torch.Tensor, groups: int) -> torch.Tensor:  # slice of each token
        out = torch.empty(t, dtype=torch.long)
        out[perm] = torch.arange(t) // (t // groups)
        return out

    eights, twos = slice_of(perms[0], 8), slice_of(perms[1], 2)
    nested = all(len(set(twos[eights == g].tolist())) == 1 for g in range(8))
    assert not nested
