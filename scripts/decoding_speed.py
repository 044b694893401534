"""Generation (or training) speed of recurnmt's models against fairseq's transformer, interleaved.

Builds every architecture once (same width, FFN, heads and levels as
``scripts/benchmark_nmt.py``), then decodes the same test sentences with beam search at a fixed
output length, the architectures taking turns in every round, and reports the process CPU time
of the fastest round per architecture and its ratio to fairseq's ``transformer``. Where
``benchmark_nmt.py`` gives every model a process of its own (for its memory figures) and
times wall-clock turns, this one keeps all of them in one process and counts its CPU time: a
second view of the same ratios, and a quick one on one thread.
``--train`` times training updates instead (forward, backward and an Adam step on the same
``--steps`` real batches of ``--max-tokens`` tokens for every architecture).

    python scripts/decoding_speed.py --rounds 3
    python scripts/decoding_speed.py --train --threads 2 --rounds 3
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from recurnmt.cli import entry_point
from recurnmt.experiments.experiment import add_size_arguments
from recurnmt.experiments.results import family_order

ROOT = Path(__file__).resolve().parent.parent

PROG = "python scripts/decoding_speed.py"
BASELINE = "transformer"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--archs", nargs="+", default=list(family_order()))
    parser.add_argument("--data", type=Path, default=ROOT / "data-bin/lohelp_de_en")
    add_size_arguments(parser, pre_ln=None, embed_dim=256, ffn_dim=1024, heads=4)
    parser.add_argument("--sentences", type=int, default=64)
    parser.add_argument("--gen-batch", type=int, default=16)
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--decode-len", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument(
        "--train", action="store_true", help="time training updates instead of generation"
    )
    parser.add_argument("--steps", type=int, default=6, help="updates per round (--train)")
    parser.add_argument("--max-tokens", type=int, default=2048, help="batch size (--train)")
    opts = parser.parse_args(argv)
    if opts.rounds < 1:
        parser.error(f"--rounds {opts.rounds}: at least one round")
    if not (opts.data / "dict.en.txt").exists():
        parser.error(f"--data {opts.data}: no binarized corpus (python -m data_prep.embedded)")

    import torch

    from recurnmt.experiments.benchmark import (
        fixed_length_generator,
        load_batches,
        load_generation_batches,
        nmt_model_flags,
        training_step,
    )
    from recurnmt.nmt.build import build_model, check_arch

    for arch in opts.archs:
        check_arch(arch)
    if BASELINE not in opts.archs:
        opts.archs.insert(0, BASELINE)
    torch.set_num_threads(opts.threads)
    flags = argparse.Namespace(**vars(opts), device="cpu")
    task, batches = load_batches(opts.data, "train", opts.max_tokens, opts.steps + 1, 1)
    gen_batches = load_generation_batches(opts.data, opts.sentences, opts.gen_batch)
    sentences = sum(batch["src_tokens"].size(0) for batch in gen_batches)
    models, trainers = {}, {}
    for arch in opts.archs:
        torch.manual_seed(1)
        model, args, _ = build_model(arch, nmt_model_flags(arch, flags), task.source_dictionary)
        models[arch] = model.train(opts.train)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98))
        trainers[arch] = (task.build_criterion(args), optimizer)

    def train(arch: str, samples) -> float:
        criterion, optimizer = trainers[arch]
        start = time.process_time()
        for sample in samples:
            training_step(criterion(models[arch], sample)[0], optimizer, None)
        return time.process_time() - start

    def decode(model) -> float:
        generator = fixed_length_generator(model, task, opts.beam, opts.decode_len)
        start = time.process_time()
        for batch in gen_batches:
            generator.generate([model], {"net_input": batch})
        return time.process_time() - start

    best = {arch: float("inf") for arch in models}
    if opts.train:
        for arch in models:  # warm-up update, untimed
            train(arch, batches[:1])
        for _ in range(opts.rounds):
            for arch in models:
                best[arch] = min(best[arch], train(arch, batches[1:]))
        tokens = sum(int(sample["ntokens"]) for sample in batches[1:])
        print(f"\nCPU s per {opts.steps} updates ({tokens} target tokens)\n")
        unit, count = "tok/s", tokens
    else:
        with torch.no_grad():
            for model in models.values():  # warm-up round, untimed
                decode(model)
            for _ in range(opts.rounds):
                for arch, model in models.items():
                    best[arch] = min(best[arch], decode(model))
        print(f"\nCPU s per {sentences} sentences (beam {opts.beam}, {opts.decode_len} tokens)\n")
        unit, count = "sent/s", sentences
    print(f"| arch | CPU s | {unit} | ratio |\n| --- | --- | --- | --- |")
    for arch, seconds in best.items():
        ratio = best[BASELINE] / seconds
        print(f"| `{arch}` | {seconds:.2f} | {count / seconds:.1f} | {ratio:.2f} |")


if __name__ == "__main__":
    sys.exit(entry_point(main, PROG)())
