"""Parameter counts and FLOPs of the image models against the papers' tables.

Models are built on the meta device (shapes only, no memory, no initialisation), so even the
86M ViT-B counts in milliseconds.
"""

from __future__ import annotations

import pytest
import torch

from recurnmt.parameters import count_parameters
from recurnmt.vision import create_model
from recurnmt.vision.training.flops import count_macs


def params(name: str, **kwargs) -> int:
    with torch.device("meta"):
        return count_parameters(create_model(name, **kwargs))


# RingFormer Table 2 (ImageNet-small: 100 classes, 6 levels, 8 heads) and Table 3
# (ImageNet-1K, 12 levels, 12 heads). P counts every parameter (class token and head
# included); the counts match models with a parameter-free position embedding exactly.
RINGFORMER_TABLES = [
    ("vit_small_rf_patch16_224", {}, 100, 19.36e6),
    ("uit_small_patch16_224", {}, 100, 3.60e6),
    ("owf_vit_small_patch16_224", dict(embed_dim=376, ffn_dim=1024), 100, 4.51e6),  # OWF^d
    ("ringformer_vit_small_patch16_224", {}, 100, 4.4e6),
    ("vit_small_rf_patch16_224", dict(embed_dim=328, ffn_dim=1536), 100, 8.94e6),  # ViT^d
    ("uit_small_patch16_224", dict(embed_dim=848, ffn_dim=3072), 100, 8.84e6),  # UiT^s
    ("owf_vit_small_patch16_224", {}, 100, 8.86e6),
    ("ringformer_vit_small_patch16_224", dict(embed_dim=728, ffn_dim=3072), 100, 8.82e6),
    ("vit_base_patch16_224", dict(pos_embed="sincos"), 1000, 86.42e6),
    ("owf_vit_base_patch16_224", {}, 1000, 34.45e6),
    ("uit_base_patch16_224", {}, 1000, 8.45e6),
    ("ringformer_vit_base_patch16_224", {}, 1000, 12.02e6),
    ("uit_base_patch16_224", dict(embed_dim=1560, ffn_dim=6240), 1000, 31.99e6),  # UiT^s
    ("ringformer_vit_base_patch16_224", dict(embed_dim=1284, ffn_dim=5120), 1000, 31.95e6),
]


@pytest.mark.parametrize(("name", "kwargs", "classes", "paper"), RINGFORMER_TABLES)
def test_ringformer_tables_2_and_3(name, kwargs, classes, paper):
    assert params(name, num_classes=classes, **kwargs) == pytest.approx(paper, rel=0.01)


def test_ringformer_tables_use_the_rank_h_over_16_signals():
    model = create_model("ringformer_vit_small_patch16_224", num_classes=100)
    assert model.stack.levels[0].attn_signal.rank == 512 // 16


@pytest.mark.parametrize(
    ("name", "paper"),
    [("sret_t", 4.76e6), ("sret_tl", 4.99e6), ("sret_s", 20.9e6)],  # SReT Table 7 / Table 10
)
def test_sret_table_10(name, paper):
    assert params(name) == pytest.approx(paper, rel=0.01)


def test_sret_ext_matches_the_rounded_figure():
    # SReT Table 5: 4.0M (rounded to 0.1M; the configuration is not published)
    assert params("sret_ext") == pytest.approx(4.0e6, rel=0.02)


def test_sret_b_paper_count():
    """SReT Table 10 states 71.2M for SReT-B (see sret_b's docstring for the block counts)."""
    assert params("sret_b") == pytest.approx(71.2e6, rel=0.01)


def test_sret_b_as_printed_in_table_10():
    """Table 10's printed SReT-B structure; the table's 71.2M does not follow from it."""
    widths, depths, ffn, nll = (336, 672, 1344), (2, 5, 3), 3.0, 2.0
    # per block: attention 4C^2, FFN 2 * 3C^2, two NLLs of 2 * 2C^2 (one per loop)
    core = sum(d * (4 + 2 * ffn + 2 * 2 * nll) * c * c for c, d in zip(widths, depths, strict=True))
    assert params("sret_b_printed") == pytest.approx(core, rel=0.03)
    assert params("sret_b_printed") > 2 * 71.2e6 * 0.99


def test_sret_b_differs_from_printed_only_in_block_counts():
    with torch.device("meta"):
        b, printed = (create_model(n) for n in ("sret_b", "sret_b_printed"))
    for sb, sp, depth in zip(b.stages, printed.stages, (2, 4, 1), strict=True):
        assert sb.plan.num_unique == depth and sp.num_levels == 2 * sp.plan.num_unique

        def widths(stack):
            block, nll = stack.blocks[0], stack.levels[0].nll
            attn = block.self_attn
            return (
                attn.embed_dim,
                block.ffn.up.out_features,
                attn.num_heads,
                nll.mlp.up.out_features,
            )

        assert widths(sb) == widths(sp)


@pytest.mark.parametrize(
    ("name", "kwargs", "paper"),
    [
        ("deit_tiny_patch16_224", {}, 5.7e6),  # DeiT Table 1
        ("deit_small_patch16_224", {}, 22.1e6),
        ("deit_tiny_recursive_patch16_224", {}, 5.7e6),  # SReT Table 1, +1 naive recursion
        ("deit_tiny_recursive_patch16_224", dict(loops=4), 5.7e6),  # +3 naive recursions
        ("mixer_b16_224", {}, 59.88e6),  # Mixer Table 1 (59M), timm's exact count
    ],
)
def test_baselines(name, kwargs, paper):
    assert params(name, **kwargs) == pytest.approx(paper, rel=0.01)


def test_sret_108_is_a_third_of_deit_108():
    """SReT ICLR draft appendix B: "our model size is only one-third of DeiT-108". DeiT-108
    (DeiT-Ti at 108 layers) has 48,424,360 parameters, a third 16.14M; SReT-108 (18 blocks x 6
    loops, an NLL of ratio 1.0 per loop, LRC) has 16,432,456 = 0.339 of it. The naive
    recursion at 36 x 3 (16,394,152) is a third in blocks but has no NLL; with SReT-T's NLLs
    (8.05M for 108 of them) it would be half (24,440,080)."""
    deit = params("deit_tiny_d108_patch16_224")
    sret = params("deit_tiny_sret_d108_patch16_224")
    assert deit == 48_424_360 and deit == pytest.approx(48.4e6, rel=0.01)
    assert sret == 16_432_456 and sret / deit == pytest.approx(1 / 3, rel=0.02)
    assert params("deit_tiny_recursive_d108_patch16_224") == 16_394_152
    half = params("deit_tiny_sret_d108_patch16_224", unique_layers=36)
    assert half == 24_440_080 and half / deit == pytest.approx(1 / 2, rel=0.02)


@pytest.mark.parametrize(
    ("name", "kwargs", "paper"),
    [
        ("deit_tiny_patch16_224", {}, 1.3e9),  # DeiT Table 1
        ("sret_t", {}, 1.12e9),  # SReT Table 7, [8,2][4,1][1,1]
        ("sret_t", dict(groups=None), 1.38e9),  # SReT Table 7, global attention
        ("sret_s", {}, 4.2e9),  # SReT Table 5
    ],
)
def test_flops(name, kwargs, paper):
    # "FLOPs" in these tables are multiply-accumulates; 224 x 224 input
    model = create_model(name, **kwargs)
    assert count_macs(model, (1, 3, 224, 224)) == pytest.approx(paper, rel=0.05)


# MRLA Table 1 (ImageNet-1K, 1000 classes): DeiT + MRLA-light/base, d_k = 16 (sec. 5.1).
# Ours add 0.025M (DeiT-T), 0.050M (S), 0.099M (B): MRLA after levels 1-11 (the class-token
# head never reads level 12's patch tokens), one LayerNorm each, no lambda at stage starts.
@pytest.mark.parametrize(
    ("name", "paper"),
    [
        ("deit_tiny_mrla_patch16_224", 5.7e6),
        ("deit_tiny_mrla_base_patch16_224", 5.7e6),
        ("deit_small_mrla_patch16_224", 22.1e6),
        ("deit_base_mrla_patch16_224", 86.5e6),
    ],
)
def test_mrla_table_1(name, paper):
    assert params(name) == pytest.approx(paper, rel=0.01)


def test_mrla_adds_about_0_03m_to_deit_tiny():
    # MRLA sec. 5.1: "+0.03M parameters" on DeiT-T, a figure rounded to 0.01M
    extra = params("deit_tiny_mrla_patch16_224") - params("deit_tiny_patch16_224")
    assert extra == pytest.approx(0.03e6, abs=0.01e6)


# MRLA Table 1 on ResNets (timm's ResNet-50 / -101 = torchvision's 25.56M / 44.55M), d_k = 32,
# MRLA after every bottleneck of C output channels: a 3 x 3 depth-wise value (9C), the branch
# norm (2C), two Conv1D kernels of ECA's size k, and lambda_o (C; MRLA-light, not at a stage's
# first block). MRLA-base has no query kernel at a stage's first block. Table 1 rounds to 0.1M
# and has no MRLA-base ResNet-101 (out of memory at the paper's batch size).
@pytest.mark.parametrize(
    ("name", "paper"),
    [
        ("mrla_light_resnet50", 25.7e6),
        ("mrla_base_resnet50", 25.7e6),
        ("mrla_light_resnet101", 44.9e6),
        ("mrla_base_resnet101", None),
    ],
)
def test_mrla_resnet_table_1(name, paper):
    depth, light = (101 if name.endswith("101") else 50), "light" in name
    resnet = {50: 25_557_032, 101: 44_549_160}[depth]
    blocks = {50: (3, 4, 6, 3), 101: (3, 4, 23, 3)}[depth]
    extra = 0
    for c, n in zip((256, 512, 1024, 2048), blocks, strict=True):
        k = 7 if c == 2048 else 5
        extra += n * (9 * c + 2 * c + 2 * k) + ((n - 1) * c if light else -k)
    count = params(name)
    assert count == resnet + extra
    if paper is not None:
        assert count == pytest.approx(paper, abs=0.05e6)


# DVT (Wang et al. 2021) prints no parameter table. Its DeiT-S cascade is three DeiT-S (DeiT
# Table 1: 22.1M at 14x14; the 7x7 and 10x10 stages have smaller position tables) plus the
# reuse modules of its sec. 4 "Implementation details": per downstream layer, f_l = LN-MLP
# D -> 128 -> 48 and 48 more LN and first-FFN-layer inputs (eq. 5); per downstream model, one
# MLP N^H L -> 3 N^H L -> N^H L over the upstream attention logits (eq. 9). The last model's
# last f_l is left out: its context reaches only patch tokens its class-token head never reads.
def test_dvt_deit_small_is_three_deit_small_plus_the_reuse_modules():
    d, ff, heads, layers, hidden, ctx = 384, 1536, 6, 12, 128, 48
    f_l = 2 * d + (d * hidden + hidden) + (hidden * ctx + ctx)
    per_layer = f_l + 2 * ctx + ctx * ff
    maps = heads * layers
    relation = (maps * 3 * maps + 3 * maps) + (3 * maps * maps + maps)
    stages = [params("deit_small_patch16_224", img_size=16 * g) for g in (7, 10, 14)]
    assert stages[-1] == pytest.approx(22.1e6, rel=0.01)
    reuse = 2 * (layers * per_layer + relation) - f_l
    assert params("dvt_deit_small_patch16_224") == sum(stages) + reuse
    assert params("dvt_deit_small_patch16_224") == pytest.approx(69.19e6, rel=1e-3)
    no_reuse = params("dvt_deit_small_patch16_224", feature_reuse=False, relation_reuse=False)
    assert no_reuse == sum(stages)


def test_relaxed_deit_tiny_counts_its_shared_blocks_and_every_levels_deltas():
    """DeiT-Ti's 12 layers as 6 blocks looped twice (Relaxed Recursive Transformers eq. 2):
    half the blocks (their norms move to the 12 levels), and per level a rank-16 LoRA and bias
    deltas on Q, K, V, the attention output and the FFN's two projections (eq. 3)."""
    c, ff, r, levels = 192, 768, 16, 12
    block = 4 * c * c + 4 * c + 2 * c * ff + ff + c  # linears and biases, norms aside
    lora = r * (3 * 2 * c + 2 * c + 2 * (c + ff)) + (4 * c + ff + c)
    deit = params("deit_tiny_patch16_224")
    assert params("deit_tiny_relaxed_patch16_224", lora_rank=0) == deit - 6 * block
    assert params("deit_tiny_relaxed_patch16_224") == deit - 6 * block + levels * lora
