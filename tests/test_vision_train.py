"""The training and evaluation commands: losses, schedule, resume, distillation, fine-tuning,
multi-process runs and a real (short) digits training."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from recurnmt.modules import ConfigError
from recurnmt.vision.checkpoint import load_checkpoint
from recurnmt.vision.training import evaluate as evaluate_cli
from recurnmt.vision.training import train as train_cli
from recurnmt.vision.training.arguments import parse_args
from recurnmt.vision.training.distributed import (
    DistInfo,
    DistributedSetupError,
    check_batch_size,
    init_distributed,
    resolve_device,
)
from recurnmt.vision.training.losses import ClassificationLoss, distillation_loss
from recurnmt.vision.training.setup import build_optimization

REPO = Path(__file__).resolve().parents[1]
FAST = [
    "--no-progress",
    "--no-tensorboard",
    "--threads",
    "1",
    "--batch-size",
    "32",
    "--warmup-epochs",
    "1",
    "--limit-eval",
    "64",
]


def train(out: Path, *flags: str) -> list[dict]:
    train_cli.main(["--output", str(out), *FAST, *flags])
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_distillation_is_soft_cross_entropy_without_one_hot_term():
    torch.manual_seed(0)
    student, teacher = torch.randn(4, 5), torch.randn(4, 5)
    manual = -(F.softmax(teacher, -1) * F.log_softmax(student, -1)).sum(-1).mean()
    torch.testing.assert_close(distillation_loss(student, teacher), manual)  # SReT eq. 17
    # the labels play no part once there is a teacher
    model = torch.nn.Linear(5, 5)
    loss = ClassificationLoss(0.1, teacher=model)
    x = torch.randn(4, 5)
    a = loss(student, torch.tensor([0, 1, 2, 3]), x)
    b = loss(student, torch.tensor([4, 4, 4, 4]), x)
    torch.testing.assert_close(a, b)
    assert not any(p.requires_grad for p in model.parameters())


def test_mixed_depth_sums_the_branch_losses():
    loss = ClassificationLoss(0.0)
    y = torch.tensor([1, 0])
    deep, shallow = torch.randn(2, 3), torch.randn(2, 3)
    torch.testing.assert_close(loss((deep, shallow), y), loss(deep, y) + loss(shallow, y))


def test_timm_optimizer_and_cosine_schedule_with_warmup():
    """AdamW without decay on biases, norms, class token and position table; a linear warm-up
    from --warmup-lr over 2 epochs, on a cosine over the whole run that ends at --min-lr
    (DeiT's schedule: timm's, the warm-up not added to the epochs)."""
    from recurnmt.vision import create_model

    args = parse_args(["--lr", "1e-3", "--warmup-lr", "1e-6", "--min-lr", "1e-5"])
    args.epochs, args.warmup_epochs = 10, 2
    model = create_model("vit_mini_patch4", num_classes=3)
    optimizer, scheduler = build_optimization(model, args, steps=10)
    exempt = {id(p) for g in optimizer.param_groups if g["weight_decay"] == 0 for p in g["params"]}
    assert id(model.cls_token) in exempt and id(model.pos_embed.weight) in exempt
    assert id(model.head.bias) in exempt and id(model.head.weight) not in exempt

    def lr(update: int) -> float:
        scheduler.step_update(update)
        return optimizer.param_groups[0]["lr"]

    assert lr(0) == pytest.approx(1e-6)
    assert lr(10) == pytest.approx(1e-6 + (1e-3 - 1e-6) / 2)
    assert lr(20) == pytest.approx(1e-5 + (1e-3 - 1e-5) * (1 + math.cos(math.pi * 0.2)) / 2)
    assert lr(100) == pytest.approx(1e-5)


def test_timm_step_schedule_and_weight_decay_on_everything():
    """ResNet's recipe (MRLA appendix B.1): SGD, lr times 0.1 every 30 epochs from timm's
    scheduler factory, no warm-up, weight decay on every parameter (--weight-decay-all)."""
    from recurnmt.vision import create_model

    args = parse_args(["--config", "configs/vision/imagenet_mrla_resnet50.yaml"])
    model = create_model("vit_mini_patch4", num_classes=3)
    optimizer, scheduler = build_optimization(model, args, steps=10)
    assert type(optimizer).__name__ == "SGD" and not optimizer.defaults["nesterov"]
    assert all(g["weight_decay"] == 1e-4 for g in optimizer.param_groups)
    assert sum(len(g["params"]) for g in optimizer.param_groups) == len(list(model.parameters()))

    def lr(update: int) -> float:
        scheduler.step_update(update)
        return optimizer.param_groups[0]["lr"]

    assert [lr(u) for u in (0, 299, 300, 599, 600, 999)] == pytest.approx(
        [0.1, 0.1, 0.01, 0.01, 0.001, 1e-4]
    )
    exempt = parse_args(["--opt", "momentum", "--sched", "step"])  # the default exemptions
    optimizer, _ = build_optimization(model, exempt, steps=10)
    assert any(g["weight_decay"] == 0 for g in optimizer.param_groups)


@pytest.fixture
def process_group_of_one(tmp_path):
    """A gloo process group of this process alone (ZeroRedundancyOptimizer needs a group)."""
    import torch.distributed as dist

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_zero_keeps_timm_groups_and_schedule_and_trains_like_timm(process_group_of_one):
    """--zero wraps timm's optimizer in ZeroRedundancyOptimizer: the same groups (weight decay
    off for biases, norms, class token, position table), the same class, the scheduler's rate
    reaching the local optimizer, the same updates and the same (full) state_dict; that state
    loads back, and a checkpoint of another model is refused naming --resume."""
    import copy

    from torch.distributed.optim import ZeroRedundancyOptimizer

    from recurnmt.vision import create_model
    from recurnmt.vision.training.zero import (
        full_optimizer_state,
        load_optimizer_state,
        shard_sizes,
    )

    args = parse_args(["--lr", "1e-2", "--warmup-lr", "1e-3", "--min-lr", "1e-4"])
    args.epochs, args.warmup_epochs = 2, 1
    model = create_model("vit_mini_patch4", num_classes=3)
    twin = copy.deepcopy(model)
    plain, plain_sched = build_optimization(model, args, steps=2)
    zero, zero_sched = build_optimization(twin, args, steps=2, shard=True)
    assert isinstance(zero, ZeroRedundancyOptimizer) and type(zero.optim) is type(plain)
    assert shard_sizes(zero) == (count := sum(p.numel() for p in twin.parameters()), count)
    names = {id(p): n for net in (model, twin) for n, p in net.named_parameters()}
    for ours, theirs in zip(zero.param_groups, plain.param_groups, strict=True):
        assert {k: v for k, v in ours.items() if k != "params"} == {
            k: v for k, v in theirs.items() if k != "params"
        }
        assert [names[id(p)] for p in ours["params"]] == [names[id(p)] for p in theirs["params"]]
    decay = {names[id(p)]: g["weight_decay"] for g in zero.optim.param_groups for p in g["params"]}
    assert decay["cls_token"] == decay["pos_embed.weight"] == decay["head.bias"] == 0.0
    assert decay["head.weight"] == args.weight_decay

    images, target = torch.randn(4, 3, 16, 16), torch.tensor([0, 1, 2, 0])
    for update in range(4):
        for net, opt, sched in ((model, plain, plain_sched), (twin, zero, zero_sched)):
            sched.step_update(update)
            F.cross_entropy(net(images), target).backward()
            opt.step()
            opt.zero_grad()
        # the rate the scheduler set is the one the local optimizer stepped with
        assert [g["lr"] for g in zero.optim.param_groups] == [g["lr"] for g in plain.param_groups]
    for a, b in zip(model.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    state = full_optimizer_state(zero, DistInfo())
    torch.testing.assert_close(state, plain.state_dict(), rtol=0, atol=0)

    fresh, _ = build_optimization(copy.deepcopy(twin), args, steps=2, shard=True)
    load_optimizer_state(fresh, plain.state_dict(), "ckpt.pt")  # a run without --zero's state
    assert not fresh.state  # the wrapper keeps no second copy of the shard's state
    assert len(fresh.optim.state) == len(plain.state)
    other, _ = build_optimization(create_model("sret_mini", num_classes=3), args, 2)
    with pytest.raises(ConfigError, match="--resume='ckpt.pt': its optimizer has parameter"):
        load_optimizer_state(fresh, other.state_dict(), "ckpt.pt")


@pytest.mark.parametrize(
    ("opt", "reason"),
    [("lookahead_adamw", "Lookahead wraps another optimizer"), ("lamb", "gradient norm over all")],
)
def test_zero_refuses_optimizers_that_need_every_parameter(opt, reason):
    from recurnmt.vision import create_model

    args = parse_args(["--opt", opt])
    model = create_model("vit_mini_patch4", num_classes=3)
    with pytest.raises(ConfigError, match=f"--opt='{opt}': .*{reason}.*--zero=True"):
        build_optimization(model, args, steps=2, shard=True)


def test_zero_in_one_process_is_logged_and_ignored(tmp_path, capsys):
    """As --aug-repeats: one process has nothing to shard over; it says so and trains."""
    flags = ["--model", "vit_mini_patch4", "--epochs", "1", "--limit-train", "32"]
    zero = train(tmp_path / "zero", *flags, "--zero")
    assert "--zero: sharding the optimizer state needs several processes" in (
        capsys.readouterr().out
    )
    assert zero[0]["losses"] == train(tmp_path / "plain", *flags)[0]["losses"]


def test_lr_scaled_by_the_batch_and_conflicts_named():
    args = parse_args(["--lr-base", "5e-4", "--batch-size", "1024"])
    assert args.lr == pytest.approx(1e-3)  # DeiT: 5e-4 x 1024 / 512
    with pytest.raises(ConfigError, match="--lr=0.1: give either it or --lr-base=0.0005"):
        parse_args(["--lr", "0.1", "--lr-base", "5e-4"])


def test_inconsistent_launches_are_refused(monkeypatch):
    for var in ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(DistributedSetupError, match="launch multi-process training with torchrun"):
        init_distributed("cpu")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    with pytest.raises(DistributedSetupError, match="RANK=3 is outside WORLD_SIZE=2"):
        init_distributed("cpu")
    with pytest.raises(DistributedSetupError, match="not divisible by the 3 processes"):
        check_batch_size(64, DistInfo(rank=0, world_size=3))
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert init_distributed("cpu").world_size == 1


def test_device_errors_are_setup_errors(monkeypatch):
    """The trainer reads --device with the benchmarks' function (recurnmt.device) and raises
    its own DistributedSetupError, naming the flag."""
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert init_distributed("auto").device == torch.device("cpu")
    with pytest.raises(DistributedSetupError, match="--device 'tpu': expected auto, cpu or cuda"):
        init_distributed("tpu")
    with pytest.raises(DistributedSetupError, match="--device cuda: no CUDA device"):
        resolve_device("cuda")


def test_a_setup_error_is_one_line_at_the_command_line(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RECURNMT_TRACEBACK", raising=False)
    assert train_cli.cli(["--device", "tpu", "--output", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err == (
        "python -m recurnmt.vision.training.train: error: --device 'tpu': expected auto, cpu or "
        "cuda[:N]\n"
    )


@pytest.mark.parametrize(
    "model",
    [
        "sret_mini",
        "dvt_vit_mini_patch2",
        "ringformer_vit_mini_mrla_patch4",
        "relaxed_vit_mini_patch4",
    ],
)
@pytest.mark.smoke
def test_resume_continues_the_same_run(tmp_path, model, device):
    """Losses after resuming equal those of a run that never stopped (augmentation, mixup,
    dropout and sliced-attention permutations included; a DVT cascade and an MRLA model too)."""
    flags = [
        "--device",
        device.type,
        "--model",
        model,
        "--epochs",
        "3",
        "--limit-train",
        "96",
        "--mixup",
        "0.8",
        "--cutmix",
        "1.0",
        "--reprob",
        "0.5",
        "--model-arg",
        "drop_rate=0.1",
    ]
    if device.type == "cuda":  # CUDA's atomic-add kernels would differ in the last bits
        flags.append("--deterministic")
    straight = train(tmp_path / "a", *flags)
    train(tmp_path / "b", *flags, "--stop-after-epoch", "1")
    resumed = train(tmp_path / "b", *flags, "--resume", "auto")
    assert [r["epoch"] for r in resumed] == [1, 2, 3]
    for a, b in zip(straight, resumed, strict=True):
        assert a["losses"] == b["losses"]
        assert a["top1"] == b["top1"]
    ckpt = load_checkpoint(tmp_path / "b" / "checkpoint.pt")  # weights-only load works
    assert ckpt["epoch"] == 3 and len(ckpt["rng"]) == 1


def test_deterministic_holds_for_the_run_and_is_restored_after(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(
        train_cli,
        "run",
        lambda args, info: seen.append(torch.are_deterministic_algorithms_enabled()),
    )
    before = torch.are_deterministic_algorithms_enabled()
    train_cli.main(["--output", str(tmp_path), *FAST, "--deterministic"])
    train_cli.main(["--output", str(tmp_path), *FAST])
    assert seen == [True, before] and torch.are_deterministic_algorithms_enabled() == before


def test_workers_ema_and_randaugment_resume_exactly(tmp_path):
    """Two persistent data workers give the losses of none (every sample's augmentation is
    seeded), and a run resumed with workers, RandAugment, erasing, mixup and a model EMA
    continues as if it never stopped, EMA included."""
    flags = [
        "--model",
        "vit_mini_patch4",
        "--epochs",
        "2",
        "--limit-train",
        "64",
        "--aa",
        "rand-m9-mstd0.5-inc1",
        "--reprob",
        "0.25",
        "--mixup",
        "0.8",
        "--cutmix",
        "1.0",
        "--model-ema-decay",
        "0.9",
    ]
    straight = train(tmp_path / "a", *flags)
    train(tmp_path / "b", *flags, "--workers", "2", "--stop-after-epoch", "1")
    resumed = train(tmp_path / "b", *flags, "--workers", "2", "--resume", "auto")
    for a, b in zip(straight, resumed, strict=True):
        assert a["losses"] == b["losses"]
        assert a["ema_top1"] == b["ema_top1"]
    assert "model_ema" in load_checkpoint(tmp_path / "b" / "checkpoint.pt")


def test_gradient_accumulation_matches_the_full_batch(tmp_path):
    flags = [
        "--model",
        "vit_mini_patch4",
        "--epochs",
        "1",
        "--limit-train",
        "64",
        "--scale-min",
        "1.0",
    ]
    full = train(tmp_path / "full", *flags)
    accum = train(tmp_path / "accum", *flags, "--accum-steps", "2")
    assert len(full[0]["losses"]) == len(accum[0]["losses"]) == 2
    assert accum[0]["losses"] == pytest.approx(full[0]["losses"], rel=1e-5)
    assert accum[0]["top1"] == pytest.approx(full[0]["top1"])


def test_grad_checkpointing_trains_the_same_run(tmp_path):
    flags = ["--model", "ringformer_vit_mini_patch4", "--epochs", "1", "--limit-train", "64"]
    plain = train(tmp_path / "plain", *flags)
    checkpointed = train(tmp_path / "ckpt", *flags, "--grad-checkpointing")
    assert checkpointed[0]["losses"] == pytest.approx(plain[0]["losses"], rel=1e-5)


def test_evaluation_at_another_depth(tmp_path, capsys):
    flags = ["--model", "uit_mini_patch4", "--epochs", "1", "--limit-train", "64"]
    train(tmp_path / "uit", *flags)
    ckpt = str(tmp_path / "uit" / "checkpoint.pt")
    base = ["--batch-size", "64", "--json"]
    reports = {}
    for levels in (None, 3, 9):  # trained with 6; a UiT's level embeddings extend
        extra = [] if levels is None else ["--encoder-levels", str(levels)]
        evaluate_cli.main([ckpt, *base, *extra])
        reports[levels] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert reports[3]["levels"] == 3 and reports[None]["levels"] is None
    assert reports[3]["GMACs"] < reports[None]["GMACs"] < reports[9]["GMACs"]
    train(
        tmp_path / "rf",
        "--model",
        "ringformer_vit_mini_patch4",
        "--epochs",
        "1",
        "--limit-train",
        "64",
    )
    with pytest.raises(ConfigError, match="--encoder-levels=7: .*learned"):
        evaluate_cli.main([str(tmp_path / "rf" / "checkpoint.pt"), "--encoder-levels", "7"])
    evaluate_cli.main([ckpt, *base, "--levels", "3"])  # the former spelling still works
    again = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert again["levels"] == 3 and again["GMACs"] == reports[3]["GMACs"]


def test_distillation_finetuning_and_evaluation(tmp_path, capsys):
    base = ["--epochs", "1", "--limit-train", "64"]
    train(tmp_path / "teacher", *base, "--model", "vit_mini_patch4")
    train(
        tmp_path / "student",
        *base,
        "--model",
        "ringformer_vit_mini_patch4",
        "--teacher",
        str(tmp_path / "teacher" / "checkpoint.pt"),
        "--mixed-depth",
    )
    # fine-tune the student at twice the resolution: the learned table is interpolated
    ft = train(
        tmp_path / "ft",
        *base,
        "--finetune",
        str(tmp_path / "student" / "best.pt"),
        "--img-size",
        "32",
        "--weight-decay",
        "0",
        "--lr",
        "5e-6",
    )
    assert math.isfinite(ft[0]["train_loss"])
    ckpt = load_checkpoint(tmp_path / "ft" / "checkpoint.pt")
    assert tuple(ckpt["model_kwargs"]["img_size"]) == (32, 32)
    capsys.readouterr()
    report = evaluate_cli.main([str(tmp_path / "ft" / "best.pt"), "--batch-size", "16"])
    out = capsys.readouterr().out
    assert "top-1" in out and "FLOPs" in out and "images/s" in out
    assert report["images"] == 360 and 0 <= report["top1"] <= 100
    assert report["params_M"] > 0 and report["GMACs"] > 0


def test_finetune_of_a_learned_table_to_a_new_grid(tmp_path):
    train(tmp_path / "s", "--epochs", "1", "--limit-train", "32", "--model", "vit_mini_patch4")
    train(
        tmp_path / "f",
        "--epochs",
        "1",
        "--limit-train",
        "32",
        "--img-size",
        "24",
        "--finetune",
        str(tmp_path / "s" / "checkpoint.pt"),
    )
    state = load_checkpoint(tmp_path / "f" / "checkpoint.pt")["model"]
    assert state["pos_embed.weight"].shape == (1, 1 + 6 * 6, 64)


@pytest.mark.e2e
def test_digits_training_learns(tmp_path):
    """Real handwritten digits, real training: far above the 10% of chance in ~30 s."""
    history = train(
        tmp_path / "digits",
        "--epochs",
        "30",
        "--batch-size",
        "128",
        "--warmup-epochs",
        "5",
        "--limit-eval",
        "360",
    )
    assert history[-1]["top1"] > 80.0
    assert history[-1]["train_loss"] < history[0]["train_loss"]


TWO_PROCESS = [
    pytest.param("cpu", id="gloo"),
    pytest.param(
        "cuda",
        id="nccl",
        marks=[
            pytest.mark.cuda,
            pytest.mark.skipif(
                torch.cuda.device_count() < 2,
                reason="NCCL needs two CUDA devices (the gloo half of this test ran)",
            ),
        ],
    ),
]


def torchrun(out: Path, device: str, *flags: str) -> tuple[list[dict], str]:
    """Trains sret_mini for 2 epochs on 128 images in 2 processes; the metrics and stdout."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--standalone",
        "-m",
        "recurnmt.vision.training.train",
        "--output",
        str(out),
        *FAST,
        "--epochs",
        "2",
        "--limit-train",
        "128",
        "--model",
        "sret_mini",
        "--device",
        device,
        *flags,
    ]
    done = subprocess.run(
        cmd, env=env, cwd=REPO, timeout=300, stdout=subprocess.PIPE, text=True, check=False
    )
    assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stdout}"
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return metrics, done.stdout


@pytest.mark.e2e
@pytest.mark.dist
@pytest.mark.parametrize("device", TWO_PROCESS)
def test_two_process_run_and_resume(tmp_path, device):
    """torchrun with 2 processes: gloo on the CPU, NCCL on two GPUs (the trainer picks the
    backend from the device); resuming the 2-process run is exact as well."""
    straight, _ = torchrun(tmp_path / "a", device)
    torchrun(tmp_path / "b", device, "--stop-after-epoch", "1")
    resumed, _ = torchrun(tmp_path / "b", device, "--resume", "auto")
    assert [r["losses"] for r in straight] == [r["losses"] for r in resumed]
    ckpt = load_checkpoint(tmp_path / "a" / "checkpoint.pt")
    assert len(ckpt["rng"]) == 2  # both ranks' generator states
    assert len(straight[0]["losses"]) == 128 // 32  # global batch 32 = 2 x 16


@pytest.mark.e2e
@pytest.mark.dist
@pytest.mark.parametrize("device", TWO_PROCESS)
def test_two_process_zero_trains_like_ddp_and_resumes(tmp_path, device):
    """--zero (optimizer state sharded over the 2 processes) trains the losses of plain DDP,
    keeps about half of the state on rank 0, saves the full state (that of plain DDP, which a
    run without --zero or with one process loads) and resumes exactly."""
    plain, _ = torchrun(tmp_path / "ddp", device)
    zero, out = torchrun(tmp_path / "zero", device, "--zero")
    shard = re.search(r"rank 0 keeps the optimizer state of ([\d.]+)M of the ([\d.]+)M", out)
    assert shard and 0.3 < float(shard[1]) / float(shard[2]) < 0.7, out
    for a, b in zip(plain, zero, strict=True):  # bit-identical on the CPU
        assert b["losses"] == pytest.approx(a["losses"], rel=1e-5, abs=1e-6)
    full = load_checkpoint(tmp_path / "ddp" / "checkpoint.pt")["optimizer"]
    sharded = load_checkpoint(tmp_path / "zero" / "checkpoint.pt")["optimizer"]
    assert sharded["param_groups"] == full["param_groups"]
    torch.testing.assert_close(sharded["state"], full["state"], rtol=1e-4, atol=1e-6)

    torchrun(tmp_path / "b", device, "--zero", "--stop-after-epoch", "1")
    shutil.copytree(tmp_path / "b", tmp_path / "one")
    resumed, _ = torchrun(tmp_path / "b", device, "--zero", "--resume", "auto")
    assert [r["losses"] for r in resumed] == [r["losses"] for r in zero]
    # and one process without --zero resumes it (with fresh random streams, hence other
    # losses; the state is complete, as compared above)
    one = train(
        tmp_path / "one",
        "--device",
        device,
        "--model",
        "sret_mini",
        "--epochs",
        "2",
        "--limit-train",
        "128",
        "--resume",
        "auto",
    )
    assert [r["epoch"] for r in one] == [1, 2] and math.isfinite(one[1]["train_loss"])


@pytest.mark.parametrize("config", sorted((REPO / "configs" / "vision").glob("*.yaml")))
def test_shipped_configs_parse_and_build(config):
    from recurnmt.vision import create_model
    from recurnmt.vision.data import SPECS
    from recurnmt.vision.training.arguments import parse_args

    args = parse_args(["--config", str(config)])
    spec = SPECS[args.data]
    if args.finetune:  # the model comes from the checkpoint
        assert args.img_size == (384, 384) and args.weight_decay == 0.0
        return
    with torch.device("meta"):
        model = create_model(
            args.model,
            **args.model_args,
            num_classes=spec.num_classes,
            in_chans=spec.in_chans,
            img_size=args.img_size or spec.img_size,
        )
    assert model.num_classes == spec.num_classes
    assert args.batch_size % args.accum_steps == 0
