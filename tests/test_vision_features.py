"""timm's feature-extraction contract on recurnmt's image models (issue 44): ``features_only``
backbones whose feature points are a stack's levels (or SReT's and a ResNet's stages), timm's
``forward_intermediates`` / ``prune_intermediate_layers``, the head API (``head_hidden_size``,
``reset_classifier(n, global_pool)``, ``forward_head(pre_logits=True)``), the parts the
pretrained config names, and torch.fx feature extraction of a weight-shared stack whose blocks
stay shared. timm's own test file runs on every model in tests/timm_peer."""

from __future__ import annotations

import pytest
import timm
import torch
from torchvision.models.feature_extraction import create_feature_extractor, get_graph_node_names

from recurnmt.vision import create_model

MINI = [
    "vit_mini_patch4",
    "ringformer_vit_mini_patch4",
    "uit_mini_patch4",
    "owf_vit_mini_patch4",
    "relaxed_vit_mini_patch4",
    "recursive_vit_mini_patch4",
    "vit_mini_mrla_patch4",
]


def _images(model, batch: int = 2) -> torch.Tensor:
    return torch.randn(batch, *model.pretrained_cfg["input_size"])


@pytest.mark.parametrize("name", MINI)
def test_a_vit_backbone_gives_its_levels_as_maps(name):
    backbone = timm.create_model(name, features_only=True, out_indices=(1, 3, -1)).eval()
    assert backbone.feature_info.channels() == [64, 64, 64]
    assert backbone.feature_info.reduction() == [4, 4, 4]
    maps = backbone(_images(backbone))
    assert [tuple(m.shape) for m in maps] == [(2, 64, 8, 8)] * 3
    x = _images(backbone)
    model = backbone.model  # the pruned ViT: no head; its levels as they were
    final, levels = model.forward_intermediates(x, indices=(1, 3, 5), output_fmt="NLC")
    assert final.shape == (2, 65, 64)
    # the maps are the patch tokens of those levels on the patch grid
    for got, tokens in zip(backbone(x), levels, strict=True):
        torch.testing.assert_close(got, tokens.transpose(1, 2).reshape(2, 64, 8, 8))


def test_intermediates_end_in_the_features():
    model = timm.create_model("ringformer_vit_mini_patch4").eval()
    x = _images(model)
    final, _ = model.forward_intermediates(x, indices=2)
    torch.testing.assert_close(final, model.forward_features(x))


def test_intermediates_with_norm_and_prefix_tokens_end_in_the_features():
    model = timm.create_model("ringformer_vit_mini_patch4").eval()
    x = _images(model)
    pairs = model.forward_intermediates(
        x, indices=1, norm=True, return_prefix_tokens=True, output_fmt="NLC",
        intermediates_only=True,
    )  # fmt: skip
    (patches, prefix), features = pairs[0], model.forward_features(x)
    torch.testing.assert_close(torch.cat([prefix, patches], 1), features)
    with pytest.raises(ValueError, match="output_fmt='NHWC'"):
        model.forward_intermediates(x, output_fmt="NHWC")
    with pytest.raises(AssertionError, match="out of range"):
        model.forward_intermediates(x, indices=[6])


def test_a_shared_stack_stays_shared_as_a_backbone_and_through_torch_fx():
    """One block runs every level: the timm backbone and torchvision's fx feature extractor
    hold its parameters once, in the model's own storage."""
    model = timm.create_model("ringformer_vit_mini_patch4").eval()
    block = model.stack.blocks
    assert len(block) == 1 and model.stack.num_levels == 6
    block_storage = {p.data_ptr() for p in block.parameters()}

    backbone = timm.create_model("ringformer_vit_mini_patch4", features_only=True, out_indices=3)
    assert len(backbone.model.stack.blocks) == 1
    assert len({p.data_ptr() for p in backbone.model.stack.blocks.parameters()}) == len(
        block_storage
    )

    _, nodes = get_graph_node_names(model)
    # a shared block's calls are numbered: level l's output is its (2l + 1)-th residual sum
    outputs = {f"stack.blocks.0.lrc.add_{2 * level + 1}": f"level{level}" for level in (1, 3)}
    assert set(outputs) <= set(nodes)
    extractor = create_feature_extractor(model, return_nodes={**outputs, "stack.final_norm": "out"})
    assert {p.data_ptr() for p in extractor.stack.blocks.parameters()} == block_storage
    x = _images(model)
    got = extractor(x)
    _, levels = model.forward_intermediates(x, indices=(1, 3), output_fmt="NLC")
    torch.testing.assert_close(got["out"], model.forward_features(x))
    for level, tokens in zip((1, 3), levels, strict=True):
        torch.testing.assert_close(got[f"level{level}"][:, 1:], tokens)


@pytest.mark.parametrize("name", ["sret_mini", "recurnmt_mrla_light_resnet50"])
def test_pyramids_give_their_stages(name):
    backbone = timm.create_model(name, features_only=True).eval()
    info = backbone.feature_info
    maps = backbone(torch.randn(1, 3, 64, 64))
    assert [m.shape[1] for m in maps] == info.channels()
    assert [64 // m.shape[-1] for m in maps] == info.reduction()


def test_sret_prunes_to_the_stages_asked_for():
    model = create_model("sret_mini").eval()
    x = torch.randn(1, 3, 32, 32)
    first, second = model.forward_intermediates(x, indices=(0, 1), intermediates_only=True)
    assert model.prune_intermediate_layers(indices=(0, 1)) == [0, 1]
    assert len(model.stages) == 2 and model.num_classes == 0
    again = model.forward_intermediates(x, indices=(0, 1), intermediates_only=True)
    torch.testing.assert_close(again, [first, second])


@pytest.mark.parametrize(
    "name", ["vit_mini_patch4", "sret_mini", "recursive_mixer_mini", "dvt_vit_mini_patch2"]
)
def test_the_head_api_is_timms(name):
    model = timm.create_model(name).eval()
    x = _images(model, 1)
    pre = model.forward_head(model.forward_features(x), pre_logits=True)
    assert pre.shape == (1, model.head_hidden_size)
    model.reset_classifier(0)
    assert model.num_classes == 0 and model(x).shape == (1, model.head_hidden_size)
    model.reset_classifier(0, "")
    unpooled = model(x)
    assert unpooled.ndim in (3, 4)  # tokens, or SReT's map
    model.reset_classifier(7, "avg" if name != "vit_mini_patch4" else "token")
    assert model(x).shape == (1, 7)
    with pytest.raises(ValueError, match="global_pool='max'"):
        model.reset_classifier(7, "max")


def test_the_config_names_real_parts():
    for name in ["vit_mini_patch4", "sret_mini", "recursive_mixer_mini", "dvt_vit_mini_patch2",
                 "recurnmt_mrla_light_resnet50"]:  # fmt: skip
        model = timm.create_model(name)
        cfg, params = model.pretrained_cfg, dict(model.named_parameters())
        classifiers = (
            cfg["classifier"] if isinstance(cfg["classifier"], tuple) else (cfg["classifier"],)
        )
        assert all(f"{c}.weight" in params for c in classifiers), name
        assert f"{cfg['first_conv']}.weight" in params, name
        assert len(cfg["pool_size"]) == 2
    assert timm.get_pretrained_cfg_value("recursive_mixer_mini", "fixed_input_size") is True
    assert not timm.get_pretrained_cfg_value("ringformer_vit_mini_patch4", "fixed_input_size")


def test_a_cascade_trains_every_exit():
    model = timm.create_model("dvt_vit_mini_patch2", num_classes=5)
    exits = model.train()(torch.randn(2, 3, 16, 16))
    assert isinstance(exits, tuple) and len(exits) == model.num_exits
    torch.cat(exits).mean().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_the_backbone_example_in_the_vision_readme_runs(capsys):
    from pathlib import Path

    readme = Path(__file__).resolve().parents[1] / "recurnmt" / "vision" / "README.md"
    text = readme.read_text(encoding="utf-8")
    section = text.split("## As a backbone", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    exec(compile(code, str(readme), "exec"), {})
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "[64, 64, 64] [4, 4, 4]",
        "[(2, 64, 8, 8), (2, 64, 8, 8), (2, 64, 8, 8)]",
        "1",
    ]
