"""Activation memory against depth: plain, checkpointed per level, and in sqrt(N) segments.

For each depth N, builds ``--arch`` with N encoder and decoder levels and runs one training
step (forward and backward) on a fixed random batch, three ways: plain, with fairseq's
``--checkpoint-activations`` (per level), and with ``--checkpoint-segment sqrt`` as well
(segments of ceil(sqrt(N)) levels, Chen et al. 2016). Two figures per run:

* saved: the bytes the forward pass keeps for backward (:mod:`recurnmt.experiments.activation_memory`,
  deterministic), which omits what a checkpointed backward pass recomputes;
* peak: the growth of the process's peak resident memory during the step, backward and its
  recomputation included, measured in a fresh process per run (glibc is told to return large
  blocks at once, ``MALLOC_MMAP_THRESHOLD_``, so resident memory follows live tensors).

Prints a markdown table and, with ``--plot``, a PNG of peak memory against levels.

    python scripts/depth_memory.py --arch universal_transformer_tiny --levels 6 25 50 100
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from recurnmt.cli import entry_point

ROOT = Path(__file__).resolve().parent.parent

PROG = "python scripts/depth_memory.py"
MODES = {
    "plain": [],
    "per level": ["--checkpoint-activations"],
    "sqrt segments": ["--checkpoint-activations", "--checkpoint-segment", "sqrt"],
}


def _status_mb(field: str) -> float:
    """A /proc/self/status memory figure (VmRSS, VmHWM) in MB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def _reset_peak() -> None:
    """Resets the process's peak resident memory (VmHWM) to its current size (Linux)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def measure(opts: argparse.Namespace) -> dict:
    """One training step of one configuration in this process: saved and peak MB."""

    import torch

    from recurnmt.experiments.activation_memory import saved_for_backward_bytes
    from recurnmt.experiments.benchmark import random_token_batch
    from recurnmt.nmt.build import build_model, toy_dictionary

    torch.set_num_threads(1)
    flags = ["--encoder-layers", str(opts.worker_levels), "--decoder-layers"]
    flags += [str(opts.worker_levels), *MODES[opts.worker_mode]]
    dictionary = toy_dictionary(opts.vocab)
    torch.manual_seed(0)
    model, _, _ = build_model(opts.arch, flags, dictionary)
    model.train()
    src, lengths, prev = random_token_batch(dictionary, opts.batch, opts.length)

    def loss() -> torch.Tensor:
        return model(src, lengths, prev)[0].logsumexp(-1).mean()

    out, saved = saved_for_backward_bytes(loss)
    out.backward()  # also allocates the gradients, which the measured step reuses
    model.zero_grad(set_to_none=False)
    _reset_peak()
    base = _status_mb("VmRSS")
    loss().backward()
    return {"saved_mb": saved / 2**20, "peak_mb": _status_mb("VmHWM") - base}


def run(opts: argparse.Namespace, levels: int, mode: str) -> dict:
    """:func:`measure` in a fresh process, so that no earlier run's memory counts."""
    cmd = [sys.executable, __file__, "--arch", opts.arch, "--batch", str(opts.batch)]
    cmd += ["--length", str(opts.length), "--vocab", str(opts.vocab)]
    cmd += ["--worker-levels", str(levels), "--worker-mode", mode]
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, check=False)
    if out.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def plot(rows: dict[int, dict[str, dict]], path: Path, title: str) -> None:
    import logging

    import matplotlib

    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # fairseq sets the root to DEBUG
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = sorted(rows)
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for mode in MODES:
        ax.plot(levels, [rows[n][mode]["peak_mb"] for n in levels], marker="o", label=mode)
    ax.set_xlabel("levels (encoder and decoder each)")
    ax.set_ylabel("peak memory of a training step (MB)")
    ax.set_title(title, fontsize=9)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="universal_transformer_tiny")
    parser.add_argument("--levels", type=int, nargs="+", default=[6, 25, 50, 100])
    parser.add_argument("--batch", type=int, default=32, help="sentences")
    parser.add_argument("--length", type=int, default=40, help="tokens per sentence")
    parser.add_argument("--vocab", type=int, default=40)
    parser.add_argument("--plot", type=Path, help="write a PNG of peak memory against levels")
    parser.add_argument("--worker-levels", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--worker-mode", choices=MODES, help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    if opts.worker_levels:
        print(json.dumps(measure(opts)))
        return
    from recurnmt.nmt.build import check_arch

    check_arch(opts.arch)
    if any(n < 1 for n in opts.levels):
        parser.error(f"--levels {opts.levels}: every depth must be at least 1")
    title = f"`{opts.arch}`, {opts.batch} x {opts.length} tokens"
    print(f"{title}: MB per training step (saved by the forward / peak)\n")
    print("| levels | " + " | ".join(MODES) + " |\n" + "| --- " * (len(MODES) + 1) + "|")
    rows: dict[int, dict[str, dict]] = {}
    for n in opts.levels:
        rows[n] = {mode: run(opts, n, mode) for mode in MODES}
        cells = [f"{r['saved_mb']:.1f} / {r['peak_mb']:.1f}" for r in rows[n].values()]
        print(f"| {n} | " + " | ".join(cells) + " |", flush=True)
    if opts.plot:
        plot(rows, opts.plot, title)
        print(f"\nplot: {opts.plot}")


if __name__ == "__main__":
    sys.exit(entry_point(main, PROG)())
