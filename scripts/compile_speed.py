"""Training-step time with ``--compile`` against eager, the two taking turns in one process.

Builds one translation model (``--arch`` at the benchmarks' size flags, random tokens of a
toy vocabulary) and one image model (``--vision-model``, random images), each twice with the
same weights: eager, and compiled as the commands compile them (the NMT stacks through the
model option ``--compile BACKEND``, the image model whole, as ``python -m
recurnmt.vision.training.train --compile`` does). One step is a forward and backward pass on a fixed
batch (no optimiser: compilation changes the passes only). The first compiled step compiles;
its wall time is reported (inductor compiles in worker processes, outside this process's CPU
time). Then, in ``--rounds`` rounds, eager and compiled each run ``--steps`` steps in turn,
and the table gives the process CPU time per step of each one's fastest round and their
ratio: CPU time on one thread, interleaved, holds on a machine that other jobs share.

    python scripts/compile_speed.py                       # inductor, both models
    python scripts/compile_speed.py --compile aot_eager --tasks nmt
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

from recurnmt.cli import entry_point
from recurnmt.experiments.experiment import add_size_arguments

PROG = "python scripts/compile_speed.py"
TASKS = ("nmt", "vision")


def nmt_steps(opts: argparse.Namespace) -> tuple[Callable[[], None], Callable[[], None]]:
    """The eager and the compiled training step of the translation model."""
    import torch

    from recurnmt.experiments.benchmark import nmt_model_flags, random_token_batch
    from recurnmt.nmt.build import build_model, toy_dictionary

    dictionary = toy_dictionary(opts.vocab)
    flags = nmt_model_flags(opts.arch, argparse.Namespace(**vars(opts), device="cpu"))
    torch.manual_seed(0)
    eager = build_model(opts.arch, flags, dictionary)[0].train()
    compiled = build_model(opts.arch, [*flags, "--compile", opts.compile], dictionary)[0].train()
    compiled.load_state_dict(eager.state_dict())
    src, lengths, prev = random_token_batch(dictionary, opts.batch, opts.length)

    def step(model: torch.nn.Module) -> Callable[[], None]:
        def run() -> None:
            model.zero_grad(set_to_none=True)
            model(src, lengths, prev)[0].logsumexp(-1).mean().backward()

        return run

    return step(eager), step(compiled)


def vision_steps(opts: argparse.Namespace) -> tuple[Callable[[], None], Callable[[], None]]:
    """The eager and the compiled training step of the image model."""
    import torch

    from recurnmt.flags import compile_settings
    from recurnmt.vision import create_model
    from recurnmt.vision.training.losses import ClassificationLoss

    torch.manual_seed(0)
    model = create_model(opts.vision_model, num_classes=10).train()
    settings = compile_settings(opts.compile)
    compiled = torch.compile(model, backend=settings.backend)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(opts.images, 3, *model.img_size, generator=g)
    y = torch.randint(0, 10, (opts.images,), generator=g)

    def step(net: torch.nn.Module) -> Callable[[], None]:
        def run() -> None:
            model.zero_grad(set_to_none=True)
            ClassificationLoss()(net(x), y).backward()  # a DVT cascade: every exit

        return run

    return step(model), step(compiled)


def measure(name: str, eager: Callable, compiled: Callable, opts: argparse.Namespace) -> str:
    """A table row: compile wall time, eager and compiled CPU ms per step, their ratio."""
    eager()  # warm-up
    start = time.perf_counter()
    compiled()  # compiles
    compile_s = time.perf_counter() - start
    best = {"eager": float("inf"), "compiled": float("inf")}
    for _ in range(opts.rounds):
        for key, step in (("eager", eager), ("compiled", compiled)):
            t0 = time.process_time()
            for _ in range(opts.steps):
                step()
            best[key] = min(best[key], (time.process_time() - t0) / opts.steps)
    ratio = best["eager"] / best["compiled"]
    return (
        f"| {name} | {compile_s:.1f} | {1e3 * best['eager']:.1f} | "
        f"{1e3 * best['compiled']:.1f} | {ratio:.2f} |"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", nargs="+", choices=TASKS, default=list(TASKS))
    parser.add_argument(
        "--compile", default="inductor", metavar="BACKEND", help="torch.compile backend"
    )
    parser.add_argument("--arch", default="ringformer")
    add_size_arguments(parser, pre_ln=None, heads=4)
    parser.add_argument("--vocab", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=32, help="sentences")
    parser.add_argument("--length", type=int, default=30, help="tokens per sentence")
    parser.add_argument("--vision-model", default="ringformer_vit_mini_patch4")
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5, help="steps per round")
    opts = parser.parse_args(argv)
    if opts.rounds < 1 or opts.steps < 1:
        parser.error(f"--rounds {opts.rounds} --steps {opts.steps}: at least 1 each")

    import logging

    # before fairseq's import: its notes, and inductor's file-lock debug lines, stay quiet
    logging.basicConfig(handlers=[logging.NullHandler()], level=logging.WARNING)
    import torch

    from recurnmt.flags import compile_settings
    from recurnmt.nmt.build import check_arch

    compile_settings(opts.compile)  # an unknown backend fails before any work, naming --compile
    check_arch(opts.arch)
    torch.set_num_threads(1)
    print(f"`--compile {opts.compile}`: {opts.rounds} rounds of {opts.steps} training steps\n")
    print("| model | compile (wall s) | eager (CPU ms/step) | compiled (CPU ms/step) | speed-up |")
    print("| --- | --- | --- | --- | --- |")
    if "nmt" in opts.tasks:
        name = f"`{opts.arch}`, {opts.levels} levels, {opts.batch} x {opts.length} tokens"
        print(measure(name, *nmt_steps(opts), opts), flush=True)
    if "vision" in opts.tasks:
        name = f"`{opts.vision_model}`, {opts.images} images"
        print(measure(name, *vision_steps(opts), opts), flush=True)


if __name__ == "__main__":
    sys.exit(entry_point(main, PROG)())
