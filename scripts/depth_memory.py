"""Activation memory against depth, with and without per-level checkpointing.

For each depth N, builds ``--arch`` with N encoder and decoder levels, runs one training
forward on a fixed random batch and counts the bytes it saves for backward
(:mod:`recurnmt.analysis.memory`, deterministic on the CPU), plain and with fairseq's
``--checkpoint-activations``; prints a markdown table.

    python scripts/depth_memory.py --arch universal_transformer_tiny --levels 6 25 50 100
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from recurnmt.cli import entry_point  # noqa: E402

PROG = "python scripts/depth_memory.py"


def saved_mb(arch: str, levels: int, checkpoint: bool, opts: argparse.Namespace) -> float:
    import torch

    from recurnmt.analysis.memory import saved_for_backward_bytes
    from recurnmt.nmt.build import build_model, toy_dictionary

    flags = ["--encoder-layers", str(levels), "--decoder-layers", str(levels)]
    flags += ["--checkpoint-activations"] if checkpoint else []
    dictionary = toy_dictionary(opts.vocab)
    torch.manual_seed(0)
    model, _, _ = build_model(arch, flags, dictionary)
    model.train()
    g = torch.Generator().manual_seed(0)
    shape = (opts.batch, opts.length)
    src = torch.randint(dictionary.nspecial, len(dictionary), shape, generator=g)
    prev = torch.randint(dictionary.nspecial, len(dictionary), shape, generator=g)
    lengths = torch.full((opts.batch,), opts.length)
    loss, saved = saved_for_backward_bytes(
        lambda: model(src, lengths, prev)[0].logsumexp(-1).mean()
    )
    loss.backward()
    return saved / 2**20


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="universal_transformer_tiny")
    parser.add_argument("--levels", type=int, nargs="+", default=[6, 25, 50, 100])
    parser.add_argument("--batch", type=int, default=8, help="sentences")
    parser.add_argument("--length", type=int, default=20, help="tokens per sentence")
    parser.add_argument("--vocab", type=int, default=40)
    opts = parser.parse_args(argv)
    from recurnmt.nmt.build import check_arch

    check_arch(opts.arch)
    print(f"`{opts.arch}`, {opts.batch} x {opts.length} tokens: MB saved for backward\n")
    print("| levels | plain | checkpointed |\n| --- | --- | --- |")
    for n in opts.levels:
        plain, ckpt = (saved_mb(opts.arch, n, c, opts) for c in (False, True))
        print(f"| {n} | {plain:.2f} | {ckpt:.2f} |", flush=True)


if __name__ == "__main__":
    sys.exit(entry_point(main, PROG)())
