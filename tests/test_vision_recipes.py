"""The paper recipes of ``configs/vision/``: their printed values, and a few real training steps
of each on the CIFAR / digits fixtures with the recipe's whole augmentation stack (RandAugment,
erasing, mixup / cutmix, repeated-augmentation settings, EMA where set), only sizes shrunk."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import timm
import torch

from recurnmt.vision.training import train as train_cli
from recurnmt.vision.training.arguments import parse_args
from tests.vision_fixtures import small_kwargs

REPO = Path(__file__).resolve().parents[1]
RECIPES = sorted((REPO / "configs" / "vision").glob("*.yaml"))
CIFAR = REPO / "tests" / "fixtures" / "vision"
DEIT_AUGMENTATION = {
    "aa": "rand-m9-mstd0.5-inc1",
    "reprob": 0.25,
    "remode": "pixel",
    "mixup": 0.8,
    "cutmix": 1.0,
    "aug_repeats": 3,
    "train_interpolation": "bicubic",
}
FAST = ["--no-progress", "--no-tensorboard", "--threads", "1", "--epochs", "1", "--workers", "0"]


def recipe(name: str):
    return parse_args(["--config", str(REPO / "configs" / "vision" / f"{name}.yaml")])


def test_recipes_say_what_the_papers_print():
    sret_t = recipe("imagenet_sret_t")  # SReT Table 10 / DeiT Table 9
    assert (sret_t.epochs, sret_t.batch_size, sret_t.lr) == (300, 1024, pytest.approx(1e-3))
    assert (sret_t.weight_decay, sret_t.warmup_epochs, sret_t.smoothing) == (0.05, 5, 0.1)
    assert sret_t.model_args["drop_path_rate"] == 0.1
    assert {k: getattr(sret_t, k) for k in DEIT_AUGMENTATION} == DEIT_AUGMENTATION
    sret_s = recipe("imagenet_sret_s")
    assert (sret_s.batch_size, sret_s.lr, sret_s.model_args["drop_path_rate"]) == (512, 1e-3, 0.2)
    distill = recipe("imagenet_sret_t_distill")  # DeiT's teacher, RegNetY-16GF
    assert distill.teacher_model == "regnety_160" and timm.is_model(distill.teacher_model)
    finetune = recipe("imagenet_sret_t_finetune384")
    assert finetune.img_size == (384, 384) and (finetune.lr, finetune.weight_decay) == (5e-6, 0)
    for name, lr, batch in (
        ("imagenet100_ringformer_small", 1e-3, 1024),  # RingFormer A.1
        ("imagenet_ringformer_base", 5e-4, 4096),
    ):
        ring = recipe(name)
        assert (ring.lr, ring.batch_size, ring.clip_grad) == (lr, batch, 1.0)
        assert ring.model_args["drop_rate"] == 0.1  # "for all models"
    assert recipe("imagenet_ringformer_base").accum_steps == 16
    mrla = recipe("imagenet_deit_t_mrla")  # MRLA appendix B.1
    assert mrla.lr == pytest.approx(1e-3) and mrla.model == "deit_tiny_mrla_patch16_224"
    assert recipe("imagenet_dvt_deit_s").lr == pytest.approx(1e-3)  # DeiT-S at batch 1024
    resnet = recipe("imagenet_mrla_resnet50")  # MRLA appendix B.1, "ResNet"
    assert resnet.model == "mrla_light_resnet50"
    assert (resnet.epochs, resnet.batch_size, resnet.lr) == (100, 256, pytest.approx(0.1))
    assert (resnet.opt, resnet.momentum, resnet.weight_decay) == ("momentum", 0.9, 1e-4)
    assert (resnet.sched, resnet.decay_epochs, resnet.decay_rate) == ("step", 30, 0.1)
    assert resnet.warmup_epochs == 0 and resnet.weight_decay_all  # the released code's
    assert (resnet.smoothing, resnet.mixup, resnet.cutmix, resnet.reprob) == (0, 0, 0, 0)
    assert resnet.aa == "" and resnet.aug_repeats == 0  # crop and flip only


@pytest.fixture(scope="module")
def teacher_weights(tmp_path_factory) -> Path:
    """A randomly initialised timm RegNetY (the 200MF member of RegNetY-16GF's family, for
    speed) saved as a plain state dict: the file a user downloads for the real teacher."""
    path = tmp_path_factory.mktemp("teacher") / "regnety.pth"
    torch.save(timm.create_model("regnety_002", num_classes=10).state_dict(), path)
    return path


def shrunk(args, name: str, data: list[str]) -> list[str]:
    """Flags that shrink a recipe's model, batch and data set but keep its recipe."""
    flags = [*FAST, *data]
    model = args.model
    for key, value in small_kwargs(model).items():
        if key != "img_size":
            flags += ["--model-arg", f"{key}={value!r}"]
    flags += ["--batch-size", str(4 * args.accum_steps), "--limit-train", str(8 * args.accum_steps)]
    return flags


@pytest.mark.parametrize("config", RECIPES, ids=lambda p: p.stem)
def test_recipe_trains_a_few_steps(config, tmp_path, teacher_weights):
    args = parse_args(["--config", str(config)])
    rgb = ["--data", "cifar10", "--data-root", str(CIFAR), "--img-size", "32"]
    grey = ["--data", "digits", "--img-size", "32"]  # enough images for 16 accumulation steps
    data = rgb if args.accum_steps == 1 else grey
    extra = ["--limit-eval", "4", "--output", str(tmp_path / "run")]
    if args.teacher:
        extra += ["--teacher-model", "regnety_002", "--teacher", str(teacher_weights)]
    if args.finetune:  # fine-tune a small SReT-T trained here from the recipe's own resolution
        base = recipe("imagenet_sret_t")
        train_cli.main(
            ["--config", str(REPO / "configs/vision/imagenet_sret_t.yaml"), "--output"]
            + [str(tmp_path / "base"), *shrunk(base, "sret_t", rgb), "--limit-eval", "4"]
        )
        flags = [*FAST, *rgb, "--img-size", "48", "--batch-size", "4", "--limit-train", "8"]
        extra += ["--finetune", str(tmp_path / "base" / "checkpoint.pt"), *flags]
        train_cli.main(["--config", str(config), *extra])
    else:
        train_cli.main(["--config", str(config), *shrunk(args, args.model, data), *extra])
    (record,) = [
        json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    assert math.isfinite(record["train_loss"]) and 0 <= record["top1"] <= 100
    assert len(record["losses"]) == 2
