"""``python -m recurnmt.vision.convert``: a trained ViT/DeiT (ours or timm's) as a relaxed
recursive one; exact at full rank, its checkpoint what evaluate and --finetune read."""

from __future__ import annotations

import pytest
import timm
import torch

from recurnmt.vision import create_model
from recurnmt.vision.checkpoint import load_checkpoint, model_from_checkpoint, save_checkpoint
from recurnmt.vision.convert import cli, convert

MINI = dict(embed_dim=32, ffn_dim=48, num_heads=2, img_size=16, patch_size=4, num_classes=5)


def _trained(model: torch.nn.Module) -> torch.nn.Module:
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(mean=1.0 if "norm" in name and name.endswith("weight") else 0.0, std=0.2)
    return model.eval()


def _logits(model, seed: int = 0) -> torch.Tensor:
    x = torch.randn(3, 3, 16, 16, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return model.eval()(x)


def _save_ours(path, name: str = "vit_mini_patch4", **kwargs):
    model = _trained(create_model(name, **MINI, **kwargs))
    payload = {"model_name": name, "model_kwargs": {**MINI, **kwargs}, "model": model.state_dict()}
    save_checkpoint(path, {**payload, "data": {"name": "digits"}})
    return model


@pytest.mark.parametrize("init", ["stepwise", "average", "lower"])
def test_our_vit_at_full_rank_is_the_source_exactly(tmp_path, init):
    source = _save_ours(tmp_path / "vit.pt")
    model, kwargs, *_ = convert(
        tmp_path / "vit.pt",
        tmp_path / "out.pt",
        model="relaxed_vit_mini_patch4",
        unique_layers=2,
        init=init,
        level_lora_rank="full",
    )
    assert (_logits(model) - _logits(source)).abs().max() <= 1e-4
    stack = model.stack
    assert stack.plan.block_of_level == (0, 1) * 3 and stack.block_of_level(0) is stack.blocks[0]
    rebuilt = model_from_checkpoint(load_checkpoint(tmp_path / "out.pt"))  # evaluate, finetune
    torch.testing.assert_close(_logits(rebuilt), _logits(model))
    assert load_checkpoint(tmp_path / "out.pt")["data"] == {"name": "digits"}
    assert kwargs["lora_rank"] == 32 and kwargs["depth"] == 6


def test_timm_vit_weights_at_full_rank_give_timms_logits(tmp_path):
    teacher = _trained(
        timm.models.vision_transformer.VisionTransformer(
            img_size=16, patch_size=4, embed_dim=128, depth=4, num_heads=2, mlp_ratio=1.5,
            num_classes=5,
        )
    )  # fmt: skip
    torch.save({"model": teacher.state_dict()}, tmp_path / "deit.pth")
    model, kwargs, *_ = convert(
        tmp_path / "deit.pth", tmp_path / "out.pt", unique_layers=1, level_lora_rank="full"
    )
    assert kwargs["num_heads"] == 2 and kwargs["img_size"] == (16, 16)  # width / 64
    assert (_logits(model) - _logits(teacher)).abs().max() <= 1e-4
    from safetensors.torch import save_file

    save_file(teacher.state_dict(), str(tmp_path / "deit.safetensors"))
    low, *_ = convert(
        tmp_path / "deit.safetensors", tmp_path / "r0.pt", unique_layers=2, level_lora_rank=0
    )
    assert all(parts.lora is None for parts in low.stack.levels)  # plain sharing
    assert torch.equal(low.stack.blocks[1].ffn.up.weight, teacher.blocks[3].mlp.fc1.weight)


def test_a_timm_training_checkpoint_converts_with_its_model_or_ema_weights(tmp_path, capsys):
    """timm's train.py saves through ``CheckpointSaver``: ``state_dict``, ``state_dict_ema``,
    the optimizer and its argparse arguments (read weights-only, the arguments allowed)."""
    import argparse

    from timm.utils import CheckpointSaver, ModelEmaV3

    teacher = _trained(
        timm.models.vision_transformer.VisionTransformer(
            img_size=16, patch_size=4, embed_dim=64, depth=4, num_heads=1, num_classes=5
        )
    )
    ema = ModelEmaV3(teacher)
    _trained(ema.module)  # EMA weights of their own
    optimizer = torch.optim.SGD(teacher.parameters(), lr=0.1)
    args = argparse.Namespace(model="deit_tiny_patch16_224", lr=0.1)
    saver = CheckpointSaver(teacher, optimizer, args=args, model_ema=ema,
                            checkpoint_dir=str(tmp_path), recovery_dir=str(tmp_path))  # fmt: skip
    saver.save_checkpoint(epoch=0, metric=1.0)
    path = tmp_path / "last.pth.tar"
    for flags, want in (([], teacher), (["--use-ema"], ema.module)):
        out = tmp_path / f"out{len(flags)}.pt"
        argv = [str(path), str(out), "--unique-layers", "2", "--level-lora-rank", "full", *flags]
        assert cli(argv) == 0
        model = model_from_checkpoint(load_checkpoint(out))
        assert (_logits(model) - _logits(want.eval())).abs().max() <= 1e-4
        assert "keep 100.0% of the energy" in capsys.readouterr().out
    torch.save({"state_dict": teacher.state_dict()}, tmp_path / "plain.pth")
    assert cli([str(tmp_path / "plain.pth"), str(tmp_path / "o.pt"), "--use-ema"]) == 2
    assert "--use-ema: the checkpoint holds no EMA weights" in capsys.readouterr().err


def test_a_low_rank_prints_its_measured_difference(tmp_path, capsys):
    _save_ours(tmp_path / "vit.pt")
    argv = [str(tmp_path / "vit.pt"), str(tmp_path / "o.pt"), "--model",
            "relaxed_vit_mini_patch4", "--unique-layers", "1", "--level-lora-rank", "2"]  # fmt: skip
    assert cli(argv) == 0
    printed = capsys.readouterr().out
    kept = float(printed.split("the LoRAs keep ")[1].split("%")[0])
    said = float(printed.split("max logit difference from the source ")[1].split()[0])
    assert 0 < kept < 100 and said > 1e-3


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--unique-layers", "7"], "--unique-layers=7: must not exceed depth=6"),
        (["--level-lora-rank", "33"], "--level-lora-rank=33: must lie between 0"),
        (["--level-lora-rank", "half"], "--level-lora-rank='half': choose a rank >= 0 or full"),
        (["--model", "vit_xl"], "unknown vision model 'vit_xl'"),
    ],
)
def test_bad_settings_fail_in_one_line_naming_them(tmp_path, capsys, monkeypatch, flags, message):
    monkeypatch.delenv("RECURNMT_TRACEBACK", raising=False)
    _save_ours(tmp_path / "vit.pt")
    argv = [str(tmp_path / "vit.pt"), str(tmp_path / "o.pt"), "--model", "relaxed_vit_mini_patch4"]
    assert cli([*argv, *flags]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and message in err


def test_bad_sources_fail_naming_them(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("RECURNMT_TRACEBACK", raising=False)
    out = str(tmp_path / "o.pt")
    assert cli([str(tmp_path / "none.pt"), out]) == 2
    assert "none.pt does not exist" in capsys.readouterr().err
    (tmp_path / "bad.pt").write_bytes(b"\x00garbage")
    assert cli([str(tmp_path / "bad.pt"), out]) == 2
    assert "bad.pt is not a checkpoint" in capsys.readouterr().err
    _save_ours(tmp_path / "ring.pt", "ringformer_vit_mini_patch4")
    assert cli([str(tmp_path / "ring.pt"), out, "--model", "relaxed_vit_mini_patch4"]) == 2
    assert "owns attn_signal" in capsys.readouterr().err
    torch.save({"conv1.weight": torch.zeros(2, 2)}, tmp_path / "resnet.pth")
    assert cli([str(tmp_path / "resnet.pth"), out]) == 2
    assert "no timm VisionTransformer's" in capsys.readouterr().err
