"""Command-line options of ``python -m recurnmt.vision.training.train``.

Any option can also come from a YAML file (``--config configs/vision/digits_ringformer.yaml``)
whose keys are the option names with underscores; flags on the command line win over the file.
Model settings beyond the registered defaults go in ``--model-arg key=value`` (repeatable;
values are Python literals) or a ``model_args`` mapping in the file.
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path
from typing import Any

from recurnmt.flags import CHECKPOINT_SEGMENT, COMPILE, COMPILE_MODE, MIXED_DEPTH, add_options
from recurnmt.modules import ConfigError

DEFAULT_LR = 2e-3  # the digits recipe's
SCHEDULES = ("cosine", "step")


def parse_model_args(items: list[str] | dict | None) -> dict[str, Any]:
    """``["loops=3", "embed_dim=96"]`` -> ``{"loops": 3, "embed_dim": 96}``."""
    if items is None:
        return {}
    if isinstance(items, dict):
        return dict(items)
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise argparse.ArgumentTypeError(f"--model-arg {item!r} is not key=value")
        try:
            out[key.strip()] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            out[key.strip()] = value  # a bare word, e.g. pos_embed=sincos
    return out


def parse_size(value: str | int | list | tuple | None) -> tuple[int, int] | None:
    """``"224"`` -> (224, 224); ``"224x160"`` -> (224, 160)."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return int(value[0]), int(value[1])
    if isinstance(value, int):
        return value, value
    rows, _, cols = str(value).lower().partition("x")
    return int(rows), int(cols or rows)


def build_parser() -> argparse.ArgumentParser:
    # defaults: the embedded digits recipe (a CPU minute); configs/vision/ has the papers'
    p = argparse.ArgumentParser(
        prog="python -m recurnmt.vision.training.train",
        description="Train an image classifier from recurnmt.vision (single process or torchrun).",
    )
    p.add_argument("--config", help="YAML file of option defaults")
    _add_model_options(p)
    _add_data_options(p)
    _add_optimisation_options(p)
    _add_augmentation_options(p)
    _add_distillation_options(p)
    _add_run_options(p)
    return p


def _add_model_options(parser: argparse.ArgumentParser) -> None:
    """The model group: the model, its compilation and a checkpoint to fine-tune."""
    g = parser.add_argument_group("model")
    g.add_argument("--model", default="ringformer_vit_mini_patch4", help="registered model")
    g.add_argument(
        "--model-arg",
        dest="model_args",
        action="append",
        metavar="KEY=VALUE",
        help="model setting (repeatable), e.g. depth=12 or unique_layers=1",
    )
    g.add_argument(
        "--grad-checkpointing",
        "--checkpoint-activations",  # fairseq-train's spelling
        action="store_true",
        help="activation checkpointing per level (less memory, one more forward per level); "
        "--checkpoint-segment K for segments of K levels",
    )
    add_options(
        g, (CHECKPOINT_SEGMENT, COMPILE, COMPILE_MODE), with_defaults=True
    )  # as fairseq-train's
    g.add_argument(
        "--finetune",
        metavar="CKPT",
        help="start from this checkpoint's weights (new resolution/classes allowed)",
    )


def _add_data_options(parser: argparse.ArgumentParser) -> None:
    """The data group: the data set, its resolution and loading."""
    g = parser.add_argument_group("data")
    g.add_argument(
        "--data", default="digits", choices=["digits", "cifar10", "cifar100", "imagenet"]
    )
    g.add_argument("--data-root", help="data folder (not needed for digits)")
    g.add_argument("--img-size", help="training resolution, 224 or 224x160 (data set default)")
    g.add_argument("--workers", type=int, default=0, help="data loader processes per rank")
    g.add_argument(
        "--limit-train",
        type=int,
        default=None,
        metavar="N",
        help="train on the first N images only (smoke tests)",
    )
    g.add_argument(
        "--limit-eval",
        type=int,
        default=None,
        metavar="N",
        help="evaluate on the first N images only (smoke tests)",
    )


def _add_optimisation_options(parser: argparse.ArgumentParser) -> None:
    """The optimisation group: batch, learning-rate schedule, optimizer, regularisation."""
    g = parser.add_argument_group("optimisation")
    g.add_argument("--epochs", type=int, default=60)
    g.add_argument(
        "--batch-size",
        type=int,
        default=64,
        help="global batch size per update (all ranks and accumulation steps)",
    )
    g.add_argument(
        "--accum-steps", type=int, default=1, help="gradient accumulation: micro-batches per update"
    )
    g.add_argument(
        "--lr", type=float, default=None, help=f"peak learning rate (default {DEFAULT_LR})"
    )
    g.add_argument(
        "--lr-base",
        type=float,
        default=None,
        help="peak learning rate per --lr-base-size images of batch: lr = lr_base x "
        "batch / lr_base_size (DeiT: 5e-4 per 512); instead of --lr",
    )
    g.add_argument("--lr-base-size", type=int, default=512)
    g.add_argument(
        "--sched",
        choices=SCHEDULES,
        default="cosine",
        help="learning-rate schedule after the warm-up (timm's scheduler factory): cosine to "
        "--min-lr (DeiT, SReT, RingFormer), or step, times --decay-rate every --decay-epochs "
        "(ResNet; MRLA's ResNets)",
    )
    g.add_argument(
        "--decay-epochs", type=float, default=30.0, help="epochs between the steps of --sched step"
    )
    g.add_argument(
        "--decay-rate", type=float, default=0.1, help="learning-rate factor at each step"
    )
    g.add_argument("--min-lr", type=float, default=1e-5, help="end of the cosine")
    g.add_argument("--warmup-lr", type=float, default=1e-6, help="start of the warm-up")
    g.add_argument("--weight-decay", type=float, default=0.05)
    g.add_argument(
        "--weight-decay-all",
        action="store_true",
        help="decay every parameter, biases and norms included (the SGD recipes of ResNet "
        "and MRLA's code); by default they are exempt, as in DeiT",
    )
    g.add_argument("--warmup-epochs", type=float, default=5.0)
    g.add_argument(
        "--opt", default="adamw", help="timm optimizer name (timm.optim.list_optimizers())"
    )
    g.add_argument("--opt-eps", type=float, default=None, help="optimizer epsilon")
    g.add_argument("--opt-betas", type=float, nargs=2, default=None, metavar=("B1", "B2"))
    g.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
    g.add_argument("--clip-grad", type=float, default=None, help="max gradient norm")
    g.add_argument(
        "--zero",
        action="store_true",
        help="under torchrun, shard the optimizer state over the processes (ZeRO stage 1, "
        "torch's ZeroRedundancyOptimizer): each keeps AdamW's moments for about 1/processes "
        "of the parameters and updates only those; the same losses as without. Checkpoints "
        "hold the full state, resumable with or without --zero and at any process count. "
        "Logged and ignored in one process",
    )
    g.add_argument("--smoothing", type=float, default=0.1, help="label smoothing")
    g.add_argument(
        "--model-ema-decay",
        type=float,
        default=0.0,
        help="keep an exponential moving average of the weights with this decay and "
        "evaluate it too (DeiT's code: 0.99996); 0: none",
    )


def _add_augmentation_options(parser: argparse.ArgumentParser) -> None:
    """The augmentation group: DeiT's augmentation; the data set's defaults when omitted."""
    g = parser.add_argument_group("augmentation (data set defaults when omitted)")
    g.add_argument("--hflip", type=float, help="horizontal flip probability")
    g.add_argument("--scale-min", type=float, help="smallest random-resized-crop area")
    g.add_argument("--reprob", type=float, help="random erasing probability")
    g.add_argument("--remode", help="random erasing fill: pixel (DeiT), rand or const")
    g.add_argument(
        "--aa", help="timm RandAugment string (DeiT: rand-m9-mstd0.5-inc1); 'none' for none"
    )
    g.add_argument("--color-jitter", type=float, help="colour jitter (DeiT: 0.4; off with --aa)")
    g.add_argument(
        "--train-interpolation", help="resizing filter of the crops: bicubic (DeiT), bilinear"
    )
    g.add_argument(
        "--aug-repeats",
        type=int,
        default=0,
        help="repeated augmentation: copies of each image per epoch, on different "
        "processes (DeiT: 3; only with several processes)",
    )
    g.add_argument("--mixup", type=float, default=0.0, help="mixup alpha (DeiT: 0.8)")
    g.add_argument("--cutmix", type=float, default=0.0, help="cutmix alpha (DeiT: 1.0)")
    g.add_argument("--mixup-prob", type=float, default=1.0)
    g.add_argument("--mixup-switch-prob", type=float, default=0.5)


def _add_distillation_options(parser: argparse.ArgumentParser) -> None:
    """The distillation group: distillation from a teacher (SReT eq. 17) and mixed depth."""
    g = parser.add_argument_group("distillation and depth")
    g.add_argument(
        "--teacher",
        metavar="CKPT",
        help="distil from this checkpoint (SReT eq. 17): one of this command, or with "
        "--teacher-model the weights of that timm model",
    )
    g.add_argument(
        "--teacher-model",
        metavar="NAME",
        help="timm model of the --teacher weights, e.g. regnety_160 (DeiT's RegNetY-16GF)",
    )
    g.add_argument("--distill-temperature", type=float, default=1.0)
    add_options(g, (MIXED_DEPTH,), with_defaults=True)  # the loop-free shallow branch


def _add_run_options(parser: argparse.ArgumentParser) -> None:
    """The run group: output, resume, seed, device, precision and logging."""
    g = parser.add_argument_group("run")
    g.add_argument("--output", default="runs/vision", help="checkpoints, metrics, tensorboard")
    g.add_argument(
        "--resume",
        metavar="CKPT",
        help="continue a run; 'auto' resumes OUTPUT/checkpoint.pt when present",
    )
    g.add_argument(
        "--stop-after-epoch",
        type=int,
        default=None,
        help="end after this epoch as if interrupted (the schedule still spans --epochs)",
    )
    g.add_argument("--seed", type=int, default=0)
    g.add_argument(
        "--deterministic",
        action="store_true",
        help="deterministic kernels only (torch.use_deterministic_algorithms): on CUDA a run "
        "and its resumption give the same losses to the bit; an operation without such a "
        "kernel stops the run, naming it",
    )
    g.add_argument("--device", default="auto", help="auto (CUDA where present), cpu or cuda[:N]")
    g.add_argument(
        "--amp",
        default="auto",
        choices=["auto", "off", "bf16", "fp16"],
        help="mixed precision; auto = bf16/fp16 on CUDA, off on CPU",
    )
    g.add_argument(
        "--channels-last",
        action="store_true",
        help="images and convolution weights in NHWC layout (faster convolutions on CUDA "
        "with --amp: the ResNets, SReT's stem, patch embeddings)",
    )
    g.add_argument("--eval-every", type=int, default=1, help="evaluate every N epochs")
    g.add_argument("--no-progress", action="store_true", help="no tqdm progress bars")
    g.add_argument("--no-tensorboard", action="store_true")
    g.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads per process (default 1 on CPU: the small models "
        "gain little from more, and oversubscribed cores lose a lot)",
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parses ``argv`` with defaults from ``--config``."""
    parser = build_parser()
    first, _ = parser.parse_known_args(argv)
    if first.config:
        import yaml

        values = yaml.safe_load(Path(first.config).read_text()) or {}
        known = {a.dest for a in parser._actions}
        unknown = sorted(set(values) - known)
        if unknown:
            parser.error(f"unknown keys in {first.config}: {', '.join(unknown)}")
        if isinstance(values.get("model_args"), dict):
            values["model_args"] = [f"{k}={v!r}" for k, v in values["model_args"].items()]
        parser.set_defaults(**values)
    args = parser.parse_args(argv)
    args.model_args = parse_model_args(args.model_args)
    args.img_size = parse_size(args.img_size)
    args.lr = resolve_lr(args.lr, args.lr_base, args.lr_base_size, args.batch_size)
    if args.aa and args.aa.lower() == "none":
        args.aa = ""
    return args


def resolve_lr(lr: float | None, lr_base: float | None, base_size: int, batch: int) -> float:
    """The peak learning rate: ``--lr``, or ``--lr-base`` scaled linearly by the batch
    (Goyal et al. 2017; DeiT sec. 6: lr = 5e-4 x batch / 512).

    Raises:
        ConfigError: both are given, or the base size is not positive.
    """
    if lr is not None and lr_base is not None:
        raise ConfigError(
            "--lr", lr, "give either it or {--lr-base}", related={"--lr-base": lr_base}
        )
    if lr_base is None:
        return DEFAULT_LR if lr is None else lr
    if base_size <= 0:
        raise ConfigError("--lr-base-size", base_size, "must be positive")
    return lr_base * batch / base_size
