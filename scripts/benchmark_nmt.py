"""Speed and memory of recurnmt's translation models against fairseq's own transformer.

Every architecture is built with the same width, FFN width, heads and depth (levels), trained
for a fixed number of updates on the same real batches (the embedded German-English corpus)
and then decodes the same test sentences with beam search at a fixed output length. Each
model runs in a fresh process so that peak memory is its own, and the processes take turns
on the machine (:class:`recurnmt.experiments.benchmark.Turns`): one timed round of one model
at a time, every model's rounds spread over the whole run, so that the machine's drift
falls on all of them alike (``--sequential``: one model after another, as before). The
table reports absolute figures and ratios to fairseq's ``transformer``:

* training target tokens per second (forward + backward + Adam step), the fastest of
  ``--train-rounds`` passes over the same ``--steps`` batches;
* training FLOPs (matrix products: linear layers, attention, output projection; counted by
  ``torch.utils.flop_counter`` over the timed batches) per target token, and the FLOP rate the
  timed steps reached: a family that computes more per token (SReT's non-linear projections)
  shows it here, and ``GFLOP/s`` says how efficiently each model runs what it computes;
* generation sentences per second (beam search with the incremental decoder);
* memory: on CUDA the peak ``max_memory_allocated`` of training; on CPU, where no allocator
  keeps a peak, the activations one training forward saves for backward
  (:mod:`recurnmt.experiments.activation_memory`), which is deterministic; ``ckpt mem`` is the same with
  fairseq's ``--checkpoint-activations`` (per level in recurnmt's stacks);
* the decoder's incremental cache after beam search decoded one batch (``--gen-batch``
  sentences): all of it, and its cross-attention part (the projected encoder keys and
  values: once per layer in fairseq, once per unique block in a weight-shared decoder);
* parameters (all) and P* (without embeddings and output projection).

``--dtype bf16`` / ``fp16`` trains under ``torch.autocast`` (fp16 with a loss scaler, CUDA
only) and generates with the weights cast to the dtype, as ``fairseq-generate --fp16`` does
(fairseq's own ``--bf16`` implies ``--tpu``, so bf16 on CUDA is this cast). ``--json OUT``
writes the figures with the device, versions and settings.

    python scripts/benchmark_nmt.py                      # CPU-sized default
    python scripts/benchmark_nmt.py --device cuda --dtype fp16 --embed-dim 512 --ffn-dim 2048 \
        --heads 8 --json nmt.json
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import torch

from recurnmt.cli import entry_point
from recurnmt.device import resolve_device
from recurnmt.experiments.benchmark import (
    Column,
    MixedPrecision,
    add_device_arguments,
    add_sequential_argument,
    emit,
    fastest_round,
    fixed_length_generator,
    forward_flags,
    load_batches,
    load_generation_batches,
    nmt_model_flags,
    peak_memory_mb,
    ratio_table,
    run_workers,
    start_worker,
    storage_bytes,
    training_flops,
    training_step,
    write_json,
)
from recurnmt.experiments.experiment import add_size_arguments
from recurnmt.experiments.results import family_order

ROOT = Path(__file__).resolve().parent.parent

BASELINE = "transformer"
WORKER_OPTIONS = (
    "data",
    "device",
    "dtype",
    "embed_dim",
    "ffn_dim",
    "heads",
    "levels",
    "max_tokens",
    "warmup",
    "steps",
    "train_rounds",
    "sentences",
    "gen_batch",
    "gen_rounds",
    "beam",
    "decode_len",
    "threads",
    "seed",
)
DEFAULT_ARCHS = list(family_order())  # fairseq's transformer, then recurnmt's families


def cross_attention_count(decoder) -> int:
    """Distinct cross-attention modules of a decoder: one per layer in fairseq's transformer,
    one per unique block in a weight-shared stack (``modules()`` lists a shared one once)."""
    from fairseq.modules import MultiheadAttention

    from recurnmt.modules.attention import CrossAttention

    return sum(
        isinstance(m, CrossAttention)
        or (isinstance(m, MultiheadAttention) and m.encoder_decoder_attention)
        for m in decoder.modules()
    )


def decoder_cache_bytes(decoder, state: dict) -> tuple[int, int]:
    """Bytes of one incremental decoding state: (all of it, the cross-attention part).

    fairseq's layers keep ``{attention id}.attn_state`` entries, the cross-attention ones
    holding the projected encoder keys and values; recurnmt's decoder keeps one
    :class:`~recurnmt.modules.StackCache`, whose ``memory`` holds them per unique block.
    """
    from fairseq.modules import MultiheadAttention

    from recurnmt.modules import StackCache

    cross_ids = {
        m._incremental_state_id
        for m in decoder.modules()
        if isinstance(m, MultiheadAttention) and m.encoder_decoder_attention
    }
    cross = []
    for key, value in state.items():
        if isinstance(value, StackCache):
            cross.append(value.memory)
        elif key.split(".")[0] in cross_ids:
            cross.append(value)
    return storage_bytes(state), storage_bytes(cross)


class StateCapture:
    """Keeps the incremental states of a fairseq ``SequenceGenerator``'s latest decoder call
    (the generator builds them inside ``generate`` and drops them on return)."""

    def __init__(self, generator) -> None:
        self.states: list[dict] = []
        ensemble = generator.model
        forward_decoder = ensemble.forward_decoder

        def capture(tokens, encoder_outs, incremental_states, temperature=1.0):
            self.states = incremental_states
            return forward_decoder(tokens, encoder_outs, incremental_states, temperature)

        ensemble.forward_decoder = capture


def worker(opts: argparse.Namespace) -> dict:
    """Benchmarks one architecture in this process; returns its figures."""
    turns, device, precision = start_worker(opts)
    from fairseq import utils

    from recurnmt.nmt.build import build_model
    from recurnmt.parameters import parameter_report

    task, train_batches = load_batches(
        opts.data, "train", opts.max_tokens, opts.steps + opts.warmup, opts.seed
    )
    model, args, _ = build_model(
        opts.arch, nmt_model_flags(opts.arch, opts), task.source_dictionary
    )
    model.to(device)
    params = parameter_report(model)
    criterion = task.build_criterion(args)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98))
    scaler = precision.scaler()

    def on_device(sample):
        return utils.move_to_cuda(sample, device) if device.type == "cuda" else sample

    def loss_of(net, sample):
        with precision.autocast():
            return criterion(net, on_device(sample))[0]

    def step(sample) -> None:
        training_step(loss_of(model, sample), optimizer, scaler)

    def train_round() -> None:
        for sample in train_batches[opts.warmup :]:
            step(sample)

    model.train()
    for sample in train_batches[: opts.warmup]:
        step(sample)
    tokens = sum(int(sample["ntokens"]) for sample in train_batches[opts.warmup :])
    train_time = fastest_round(turns, opts.train_rounds, train_round, device)
    last = train_batches[-1]
    peak_mb = peak_memory_mb(lambda: loss_of(model, last), device)
    model.zero_grad(set_to_none=True)
    # what the timed steps compute: matrix-product FLOPs per target token of the timed batches
    flops = sum(training_flops(lambda s=s: loss_of(model, s)) for s in train_batches[opts.warmup :])
    model.zero_grad(set_to_none=True)
    # the same weights with fairseq's --checkpoint-activations (per level in our stacks)
    ckpt_model, _, _ = build_model(
        opts.arch,
        [*nmt_model_flags(opts.arch, opts), "--checkpoint-activations"],
        task.source_dictionary,
    )
    ckpt_model.load_state_dict(model.state_dict())
    ckpt_model.to(device).train()
    ckpt_mb = peak_memory_mb(lambda: loss_of(ckpt_model, last), device)
    ckpt_model = optimizer = None  # their memory is free for generation

    # generation as fairseq-generate --fp16 / --bf16 runs it: the weights cast to the dtype
    model.to(precision.dtype)
    model.eval()
    batches = [
        {key: value.to(device) for key, value in batch.items()}
        for batch in load_generation_batches(opts.data, opts.sentences, opts.gen_batch)
    ]
    sentences = sum(batch["src_tokens"].size(0) for batch in batches)
    generator = fixed_length_generator(model, task, opts.beam, opts.decode_len)
    capture = StateCapture(generator)

    def generate(batch: dict) -> None:
        generator.generate([model], {"net_input": batch})

    def generate_all() -> None:
        for batch in batches:
            generate(batch)

    with torch.no_grad():
        generate(batches[0])  # untimed: the first full batch allocates what later reuse
        gen_time = fastest_round(turns, opts.gen_rounds, generate_all, device)
        generate(batches[0])  # the state of one full batch, kept by the capture
        cache, cross_cache = decoder_cache_bytes(model.decoder, capture.states[0])
    return {
        "arch": opts.arch,
        "train_tokens_per_s": tokens / train_time,
        "train_flops_per_token": flops / tokens,
        "train_flops_per_s": flops / train_time,
        "gen_sentences_per_s": sentences / gen_time,
        "peak_mem_mb": peak_mb,
        "ckpt_mem_mb": ckpt_mb,
        "cache_mb": cache / 2**20,
        "cross_cache_mb": cross_cache / 2**20,
        "cross_attentions": cross_attention_count(model.decoder),
        "levels": opts.levels,
        "params": params.total,
        "p_star": params.p_star,
    }


PROG = "python scripts/benchmark_nmt.py"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--archs", nargs="+", default=DEFAULT_ARCHS)
    parser.add_argument("--data", type=Path, default=ROOT / "data-bin/lohelp_de_en")
    add_device_arguments(
        parser, "; generation casts the weights to it, as fairseq-generate --fp16 does"
    )
    add_size_arguments(parser, pre_ln=None, embed_dim=256, ffn_dim=1024, heads=4)
    parser.add_argument("--max-tokens", type=int, default=2048)
    parser.add_argument("--warmup", type=int, default=2, help="untimed updates")
    parser.add_argument("--steps", type=int, default=12, help="timed updates per round")
    parser.add_argument(
        "--train-rounds",
        type=int,
        default=3,
        help="timed training rounds over the same batches (the fastest counts)",
    )
    parser.add_argument("--sentences", type=int, default=64, help="sentences to decode")
    parser.add_argument("--gen-batch", type=int, default=16)
    parser.add_argument(
        "--gen-rounds", type=int, default=3, help="timed generation rounds (the fastest counts)"
    )
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--decode-len", type=int, default=24, help="fixed output length")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--seed", type=int, default=1)
    add_sequential_argument(parser)
    parser.add_argument(
        "--json", "--json-out", dest="json", type=Path, help="also write the results as JSON"
    )
    parser.add_argument("--arch", help=argparse.SUPPRESS)  # worker mode
    opts = parser.parse_args(argv)

    if opts.arch:
        emit(worker(opts))
        return
    for flag in ("gen_rounds", "train_rounds"):
        if getattr(opts, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} {getattr(opts, flag)}: at least one round")
    opts.device = str(resolve_device(opts.device))  # before any worker starts
    MixedPrecision.build(opts.dtype, torch.device(opts.device))
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
    results = run_workers(
        Path(__file__), "--arch", opts.archs, shared, ROOT, sequential=opts.sequential
    )
    print_table(results, opts)
    if opts.json:
        write_json(opts.json, results, opts, WORKER_OPTIONS)


def print_table(results: list[dict], opts: argparse.Namespace) -> None:
    print(
        f"\nH={opts.embed_dim} FF={opts.ffn_dim} heads={opts.heads} levels={opts.levels} "
        f"device={opts.device} dtype={opts.dtype}; ratios are to fairseq's `{BASELINE}`\n"
    )
    columns = [
        Column("train tok/s", "train_tokens_per_s", ".0f"),
        Column("MFLOP/tok", "train_flops_per_token", ".1f", scale=1e6),
        Column("GFLOP/s", "train_flops_per_s", ".1f", scale=1e9),
        Column("gen sent/s", "gen_sentences_per_s", ".1f"),
        Column("mem MB", "peak_mem_mb", ".0f"),
        Column("ckpt mem MB", "ckpt_mem_mb", ".0f"),
        Column("cache MB", "cache_mb", ".2f"),
        Column("cross MB", "cross_cache_mb", ".2f"),
        Column("params", "params", ".2f", ratio=False, scale=1e6, suffix="M"),
        Column("P*", "p_star", ".2f", scale=1e6, suffix="M"),
    ]
    print(ratio_table(results, "arch", columns))


if __name__ == "__main__":
    sys.exit(entry_point(main, PROG)())
