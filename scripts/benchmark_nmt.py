"""Speed and memory of recurnmt's translation models against fairseq's own transformer.

Every architecture is built with the same width, FFN width, heads and depth (levels), trained
for a fixed number of updates on the same real batches (the embedded German-English corpus)
and then decodes the same test sentences with beam search at a fixed output length. Each
model runs in a fresh process so that peak memory is its own. The table reports absolute
figures and ratios to fairseq's ``transformer``:

* training target tokens per second (forward + backward + Adam step);
* generation sentences per second (beam search with the incremental decoder);
* memory: on CUDA the peak ``max_memory_allocated`` of training; on CPU, where no allocator
  keeps a peak, the activations one training forward saves for backward
  (:mod:`recurnmt.analysis.memory`), which is deterministic; ``ckpt mem`` is the same with
  fairseq's ``--checkpoint-activations`` (per level in recurnmt's stacks);
* parameters (all) and P* (without embeddings and output projection).

    python scripts/benchmark_nmt.py                      # CPU-sized default
    python scripts/benchmark_nmt.py --device cuda --embed-dim 512 --ffn-dim 2048 --heads 8
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from recurnmt.analysis.benchmark import (  # noqa: E402
    Column,
    emit,
    fixed_length_generator,
    forward_flags,
    load_batches,
    nmt_model_flags,
    ratio_table,
    run_workers,
    sync,
)
from recurnmt.cli import entry_point  # noqa: E402
from recurnmt.nmt.results import FAMILY_ORDER  # noqa: E402

BASELINE = "transformer"
WORKER_OPTIONS = (
    "data",
    "device",
    "embed_dim",
    "ffn_dim",
    "heads",
    "levels",
    "max_tokens",
    "warmup",
    "steps",
    "sentences",
    "gen_batch",
    "beam",
    "decode_len",
    "threads",
    "seed",
)
DEFAULT_ARCHS = list(FAMILY_ORDER)  # fairseq's transformer, then recurnmt's families


def training_memory_mb(model, criterion, sample, device) -> float:
    """Memory of one training step: the CUDA peak, or on CPU the bytes saved for backward."""
    import torch

    if device.type == "cuda":
        from fairseq import utils

        sample = utils.move_to_cuda(sample, device)
        torch.cuda.reset_peak_memory_stats(device)
        criterion(model, sample)[0].backward()
        model.zero_grad(set_to_none=True)
        sync(device)
        return torch.cuda.max_memory_allocated(device) / 2**20
    from recurnmt.analysis.memory import saved_for_backward_bytes

    loss, saved = saved_for_backward_bytes(lambda: criterion(model, sample)[0])
    loss.backward()
    model.zero_grad(set_to_none=True)
    return saved / 2**20


def worker(opts: argparse.Namespace) -> dict:
    """Benchmarks one architecture in this process; returns its figures."""
    import torch
    from fairseq import utils

    from recurnmt.nmt.build import build_model
    from recurnmt.parameters import parameter_report

    torch.manual_seed(opts.seed)
    if opts.threads:
        torch.set_num_threads(opts.threads)
    device = torch.device(opts.device)
    task, train_batches = load_batches(
        opts.data, "train", opts.max_tokens, opts.steps + opts.warmup, opts.seed
    )
    _, test_batches = load_batches(opts.data, "test", 100000, 1, opts.seed)
    model, args, _ = build_model(
        opts.arch, nmt_model_flags(opts.arch, opts), task.source_dictionary
    )
    model.to(device)
    params = parameter_report(model)
    criterion = task.build_criterion(args)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98))

    def step(sample) -> int:
        sample = utils.move_to_cuda(sample, device) if device.type == "cuda" else sample
        loss, _, _ = criterion(model, sample)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return int(sample["ntokens"])

    model.train()
    for sample in train_batches[: opts.warmup]:
        step(sample)
    sync(device)
    tokens, start = 0, time.perf_counter()
    for sample in train_batches[opts.warmup :]:
        tokens += step(sample)
    sync(device)
    train_time = time.perf_counter() - start
    peak_mb = training_memory_mb(model, criterion, train_batches[-1], device)
    # the same weights with fairseq's --checkpoint-activations (per level in our stacks)
    ckpt_model, _, _ = build_model(
        opts.arch,
        [*nmt_model_flags(opts.arch, opts), "--checkpoint-activations"],
        task.source_dictionary,
    )
    ckpt_model.load_state_dict(model.state_dict())
    ckpt_model.to(device).train()
    ckpt_mb = training_memory_mb(ckpt_model, criterion, train_batches[-1], device)
    del ckpt_model

    model.eval()
    sample = test_batches[0]
    src = sample["net_input"]["src_tokens"][: opts.sentences].to(device)
    lengths = sample["net_input"]["src_lengths"][: opts.sentences].to(device)
    generator = fixed_length_generator(model, task, opts.beam, opts.decode_len)
    with torch.no_grad():
        generator.generate(
            [model], {"net_input": {"src_tokens": src[:2], "src_lengths": lengths[:2]}}
        )
        sync(device)
        start = time.perf_counter()
        for i in range(0, src.size(0), opts.gen_batch):
            batch = {
                "src_tokens": src[i : i + opts.gen_batch],
                "src_lengths": lengths[i : i + opts.gen_batch],
            }
            generator.generate([model], {"net_input": batch})
        sync(device)
    gen_time = time.perf_counter() - start
    return {
        "arch": opts.arch,
        "train_tokens_per_s": tokens / train_time,
        "gen_sentences_per_s": src.size(0) / gen_time,
        "peak_mem_mb": peak_mb,
        "ckpt_mem_mb": ckpt_mb,
        "params": params.total,
        "p_star": params.p_star,
    }


PROG = "python scripts/benchmark_nmt.py"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--archs", nargs="+", default=DEFAULT_ARCHS)
    parser.add_argument("--data", type=Path, default=ROOT / "data-bin/lohelp_de_en")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--embed-dim", type=int, default=256)
    parser.add_argument("--ffn-dim", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--levels", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=2048)
    parser.add_argument("--warmup", type=int, default=2, help="untimed updates")
    parser.add_argument("--steps", type=int, default=12, help="timed updates")
    parser.add_argument("--sentences", type=int, default=64, help="sentences to decode")
    parser.add_argument("--gen-batch", type=int, default=16)
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--decode-len", type=int, default=24, help="fixed output length")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json-out", type=Path, help="also write the results as JSON")
    parser.add_argument("--arch", help=argparse.SUPPRESS)  # worker mode
    opts = parser.parse_args(argv)

    if opts.arch:
        emit(worker(opts))
        return
    from recurnmt.nmt.build import check_arch  # fairseq: not before a worker needs it

    for arch in opts.archs:
        check_arch(arch)  # before any data preparation or worker
    if not (opts.data / "dict.en.txt").exists():
        subprocess.run(
            [sys.executable, "-m", "data_prep.embedded", "prepare", "--out", str(opts.data)],
            check=True,
            cwd=ROOT,
        )
    if BASELINE not in opts.archs:
        opts.archs.insert(0, BASELINE)
    shared = forward_flags(opts, WORKER_OPTIONS)
    results = run_workers(Path(__file__), "--arch", opts.archs, shared, ROOT)
    print_table(results, opts)
    if opts.json_out:
        opts.json_out.write_text(json.dumps(results, indent=2))


def print_table(results: list[dict], opts: argparse.Namespace) -> None:
    print(
        f"\nH={opts.embed_dim} FF={opts.ffn_dim} heads={opts.heads} levels={opts.levels} "
        f"device={opts.device}; ratios are to fairseq's `{BASELINE}`\n"
    )
    columns = [
        Column("train tok/s", "train_tokens_per_s", ".0f"),
        Column("gen sent/s", "gen_sentences_per_s", ".1f"),
        Column("mem MB", "peak_mem_mb", ".0f"),
        Column("ckpt mem MB", "ckpt_mem_mb", ".0f"),
        Column("params", "params", ".2f", ratio=False, scale=1e6, suffix="M"),
        Column("P*", "p_star", ".2f", scale=1e6, suffix="M"),
    ]
    print(ratio_table(results, "arch", columns))


if __name__ == "__main__":
    sys.exit(entry_point(main, PROG)())
