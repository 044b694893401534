"""``torch.jit.script`` of every image family: the model's fx graph, compiled
(recurnmt.vision.layers.scripting)."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from recurnmt.vision import create_model

# one model of each family: plain, shared, SReT, Mixer, MRLA-ResNet, DVT cascade
FAMILIES = {
    "vit_mini_patch4": (32, 48),
    "ringformer_vit_mini_patch4": (32, 48),
    "sret_mini": (32, 64),
    "recursive_mixer_mini": (32,),  # a Mixer is built for one token count
    "mrla_light_resnet50": (64, 96),
    "dvt_vit_mini_patch2": (16, 24),
}


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch 2.14 marks torch.jit.script deprecated
        yield


def _model(name: str) -> nn.Module:
    torch.manual_seed(0)
    return create_model(name).eval()


@pytest.mark.parametrize("name", FAMILIES)
def test_a_scripted_model_gives_the_models_outputs_at_every_size_it_takes(name):
    model = _model(name)
    scripted = torch.jit.script(model)
    assert isinstance(scripted, torch.jit.ScriptModule)
    for size in FAMILIES[name]:
        x = torch.randn(2, 3, size, size)
        with torch.no_grad():
            torch.testing.assert_close(scripted(x), model(x), rtol=0, atol=1e-6)


def test_the_script_runs_on_the_models_parameters_one_shared_block_included():
    model = _model("ringformer_vit_mini_patch4")
    scripted = torch.jit.script(model)
    assert len(model.stack.blocks) == 1
    eager = {p.data_ptr() for p in model.parameters()}
    assert {p.data_ptr() for p in scripted.parameters()} == eager
    assert sum(p.numel() for p in scripted.parameters()) == sum(
        p.numel() for p in model.parameters()
    )
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        before = scripted(x)
        model.stack.blocks[0].ffn.up.weight.mul_(2.0)  # the shared block, every level's
        after = scripted(x)
        torch.testing.assert_close(after, model(x), rtol=0, atol=1e-6)
    assert not torch.equal(before, after)


def test_a_model_in_training_mode_is_refused_at_once():
    model = create_model("vit_mini_patch4")
    with pytest.raises(RuntimeError, match=r"inference graph: call model\.eval\(\) first"):
        torch.jit.script(model)


def test_the_script_switched_to_training_refuses_to_run():
    scripted = torch.jit.script(_model("sret_mini"))
    scripted.train()
    with pytest.raises(Exception, match=r"inference graph; call \.eval\(\)"):
        scripted(torch.randn(1, 3, 32, 32))
    scripted.eval()
    assert scripted(torch.randn(1, 3, 32, 32)).shape == (1, 1000)


def test_a_saved_script_loads_without_recurnmt_code_and_gives_the_same_outputs(tmp_path):
    model = _model("dvt_vit_mini_patch2")
    path = tmp_path / "dvt.pt"
    torch.jit.save(torch.jit.script(model), str(path))
    loaded = torch.jit.load(str(path))
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x), rtol=0, atol=1e-6)


def test_a_model_inside_a_larger_module_scripts_as_its_graph():
    backbone = _model("uit_mini_patch4")
    model = nn.Sequential(backbone, nn.Softmax(dim=-1)).eval()
    scripted = torch.jit.script(model)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(scripted(x), model(x), rtol=0, atol=1e-6)


def test_the_torchscript_example_in_the_vision_readme_runs(capsys):
    from pathlib import Path

    readme = Path(__file__).resolve().parents[1] / "recurnmt" / "vision" / "README.md"
    section = readme.read_text(encoding="utf-8").split("## TorchScript", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    exec(compile(code, str(readme), "exec"), {})
    assert capsys.readouterr().out.splitlines() == ["torch.Size([2, 1000])"]


def test_a_backbone_through_timms_fx_feature_class_scripts_on_the_same_parameters():
    import timm

    torch.manual_seed(0)
    backbone = timm.create_model(
        "ringformer_vit_mini_patch4", features_only=True, out_indices=(1, 3, 5), feature_cls="fx"
    ).eval()
    scripted = torch.jit.script(backbone)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        got, want = scripted(x), backbone(x)
    assert [tuple(t.shape) for t in got] == [(2, 65, 64)] * 3  # a level's tokens
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    shared = {p.data_ptr() for p in scripted.parameters()}
    assert len(shared) == len({p.data_ptr() for p in backbone.parameters()})
