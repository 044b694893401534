"""The multi-process launcher: the flags it builds and the configurations it refuses.

Fast: no process is started. The real 2-process runs are in ``test_distributed_nmt.py``.
"""

from __future__ import annotations

import pytest

from recurnmt.experiments import launch
from recurnmt.experiments.commands import user_dir
from recurnmt.experiments.launch import (
    LaunchPlan,
    device_flags,
    rank_commands,
    torchrun_command,
    worker_argv,
)
from recurnmt.modules import ConfigError
from recurnmt.nmt.build import arch_train_args
from recurnmt.nmt.distributed_checks import check_distributed, distributed_problems
from tests.nmt_helpers import build

LS = ["--criterion", "label_smoothed_cross_entropy"]
GOOD_CPU = [
    "--cpu",
    "--distributed-backend",
    "gloo",
    "--ddp-backend",
    "legacy_ddp",
    "--distributed-no-spawn",
    "--distributed-init-method",
    "tcp://127.0.0.1:1",
]
TORCHRUN = {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"}
TORCHRUN_FULL = {**TORCHRUN, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


def args(*flags: str):
    return arch_train_args("ringformer_tiny", [*LS, *flags])


def problems(a, **kw) -> str:
    kw.setdefault("environ", {})
    kw.setdefault("cuda_available", False)
    return "\n".join(distributed_problems(a, **kw))


# --- what check_distributed refuses ------------------------------------------------------------


def test_a_working_cpu_configuration_passes():
    check_distributed(args(*GOOD_CPU), world_size=2, environ={}, cuda_available=False)
    check_distributed(args("--cpu"), world_size=1, environ={}, cuda_available=False)


def test_torchrun_without_world_size_is_refused():
    msg = problems(args("--cpu"), world_size=1, environ=TORCHRUN)
    assert "torchrun started 2 processes" in msg and "same --save-dir" in msg
    assert "recurnmt-train-nmt --nproc 2" in msg
    # the same processes with the world size given are fine
    assert problems(args(*GOOD_CPU), world_size=2, environ=TORCHRUN) == ""


def test_slurm_tasks_without_world_size_are_refused():
    env = {"SLURM_NTASKS": "4", "SLURM_PROCID": "1"}
    assert "SLURM started 4 tasks" in problems(args("--cpu"), world_size=1, environ=env)


@pytest.mark.parametrize("backend", ["pytorch_ddp", "c10d"])
def test_pytorch_ddp_on_cpu_is_refused(backend):
    flags = [f for f in GOOD_CPU if f != "legacy_ddp"]
    flags[flags.index("--ddp-backend") + 1 : flags.index("--ddp-backend") + 1] = [backend]
    msg = problems(args(*flags), world_size=2)
    assert f"--ddp-backend {backend} does not work on CPU" in msg and "legacy_ddp" in msg


def test_nccl_on_cpu_is_refused():
    flags = [f if f != "gloo" else "nccl" for f in GOOD_CPU]
    assert "use --distributed-backend gloo on CPU" in problems(args(*flags), world_size=2)


def test_fairseq_spawn_on_cpu_is_refused():
    flags = [f for f in GOOD_CPU if f != "--distributed-no-spawn"]
    assert "exits 0 without training" in problems(args(*flags), world_size=2)


def test_unsummable_criterion_on_cpu_is_refused(monkeypatch):
    from fairseq.criterions import CRITERION_REGISTRY

    class Gathered:  # fairseq's default: logging outputs gathered, not summed
        @staticmethod
        def logging_outputs_can_be_summed() -> bool:
            return False

    monkeypatch.setitem(CRITERION_REGISTRY, "gathered", Gathered)
    a = args(*GOOD_CPU)
    a.criterion = "gathered"
    msg = problems(a, world_size=2)
    assert "all_gather_list" in msg and "CUDA tensor" in msg
    gpu = arch_train_args("ringformer_tiny", ["--distributed-no-spawn"])
    gpu.criterion = "gathered"
    assert problems(gpu, world_size=2, cuda_available=True) == ""  # on GPUs it works
    # recurnmt's criterion sums its logging outputs (LRC values with a count)
    assert problems(arch_train_args("ringformer_tiny", GOOD_CPU), world_size=2) == ""


@pytest.mark.parametrize("flag", ["--fp16", "--amp", "--memory-efficient-fp16"])
def test_half_precision_on_cpu_is_refused(flag):
    assert "needs CUDA" in problems(args("--cpu", flag), world_size=1)


@pytest.mark.parametrize("flag", ["--bf16", "--memory-efficient-bf16"])
@pytest.mark.parametrize("cuda", [False, True])
def test_bf16_training_is_refused_without_a_tpu(flag, cuda):
    """fairseq-train's --bf16 means --tpu, on a GPU machine too (fairseq/options.py)."""
    text = problems(args(flag), world_size=1, cuda_available=cuda)
    assert f"{flag} needs a TPU" in text and "xla_device" in text and "needs CUDA" not in text


def test_generation_from_a_gpu_checkpoint_is_not_refused():
    """At generation, build_model sees the training run's args (GPU, fp16, 8 processes,
    pytorch_ddp, nccl) on a machine without CUDA: nothing of that applies any more."""
    a = arch_train_args(
        "ringformer_tiny", ["--fp16", "--distributed-world-size", "8", "--distributed-no-spawn"]
    )
    assert distributed_problems(a, environ={}, cuda_available=False) == []


def test_every_problem_is_named_in_one_error():
    swap = {"gloo": "nccl", "legacy_ddp": "c10d"}
    flags = [swap.get(f, f) for f in GOOD_CPU]
    with pytest.raises(ConfigError) as err:
        check_distributed(args(*flags, "--fp16"), world_size=2, environ={}, cuda_available=False)
    text = str(err.value)
    assert len(text.splitlines()) == 3 and "--fp16" in text and "nccl" in text and "c10d" in text


def test_build_model_refuses_torchrun_without_world_size(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match="torchrun started 2 processes"):
        build("ringformer_tiny")
    monkeypatch.delenv("WORLD_SIZE")
    build("ringformer_tiny")


# --- the flags the launcher builds -------------------------------------------------------------


def test_cpu_flags_are_added_unless_given():
    plan = LaunchPlan(nproc=2, device="cpu")
    every_rank_reads = "--load-checkpoint-on-all-dp-ranks"
    assert device_flags(plan, ["DATA"]) == [
        "--cpu",
        "--distributed-backend",
        "gloo",
        "--ddp-backend",
        "legacy_ddp",
        every_rank_reads,
    ]
    assert device_flags(plan, ["DATA", "--cpu", "--ddp-backend=no_c10d", every_rank_reads]) == [
        "--distributed-backend",
        "gloo",
    ]
    assert device_flags(LaunchPlan(device="cpu"), ["DATA"]) == ["--cpu"]
    assert device_flags(LaunchPlan(nproc=2, device="cuda"), ["D"]) == [
        "--distributed-backend",
        "nccl",
        every_rank_reads,
    ]


@pytest.mark.parametrize(
    "flag", ["--distributed-world-size", "--distributed-rank=1", "--device-id"]
)
def test_flags_owned_by_the_launcher_are_refused(flag):
    with pytest.raises(ConfigError, match="the launcher sets"):
        device_flags(LaunchPlan(nproc=2), ["DATA", flag, "1"])


def test_cpu_flag_contradicts_cuda():
    with pytest.raises(ConfigError, match="--cpu contradicts --device cuda"):
        device_flags(LaunchPlan(device="cuda"), ["DATA", "--cpu"])


def test_rank_commands_on_two_nodes():
    plan = LaunchPlan(nproc=2, nnodes=2, node_rank=1, master_addr="10.0.0.1", master_port=7)
    cmds = rank_commands(plan, ["DATA", "--arch", "x"], port=7)
    assert len(cmds) == 2
    for local, cmd in enumerate(cmds):
        flags = dict(zip(cmd, cmd[1:], strict=False))
        assert flags["--distributed-world-size"] == "4"
        assert flags["--distributed-rank"] == str(2 + local)
        assert flags["--distributed-init-method"] == "tcp://10.0.0.1:7"
        assert "--distributed-no-spawn" in cmd and "--cpu" in cmd
        assert cmd[-2:] == ["--log-format", "none"]  # no rank 0 here: no progress bar
    first = rank_commands(LaunchPlan(nproc=2), ["DATA", "--log-format", "tqdm"], port=7)
    assert "none" not in first[0] and first[1][-2:] == ["--log-format", "none"]
    gpu = rank_commands(LaunchPlan(nproc=2, device="cuda"), ["DATA"], port=9)
    assert [c[c.index("--device-id") + 1] for c in gpu] == ["0", "1"]
    assert rank_commands(LaunchPlan(), ["DATA"], port=0)[0][-2:] == ["DATA", "--cpu"]


def test_torchrun_command_and_worker_flags():
    plan = LaunchPlan(nproc=2, nnodes=2, node_rank=1, master_addr="h", master_port=5)
    cmd = torchrun_command(plan, ["DATA", "--arch", "x"], port=5)
    joined = " ".join(cmd)
    assert "--nnodes 2 --node-rank 1 --nproc-per-node 2 --master-addr h --master-port 5" in joined
    assert joined.endswith(
        "-m recurnmt.experiments.launch --torchrun-worker --device cpu -- DATA --arch x"
    )
    env = {**TORCHRUN_FULL, "WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "1"}
    argv = worker_argv(["DATA"], "cuda", env)
    assert argv[argv.index("--distributed-rank") + 1] == "3"
    assert argv[argv.index("--distributed-world-size") + 1] == "4"
    assert argv[argv.index("--device-id") + 1] == "1"
    assert "env://" in argv and "--distributed-no-spawn" in argv
    assert argv[-2:] == ["--log-format", "none"]  # rank 3: rank 0 alone draws the bar
    cpu = worker_argv(["DATA"], "cpu", TORCHRUN_FULL)
    assert {"--cpu", "gloo", "legacy_ddp"} <= set(cpu)
    with pytest.raises(ConfigError, match="runs under torchrun"):
        worker_argv(["DATA"], "cpu", {})


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(nproc=0), "must be >= 1"),
        (dict(nnodes=2, node_rank=2, master_port=1), "--node-rank 2"),
        (dict(nnodes=2), "--master-port"),
        (dict(device="tpu"), "--device"),
    ],
)
def test_impossible_plans_are_refused(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        LaunchPlan(**kwargs)


def test_cuda_plan_without_gpus_is_refused(monkeypatch):
    monkeypatch.setattr(launch.torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ConfigError, match="--nproc 2 processes on 1 visible GPU"):
        launch.check_launch(LaunchPlan(nproc=2, device="cuda"), ["DATA"])
    monkeypatch.setattr(launch.torch.cuda, "device_count", lambda: 0)
    with pytest.raises(ConfigError, match="no CUDA device"):
        launch.check_launch(LaunchPlan(device="cuda"), ["DATA"])


def test_main_dry_run_and_refusal(capsys):
    train = ["DATA", "--user-dir", str(user_dir()), "--arch", "ringformer_tiny", *LS]
    assert launch.main(["--nproc", "2", "--device", "cpu", "--dry-run", "--", *train]) == 0
    out = capsys.readouterr().out
    assert out.count("$ ") == 2 and "--distributed-rank 1" in out
    refused = ["--nproc", "2", "--device", "cpu", "--", *train, "--ddp-backend", "pytorch_ddp"]
    with pytest.raises(ConfigError, match="--ddp-backend pytorch_ddp does not work on CPU"):
        launch.main(refused)
    assert launch.cli(refused) == 2
    err = capsys.readouterr().err
    assert err.startswith("recurnmt-train-nmt: error: refusing this fairseq training")
    assert "--ddp-backend pytorch_ddp does not work on CPU" in err


def test_a_failing_rank_stops_the_others():
    """A rank that dies would leave the others waiting in a collective forever."""
    import sys
    import time

    start = time.time()
    fail = [sys.executable, "-c", "import sys; sys.exit(3)"]
    hang = [sys.executable, "-c", "import time; time.sleep(60)"]
    assert launch.supervise([hang, fail], env={}) == 3
    assert time.time() - start < 10
    assert launch.supervise([[sys.executable, "-c", "pass"]] * 2, env={}) == 0
