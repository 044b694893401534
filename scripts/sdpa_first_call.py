"""What a new attention shape costs, kernel by kernel: the first call of
``scaled_dot_product_attention`` on a shape never seen before against the calls after it.

A backend that builds something per shape (cuDNN's attention builds and caches an execution
plan for every new batch, length and mask) pays it on the first call of each shape; flash
attention and the memory-efficient kernel take any shape as it comes. Three cases of what
recurnmt's models run, each over ``--shapes`` new shapes per backend (the shapes of one backend
are never those of another, so no backend finds another's plans):

* ``decode self``: one query per hypothesis over a self-attention cache one key longer at every
  step (beam search: ``--rows`` hypotheses, no mask);
* ``decode cross``: one query per hypothesis over the encoder memory with its padding mask,
  a new source length each time (every batch of a test set);
* ``train``: forward and backward of causal self-attention over a new (batch, length) with
  ``--tokens`` tokens (every bucket of a training epoch).

Backends: ``torch`` (torch's own choice, cuDNN first on Hopper GPUs in fp16/bf16), ``cudnn``
alone, and ``no-cudnn`` (flash, then memory-efficient, then math: what recurnmt's attention
takes, see recurnmt/modules/sdpa.py). Per backend and case: the median first call
and the median later call (ms), and their difference, the cost of a new shape.

    python scripts/sdpa_first_call.py --device cuda --dtype fp16 --json sdpa.json
    python scripts/sdpa_first_call.py --device cpu --dtype fp32 --shapes 3   # the pipeline
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from recurnmt.cli import entry_point
from recurnmt.device import resolve_device
from recurnmt.experiments.artifacts import write_json
from recurnmt.experiments.benchmark import device_name

PROG = "python scripts/sdpa_first_call.py"
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
BACKENDS = {
    "torch": None,
    "cudnn": [SDPBackend.CUDNN_ATTENTION],
    "no-cudnn": [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH],
}
CASES = ("decode self", "decode cross", "train")


def make_call(case: str, index: int, opts: argparse.Namespace) -> Callable[[], None]:
    """One attention call of ``case`` at the ``index``-th shape (unique per index)."""
    h, d = opts.heads, opts.head_dim
    kw = {"device": opts.device, "dtype": DTYPES[opts.dtype]}
    if case == "train":
        length = 8 + index
        batch = max(1, opts.tokens // length)
        q, k, v = (torch.randn(batch, h, length, d, **kw, requires_grad=True) for _ in range(3))

        def call() -> None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            out.sum().backward()

        return call
    length = 4 + index
    q = torch.randn(opts.rows, h, 1, d, **kw)
    k, v = (torch.randn(opts.rows, h, length, d, **kw) for _ in range(2))
    mask = None
    if case == "decode cross":  # the last key of every other row is padding
        mask = torch.ones(opts.rows, 1, 1, length, dtype=torch.bool, device=opts.device)
        mask[::2, ..., -1] = False

    def call() -> None:
        with torch.no_grad():
            F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    return call


def timed(call: Callable[[], None], device: torch.device, repeat: int = 1) -> float:
    """Milliseconds per call of ``repeat`` calls, the device synchronised around them."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(repeat):
        call()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - start) * 1000 / repeat


def measure(case: str, backend: str, offset: int, opts: argparse.Namespace) -> dict:
    """The first and later calls of ``--shapes`` new shapes of ``case`` under ``backend``."""
    first, later = [], []
    for i in range(opts.shapes):
        call = make_call(case, offset + i * len(BACKENDS), opts)
        try:
            if BACKENDS[backend] is None:
                first.append(timed(call, opts.device))
                later.append(timed(call, opts.device, opts.repeat))
            else:
                with sdpa_kernel(BACKENDS[backend]):
                    first.append(timed(call, opts.device))
                    later.append(timed(call, opts.device, opts.repeat))
        except RuntimeError as err:  # a backend that cannot take the case
            return {"case": case, "backend": backend, "error": str(err).splitlines()[0][:160]}
    row = {"case": case, "backend": backend, "shapes": opts.shapes}
    row["first_ms"] = statistics.median(first)
    row["later_ms"] = statistics.median(later)
    row["new_shape_ms"] = statistics.median(f - s for f, s in zip(first, later, strict=True))
    return row


def table(rows: list[dict]) -> str:
    lines = [
        "| case | backend | first call ms | later call ms | a new shape costs ms |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['case']} | {r['backend']} | n/a: {r['error']} | | |")
        else:
            lines.append(
                f"| {r['case']} | {r['backend']} | {r['first_ms']:.3f} | {r['later_ms']:.3f} "
                f"| {r['new_shape_ms']:.3f} |"
            )
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp16")
    parser.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    parser.add_argument("--backends", nargs="+", choices=list(BACKENDS), default=list(BACKENDS))
    parser.add_argument("--shapes", type=int, default=24, help="new shapes per backend and case")
    parser.add_argument("--repeat", type=int, default=5, help="later calls timed per shape")
    parser.add_argument("--rows", type=int, default=256, help="decoding: hypotheses (B x beam)")
    parser.add_argument("--tokens", type=int, default=4096, help="training: tokens per batch")
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--json", type=Path)
    opts = parser.parse_args(argv)
    for name in ("shapes", "repeat", "rows", "tokens", "heads", "head_dim"):
        if getattr(opts, name) < 1:
            parser.error(f"--{name.replace('_', '-')} {getattr(opts, name)}: at least 1")
    opts.device = resolve_device(opts.device)
    return opts


def main(argv: list[str] | None = None) -> None:
    opts = parse_args(argv)
    torch.manual_seed(0)
    make_call("decode self", 10**4, opts)()  # the device's context and libraries, untimed
    rows = []
    for case in opts.cases:
        for b, backend in enumerate(opts.backends):
            rows.append(measure(case, backend, b, opts))
            if opts.json:
                doc = {"device": device_name(opts.device), "torch": torch.__version__,
                       "dtype": opts.dtype, "settings": vars(opts) | {"device": str(opts.device),
                       "json": str(opts.json)}, "results": rows}  # fmt: skip
                write_json(opts.json, doc, indent=1)
    print(f"{device_name(opts.device)}, torch {torch.__version__}, {opts.dtype}")
    print(table(rows))


if __name__ == "__main__":
    sys.exit(entry_point(main, PROG)())
