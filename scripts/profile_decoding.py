"""Where a beam-search decoding step spends its time, family by family, against fairseq's
transformer: ``torch.profiler`` with CUDA activities over the real fairseq beam search.

Every architecture is built at the same size (``--embed-dim``, ``--ffn-dim``, ``--heads``,
``--levels``; random weights cast to ``--dtype``, as ``fairseq-generate --fp16`` casts them)
and decodes the same test sentences of the embedded corpus (``--sentences`` in one batch,
beam ``--beam``, exactly ``--decode-len`` tokens). After an untimed batch, it reports per
decoding step (one call of the decoder):

* ``wall ms``: the fastest of ``--rounds`` unprofiled runs of the batch, divided by the steps
  (every model is loaded at once and the rounds alternate between them, so that the host's
  drift, which moves a host-bound step by tens of percent, falls on all alike; the median is
  in the ``--json``);
* kernels launched and their summed device time (``gpu busy``: that time over the wall time;
  a step whose kernels keep the GPU busy a small fraction of the time is bound by the host);
* host synchronisations (``cudaStreamSynchronize``, ``cudaDeviceSynchronize``,
  ``cudaEventSynchronize``) and copies by direction (HtoD, DtoH, DtoD), memsets;
* aten operations dispatched, and which of them a family runs more often than the baseline;
* the attention kernels (which SDPA backend each call took: flash, memory-efficient, cuDNN
  or the composite math path) and the most frequent kernels;
* the caching allocator's traffic (``torch.cuda.memory_stats``: allocations and frees
  served, device allocations and their retries);
* host time inside the decoder's forward, its cache reorder and the rest of the beam search.

``--static-decoding`` adds, after each recurnmt family, the same model decoded by
``fairseq-generate --static-decoding``'s beam search (rows ``ARCH static``: every row kept,
caches of fixed shape, each step after the first one CUDA graph on CUDA), with how many of
the batch's best hypotheses equal the plain beam search's.

On the CPU the same runs with CPU activities only (the kernel and copy columns stay empty):
the pipeline, anywhere. ``--json`` writes every figure, ``--trace DIR`` the Chrome traces.

    python scripts/profile_decoding.py --device cuda --dtype fp16 --json profile.json
    python scripts/profile_decoding.py --archs transformer ringformer --device cpu --dtype fp32 \\
        --embed-dim 64 --ffn-dim 128 --heads 2 --levels 2 --sentences 4 --decode-len 4
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from recurnmt.cli import entry_point
from recurnmt.device import resolve_device
from recurnmt.experiments.artifacts import write_json
from recurnmt.experiments.benchmark import (
    MixedPrecision,
    device_name,
    fixed_length_generator,
    load_batches,
    load_generation_batches,
    nmt_model_flags,
)
from recurnmt.experiments.experiment import add_size_arguments
from recurnmt.experiments.results import family_order

ROOT = Path(__file__).resolve().parent.parent
PROG = "python scripts/profile_decoding.py"

SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")
LAUNCH = re.compile(r"^(cudaLaunchKernel|cuLaunchKernel|cudaLaunchKernelExC|cudaLaunchCooperative)")
# the SDPA backends as their kernels are named (flash, memory-efficient/cutlass, cuDNN)
ATTENTION_KERNEL = re.compile(r"(flash|fmha|attention|Attention|cudnn_sdpa|sdpa)")
# annotated regions of the beam search (host time)
REGIONS = ("decoder", "reorder", "encoder")


def annotate(obj: Any, method: str, label: str) -> None:
    """Wraps ``obj.method`` in a ``torch.profiler.record_function`` named ``label``."""
    inner = getattr(obj, method)

    def wrapped(*args, **kwargs):
        with torch.profiler.record_function(f"recurnmt::{label}"):
            return inner(*args, **kwargs)

    setattr(obj, method, wrapped)


def count_decoder_calls(decoder) -> list[int]:
    """A counter of ``decoder.forward`` calls (one per decoding step)."""
    calls = [0]
    inner = decoder.forward

    def counted(*args, **kwargs):
        calls[0] += 1
        return inner(*args, **kwargs)

    decoder.forward = counted
    return calls


def read_trace(path: Path) -> list[dict]:
    with path.open(encoding="utf-8") as f:
        doc = json.load(f)
    return [e for e in doc.get("traceEvents", []) if e.get("ph") == "X"]


def busy_time(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of ``(start, duration)`` intervals (microseconds)."""
    total, end = 0.0, float("-inf")
    for start, duration in sorted(intervals):
        stop = start + duration
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


def summarize_trace(events: list[dict], steps: int) -> dict:
    """Per-step figures of one profiled batch from its Chrome-trace events."""
    by_cat: dict[str, list[dict]] = collections.defaultdict(list)
    for e in events:
        by_cat[e.get("cat", "")].append(e)
    kernels = by_cat["kernel"]
    runtime = by_cat["cuda_runtime"] + by_cat["cuda_driver"]
    ops = [e for e in by_cat["cpu_op"] if e["name"].startswith("aten::")]
    calls = collections.Counter(e["name"] for e in runtime)
    copies = collections.Counter()
    for e in by_cat["gpu_memcpy"]:
        kind = re.search(r"(HtoD|DtoH|DtoD|HtoH|PtoP)", e["name"])
        copies[kind.group(1) if kind else e["name"]] += 1
    per = 1.0 / max(1, steps)
    kernel_names = collections.Counter(e["name"] for e in kernels)
    attention = {k: n * per for k, n in kernel_names.items() if ATTENTION_KERNEL.search(k)}
    regions = {}
    for label in REGIONS:
        spans = [e for e in by_cat["user_annotation"] if e["name"] == f"recurnmt::{label}"]
        regions[label] = {"calls": len(spans), "host_ms": sum(e["dur"] for e in spans) / 1e3}
    span = [e for e in by_cat["user_annotation"] if e["name"] == "recurnmt::generate"]
    wall_us = sum(e["dur"] for e in span)
    busy = busy_time([(e["ts"], e["dur"]) for e in kernels])
    return {
        "kernels": len(kernels) * per,
        "kernel_us": sum(e["dur"] for e in kernels) * per,
        "gpu_busy": busy / wall_us if wall_us and kernels else None,
        "profiled_ms": wall_us / 1e3,
        "launches": sum(n for k, n in calls.items() if LAUNCH.match(k)) * per,
        "syncs": {k: calls[k] * per for k in SYNC_CALLS if calls[k]},
        "memcpy_calls": sum(n for k, n in calls.items() if "Memcpy" in k) * per,
        "copies": {k: n * per for k, n in copies.items()},
        "memsets": len(by_cat["gpu_memset"]) * per,
        "aten_ops": len(ops) * per,
        "op_counts": {k: n * per for k, n in collections.Counter(e["name"] for e in ops).items()},
        "attention_kernels": attention,
        "top_kernels": {k: n * per for k, n in kernel_names.most_common(12)},
        "regions": regions,
    }


def allocator_traffic(before: dict, after: dict, steps: int) -> dict:
    keys = {
        "allocs": "allocation.all.allocated",
        "frees": "allocation.all.freed",
        "device_allocs": "num_device_alloc",
        "device_frees": "num_device_free",
        "retries": "num_alloc_retries",
    }
    per = 1.0 / max(1, steps)
    return {k: (after.get(v, 0) - before.get(v, 0)) * per for k, v in keys.items()}


class Decoding:
    """One architecture ready to decode the batch: its model, fairseq's beam search and a
    count of the decoder's calls (its steps)."""

    def __init__(
        self, opts: argparse.Namespace, arch: str, task, batch: dict, plain: Decoding | None = None
    ) -> None:
        from recurnmt.nmt.build import build_model

        self.arch, self.batch = arch, batch
        self.device = torch.device(opts.device)
        if plain is None:
            torch.manual_seed(opts.seed)
            precision = MixedPrecision.build(opts.dtype, self.device)
            model, _, _ = build_model(arch, nmt_model_flags(arch, opts), task.source_dictionary)
            self.model = model.to(self.device).to(precision.dtype).eval()
            generator_cls = None
        else:  # --static-decoding: the same model, beam search over fixed shapes
            from recurnmt.nmt.static_decoding import StaticSequenceGenerator

            self.arch, self.model = f"{arch} static", plain.model
            generator_cls = StaticSequenceGenerator
        self.generator = fixed_length_generator(
            self.model, task, opts.beam, opts.decode_len, generator_cls
        )
        self.calls = count_decoder_calls(self.model.decoder)
        self.times: list[float] = []
        with torch.no_grad():
            self.hypos = self.generate()  # untimed: the first batch allocates what later ones reuse
            self.calls[0] = 0
            self.generate()
        # the static generator runs the decoder's stack, not its forward: fairseq's step count
        self.steps = self.calls[0] if plain is None else plain.steps
        if plain is not None:
            self.identical = sum(
                a[0]["tokens"].tolist() == b[0]["tokens"].tolist()
                for a, b in zip(self.hypos, plain.hypos, strict=True)
            )

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def generate(self) -> list:
        with torch.profiler.record_function("recurnmt::generate"):
            return self.generator.generate([self.model], {"net_input": self.batch})

    def time_round(self) -> None:
        with torch.no_grad():
            self.sync()
            start = time.perf_counter()
            self.generate()
            self.sync()
            self.times.append(time.perf_counter() - start)

    def result(self) -> dict:
        per_step = sorted(t * 1e3 / self.steps for t in self.times)
        result = {
            "arch": self.arch,
            "steps": self.steps,
            "wall_ms_per_step": per_step[0],  # the fastest round
            "median_ms_per_step": statistics.median(per_step),
        }
        if hasattr(self, "identical"):  # sentences whose best hypothesis is the plain one's
            result["identical"] = f"{self.identical}/{len(self.hypos)}"
            result["path"] = self.generator.path
        return result

    def profile(self, trace_dir: Path, dtype: str) -> dict:
        """:meth:`result` with the figures of one profiled batch (:func:`summarize_trace`)."""
        annotate(self.model.decoder, "forward", "decoder")
        annotate(self.model.decoder, "reorder_incremental_state_scripting", "reorder")
        annotate(self.model.encoder, "forward", "encoder")
        cuda = self.device.type == "cuda"
        activities = [torch.profiler.ProfilerActivity.CPU]
        if cuda:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        stats = torch.cuda.memory_stats(self.device) if cuda else {}
        with torch.no_grad(), torch.profiler.profile(activities=activities) as prof:
            self.generate()
            self.sync()
        after = torch.cuda.memory_stats(self.device) if cuda else {}
        trace = trace_dir / f"{self.arch}_{dtype}.json"
        prof.export_chrome_trace(str(trace))
        result = summarize_trace(read_trace(trace), self.steps)
        result.update(self.result())
        result["allocator"] = allocator_traffic(stats, after, self.steps) if cuda else {}
        return result


def compare(results: list[dict], baseline: str) -> None:
    """Adds to each result the aten operations it runs more often per step than the baseline."""
    base = next((r for r in results if r["arch"] == baseline), None)
    if base is None:
        return
    for r in results:
        r["wall_ratio"] = base["wall_ms_per_step"] / r["wall_ms_per_step"]
        if "op_counts" not in r:
            continue
        extra = {
            name: round(n - base["op_counts"].get(name, 0.0), 2)
            for name, n in r["op_counts"].items()
            if n - base["op_counts"].get(name, 0.0) >= 0.5
        }
        r["ops_over_baseline"] = dict(sorted(extra.items(), key=lambda kv: -kv[1])[:15])


def table(results: list[dict]) -> str:
    if "kernels" not in results[0]:  # --no-profile
        rows = ["| arch | wall ms/step | speed vs transformer | identical |\n|" + " --- |" * 4]
        rows += [
            f"| {r['arch']} | {r['wall_ms_per_step']:.3f} | {r.get('wall_ratio', 1.0):.2f} | "
            f"{r.get('identical', '')} |"
            for r in results
        ]
        return "\n".join(rows)
    rows = [
        "| arch | wall ms/step | speed vs transformer | kernels | kernel us | gpu busy | "
        "syncs | HtoD | DtoH | aten ops | allocs |\n|" + " --- |" * 11
    ]
    for r in results:
        busy = "-" if r["gpu_busy"] is None else f"{r['gpu_busy']:.2f}"
        rows.append(
            f"| {r['arch']} | {r['wall_ms_per_step']:.3f} | {r.get('wall_ratio', 1.0):.2f} | "
            f"{r['kernels']:.0f} | {r['kernel_us']:.0f} | {busy} | "
            f"{sum(r['syncs'].values()):.2f} | {r['copies'].get('HtoD', 0):.2f} | "
            f"{r['copies'].get('DtoH', 0):.2f} | {r['aten_ops']:.0f} | "
            f"{r['allocator'].get('allocs', 0):.0f} |"
        )
    return "\n".join(rows)


def write(opts: argparse.Namespace, results: list[dict]) -> None:
    """``--json``: the figures so far, with the device, torch and the settings."""
    if opts.json:
        doc = {
            "device": device_name(torch.device(opts.device)),
            "torch": torch.__version__,
            "settings": {k: str(v) for k, v in vars(opts).items()},
            "results": results,
        }
        write_json(opts.json, doc, indent=1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--archs", nargs="+", default=list(family_order()))
    parser.add_argument("--data", type=Path, default=ROOT / "data-bin/lohelp_de_en")
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda[:N]")
    parser.add_argument("--dtype", default="fp16", choices=("fp32", "bf16", "fp16"))
    add_size_arguments(parser, pre_ln=None, embed_dim=512, ffn_dim=2048, heads=8)
    parser.add_argument("--sentences", type=int, default=64, help="sentences in the batch")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--decode-len", type=int, default=32, help="fixed output length")
    parser.add_argument(
        "--rounds", type=int, default=10, help="timed runs of each model, alternating"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--no-profile",
        dest="profile",
        action="store_false",
        help="time the unprofiled rounds only (the wall ms/step column)",
    )
    parser.add_argument(
        "--static-decoding",
        action="store_true",
        help="also decode each recurnmt family with --static-decoding's beam search (each "
        "step a CUDA graph on CUDA): rows 'ARCH static', their best hypotheses compared "
        "with the plain beam search's",
    )
    parser.add_argument("--json", type=Path, help="write every figure here")
    parser.add_argument("--trace", type=Path, help="keep the Chrome traces in this folder")
    opts = parser.parse_args(argv)
    if opts.rounds < 1:
        parser.error(f"--rounds {opts.rounds}: at least one round")
    opts.device = str(resolve_device(opts.device))
    MixedPrecision.build(opts.dtype, torch.device(opts.device))
    from recurnmt.nmt.build import check_arch

    for arch in opts.archs:
        check_arch(arch)
    if not (opts.data / "dict.en.txt").exists():
        cmd = [sys.executable, "-m", "data_prep.embedded", "prepare", "--out", str(opts.data)]
        subprocess.run(cmd, check=True, cwd=ROOT)
    if "transformer" not in opts.archs:
        opts.archs.insert(0, "transformer")
    task, _ = load_batches(opts.data, "train", 1024, 1, opts.seed)
    (batch,) = load_generation_batches(opts.data, opts.sentences, opts.sentences)
    batch = {k: v.to(opts.device) for k, v in batch.items()}
    # every model at once, the timed rounds alternating between them: a beam-search step is
    # bound by the host, whose speed drifts (clock, neighbours) by tens of percent within a
    # minute on a rented machine, so each model's fastest round is taken among rounds spread
    # over the same stretch of time
    decodings = []
    for arch in opts.archs:
        decodings.append(Decoding(opts, arch, task, batch))
        print(f"{arch}: built, {decodings[-1].steps} decoder steps per batch", flush=True)
        if opts.static_decoding and arch != "transformer":
            decodings.append(Decoding(opts, arch, task, batch, plain=decodings[-1]))
            d = decodings[-1]
            print(f"{d.arch}: {d.generator.path}, {d.identical}/{len(d.hypos)} identical")
    for _ in range(opts.rounds):
        for decoding in decodings:
            decoding.time_round()
    results = [d.result() for d in decodings]
    compare(results, "transformer")
    write(opts, results)
    if opts.profile:
        with tempfile.TemporaryDirectory() as tmp:
            trace_dir = opts.trace or Path(tmp)
            trace_dir.mkdir(parents=True, exist_ok=True)
            for i, decoding in enumerate(decodings):
                results[i] = decoding.profile(trace_dir, opts.dtype)
                r = results[i]
                print(
                    f"{r['arch']}: {r['kernels']:.0f} kernels, {r['aten_ops']:.0f} aten ops, "
                    f"syncs {r['syncs']} per step",
                    flush=True,
                )
                compare(results, "transformer")
                write(opts, results)  # after every model: a stopped run keeps what it measured
    print(table(results))
    if not opts.profile:
        return
    for r in results[1:]:
        print(f"\n{r['arch']}: aten ops per step over the transformer's: {r['ops_over_baseline']}")
        print(f"  attention kernels per step: {r['attention_kernels']}")
        print(f"  top kernels per step: {r['top_kernels']}")
        print(f"  regions: {r['regions']}  allocator: {r['allocator']}")
    base = results[0]
    print(f"\ntransformer attention kernels per step: {base['attention_kernels']}")
    print(f"  top kernels per step: {base['top_kernels']}\n  regions: {base['regions']}")


if __name__ == "__main__":
    sys.exit(entry_point(main, PROG)())
