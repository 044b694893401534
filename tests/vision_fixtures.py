"""Shared helpers of the vision tests: small versions of every registered model."""

from __future__ import annotations


def small_kwargs(name: str) -> dict:
    """Shrinks widths and image size but keeps each model's structure (levels, sharing,
    signals, NLL, LRC, groups), so every registered model runs in a fraction of a second."""
    if name.startswith("sret"):
        return dict(dims=(16, 32, 64), heads=(1, 2, 4), img_size=32, stem_dims=(8, 16))
    if "mixer" in name:
        return dict(embed_dim=32, token_dim=16, channel_dim=64, img_size=32, patch_size=8)
    if "resnet" in name:  # 1/8 of the widths (d_k = 32 still divides) and two blocks a stage:
        # a stage's first MRLA level and a recurrent one (the depths: test_vision_params)
        return dict(channels=(8, 16, 32, 64), stem_width=8, layers=(2, 2, 2, 2))
    if name.startswith("dvt"):  # a DVT cascade of three such ViTs on 2x2 / 3x3 / 4x4 tokens
        return dict(
            embed_dim=32, ffn_dim=64, num_heads=2, img_size=32, patch_size=8, grids=(2, 3, 4)
        )
    return dict(embed_dim=32, ffn_dim=64, num_heads=2, img_size=32, patch_size=8)
