"""How the vision models set up their level stacks: stochastic depth, the final norm, layer-norm
eps and SReT's per-loop token permutation (``StackConfig`` options of recurnmt.modules)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from recurnmt.modules import TransformerBlock
from recurnmt.vision.models.sret import attn_permute_schedule, sret_drop_path_rates
from tests.test_vision_models import build_small, stacks_of

FAMILY_MODELS = [
    "vit_mini_patch4",
    "recursive_vit_mini_patch4",
    "ringformer_vit_mini_patch4",
    "uit_mini_patch4",
    "owf_vit_mini_patch4",
    "sret_mini",
]

# SReT-T's 20 levels at rate 0.1 in the released code: block r of a stage takes entry r of the
# stage's slice of linspace-over-all-levels, for both of its loops
SRET_T_REFERENCE = (
    [0.0, 0.0, 0.005, 0.005]
    + [0.02, 0.02, 0.025, 0.025, 0.03, 0.03, 0.035, 0.035, 0.04, 0.04]
    + [0.07, 0.07, 0.075, 0.075, 0.08, 0.08]
)


def deterministic(name: str) -> dict:
    # SReT's sliced attention draws a permutation in training; global attention draws none
    return {"groups": None} if name.startswith("sret") else {}


def rates_seen_by_blocks(model: nn.Module, monkeypatch) -> list[float]:
    """The drop_path argument of every block call in one forward pass, in order."""
    seen = []
    original = TransformerBlock.forward

    def spy(self, x, parts, **kwargs):
        seen.append(parts.drop_path)
        return original(self, x, parts, **kwargs)

    monkeypatch.setattr(TransformerBlock, "forward", spy)
    with torch.no_grad():
        model.eval()(torch.randn(1, 3, 32, 32))
    return seen


@pytest.mark.parametrize("name", FAMILY_MODELS)
def test_drop_path_drops_in_training_only(name):
    x = torch.randn(8, 3, 32, 32)
    plain = build_small(name, **deterministic(name)).train()
    torch.testing.assert_close(plain(x), plain(x), rtol=0, atol=0)  # nothing else is random
    model = build_small(name, drop_path_rate=0.5, **deterministic(name)).train()
    assert not torch.equal(model(x), model(x))
    model.eval()
    assert torch.equal(model(x), model(x))
    plain.load_state_dict(model.state_dict())
    torch.testing.assert_close(model(x), plain.eval()(x), rtol=0, atol=0)


def test_vit_drop_path_grows_linearly_over_the_levels(monkeypatch):
    # DeiT: linspace(0, 0.1, depth); naive recursion spreads it over all depth * loops levels
    model = build_small("deit_tiny_patch16_224")
    assert rates_seen_by_blocks(model, monkeypatch) == pytest.approx(
        [0.1 * i / 11 for i in range(12)]
    )
    model = build_small("deit_tiny_recursive_patch16_224", drop_path_rate=0.23)
    assert rates_seen_by_blocks(model, monkeypatch) == pytest.approx(
        [0.23 * i / 23 for i in range(24)]
    )


def test_sret_drop_path_spans_the_stages(monkeypatch):
    assert rates_seen_by_blocks(build_small("sret_t"), monkeypatch) == pytest.approx(
        SRET_T_REFERENCE
    )
    linear = build_small("sret_t", drop_path_schedule="linear")
    assert rates_seen_by_blocks(linear, monkeypatch) == pytest.approx(
        [0.1 * i / 19 for i in range(20)]
    )
    # shared blocks keep their rates in the untied copy
    stage = linear.stages[1]
    assert [p.drop_path for p in stage.untied().levels] == [p.drop_path for p in stage.levels]
    with pytest.raises(ValueError, match="drop_path_schedule='cosine'"):
        sret_drop_path_rates((2, 5, 3), 2, 0.1, "cosine")


@pytest.mark.parametrize(
    ("name", "rate"),
    [
        ("deit_tiny_patch16_224", 0.1),  # DeiT Table 9
        ("deit_small_patch16_224", 0.1),
        ("deit_tiny_recursive_patch16_224", 0.1),  # SReT Table 1 uses DeiT's recipe
        ("sret_t", 0.1),  # SReT (ECCV) appendix E
        ("sret_tl", 0.1),
        ("sret_s", 0.2),
        ("sret_b", 0.0),  # not published
        ("sret_b_printed", 0.0),
        ("sret_ext", 0.0),
        ("vit_base_patch16_224", 0.0),
        ("ringformer_vit_base_patch16_224", 0.0),
        ("uit_base_patch16_224", 0.0),
        ("owf_vit_base_patch16_224", 0.0),
        ("vit_mini_patch4", 0.0),
        ("sret_mini", 0.0),
    ],
)
def test_registered_stochastic_depth(name, rate):
    stacks = stacks_of(build_small(name))
    if len(stacks) == 1:
        assert stacks[0].levels[-1].drop_path == pytest.approx(rate)  # linear up to the rate
    else:
        depths = [s.plan.num_unique for s in stacks]
        expected = sret_drop_path_rates(depths, 2, rate)
        assert [tuple(p.drop_path for p in s.levels) for s in stacks] == expected


@pytest.mark.parametrize("name", ["deit_tiny_patch16_224", "ringformer_vit_mini_patch4", "sret_t"])
def test_every_layer_norm_uses_eps_1e_6(name):
    model = build_small(name)
    norms = [m for m in model.modules() if isinstance(m, nn.LayerNorm)]
    assert norms and all(m.eps == 1e-6 for m in norms)
    if not name.startswith("sret"):
        vit = build_small(name, norm_eps=1e-5)
        assert all(m.eps == 1e-5 for m in vit.modules() if isinstance(m, nn.LayerNorm))


def test_final_norms():
    vit = build_small("vit_mini_patch4")
    assert isinstance(vit.stack.final_norm, nn.LayerNorm)  # pre-LN ViT: normalise the tokens
    sret = build_small("sret_mini")
    # SReT normalises once, after global average pooling, not at the end of every stage
    assert all(s.final_norm is None for s in sret.stages)
    assert isinstance(sret.norm, nn.LayerNorm)


def test_sret_permutation_schedule_reaches_the_stages():
    def permutes(stage) -> list[bool]:  # of the sliced levels
        return [p.slicing.permute for p in stage.levels if p.slicing is not None]

    model = build_small("sret_mini")  # groups (2, 1): only stage 0's first loop is sliced
    assert permutes(model.stages[0]) == [False]  # default: Algorithm 1, first loop contiguous
    reference = build_small("sret_t")  # [8, 2][4, 1][1, 1]
    assert [permutes(s) for s in reference.stages] == [[False, True] * 2, [False] * 5, []]
    always = build_small("sret_t", attn_permute="always")
    assert [permutes(s) for s in always.stages] == [[True] * 4, [True] * 5, []]
    custom = build_small("sret_mini", attn_permute=[True, False])
    assert permutes(custom.stages[0]) == [True]


def test_contiguous_slices_change_the_function():
    # sret_mini slices its first stage's 8 x 8 tokens in 2 groups at the first loop
    x = torch.randn(2, 3, 32, 32)
    model = build_small("sret_mini").eval()
    permuted = build_small("sret_mini", attn_permute="always").eval()
    permuted.load_state_dict(model.state_dict())
    assert not torch.allclose(model(x), permuted(x))
    # no group attention in either loop: permutations have nothing to change
    unsliced = dict(groups=((1, 1), (1, 1), (1, 1)))
    a = build_small("sret_mini", **unsliced).eval()
    b = build_small("sret_mini", attn_permute="always", **unsliced).eval()
    b.load_state_dict(a.state_dict())
    torch.testing.assert_close(a(x), b(x))


@pytest.mark.parametrize("bad", ["sometimes", (True,), (1, 0)])
def test_bad_permutation_settings_are_refused(bad):
    with pytest.raises(ValueError, match="attn_permute"):
        attn_permute_schedule(bad, 2)


def test_ringformer_vit_signals_start_as_the_authors_code():
    """vringformer.py: up factors zero, down factors N(0, 1e-6^2); LoRA's Kaiming-uniform on
    request. The image code keeps its projection biases (unlike the translation code)."""
    from recurnmt.vision import create_model

    def downs(**kwargs):
        model = create_model("ringformer_vit_mini_patch4", num_classes=3, **kwargs)
        return model, [p for n, p in model.named_parameters() if n.endswith("signal.down")]

    model, authors = downs()
    assert authors and all(p.abs().max() < 1e-5 for p in authors)
    assert model.stack.blocks[0].self_attn.qkv_proj.bias is not None
    _, lora = downs(signal_down_init="kaiming")
    assert all(p.abs().max() > 1e-2 for p in lora)
    _, wide = downs(signal_down_std=0.1, signal_rank=4)
    assert all(p.std() > 0.05 and p.size(0) in (4, 12) for p in wide)
