"""Plumbing shared by the benchmark scripts (``scripts/benchmark_{nmt,vision}.py``).

Each model is measured in a fresh process (so that memory figures are its own): the script
re-runs itself in worker mode, the worker prints one ``RESULT {json}`` line, and the parent
collects the lines and prints a table of absolute figures and ratios to the first (reference)
row.

The workers take turns on the machine (:class:`Turns`): all of them start, and the parent
lets one run at a time, one timed round each in turn. A shared machine's speed drifts by
several percent over minutes; with turns every model's rounds are spread over the whole run
and the fastest of each model's rounds counts, so the ratios compare models measured side by
side, not one model early and another ten minutes later. ``sequential=True`` runs one worker
to its end before the next starts (the order of old, and the least memory at once).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from recurnmt.cli import UserError
from recurnmt.device import resolve_device
from recurnmt.experiments.artifacts import write_json as write_document
from recurnmt.experiments.experiment import size_flags

RESULT = "RESULT "
TURN = "TURN"  # a worker waits for its turn
GO = "go"  # the parent gives it
TURNS_ENV = "RECURNMT_BENCHMARK_TURNS"


class WorkerError(UserError):
    """A benchmark worker failed; the message ends with its stderr."""


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def add_sequential_argument(parser: argparse.ArgumentParser) -> None:
    """``--sequential``: one worker after another instead of in turns (see :func:`run_workers`)."""
    parser.add_argument(
        "--sequential",
        action="store_true",
        help="measure one model after another (least memory at once) instead of in turns",
    )


def add_device_arguments(parser: argparse.ArgumentParser, dtype_help: str = "") -> None:
    """``--device`` and ``--dtype``, the same in every benchmark script."""
    parser.add_argument(
        "--device", default="cpu", help="auto (CUDA where present), cpu, cuda or cuda:N"
    )
    parser.add_argument(
        "--dtype",
        default="fp32",
        choices=list(DTYPES),
        help="fp32, or autocast to bf16 / fp16 (fp16 with loss scaling; CUDA only)" + dtype_help,
    )


@dataclass(frozen=True)
class MixedPrecision:
    """``--dtype``: full precision (fp32) or autocast to bf16 / fp16, fp16 with loss scaling
    (``torch.amp``: what ``fairseq-train --amp`` and ``recurnmt.vision.training.train --amp`` do)."""

    name: str
    device: torch.device

    @classmethod
    def build(cls, name: str, device: torch.device) -> MixedPrecision:
        """Raises ValueError for an unknown dtype and for fp16 on the CPU."""
        if name not in DTYPES:
            raise ValueError(f"--dtype {name!r}: expected one of {', '.join(DTYPES)}")
        if name == "fp16" and device.type != "cuda":
            raise ValueError("--dtype fp16 needs CUDA (bf16 runs on the CPU too)")
        return cls(name, device)

    @property
    def dtype(self) -> torch.dtype:
        return DTYPES[self.name]

    def autocast(self) -> contextlib.AbstractContextManager:
        """The forward passes' context: nothing for fp32, else ``torch.autocast``."""
        if self.name == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def scaler(self) -> torch.amp.GradScaler | None:
        """Loss scaling for fp16 (its gradients underflow without it), else None."""
        return torch.amp.GradScaler(self.device.type) if self.name == "fp16" else None


def training_step(
    loss: torch.Tensor, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler | None
) -> None:
    """Backward and optimizer step, through the loss scaler when there is one."""
    optimizer.zero_grad(set_to_none=True)
    if scaler is None:
        loss.backward()
        optimizer.step()
        return
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()


def peak_memory_mb(step, device: torch.device) -> float:
    """Memory of ``step()`` (which returns a loss; the gradients are dropped afterwards).

    On CUDA the peak ``torch.cuda.max_memory_allocated`` during the step, weights, gradients
    and optimizer state included; on the CPU, which keeps no peak, the bytes of the distinct
    storages the forward saves for backward (:mod:`recurnmt.experiments.activation_memory`).
    """
    if device.type == "cuda":
        sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        step().backward()
        sync(device)
        return torch.cuda.max_memory_allocated(device) / 2**20
    from recurnmt.experiments.activation_memory import saved_for_backward_bytes

    loss, saved = saved_for_backward_bytes(step)
    loss.backward()
    return saved / 2**20


def _count_cpu_flash_attention() -> None:
    """Teaches ``FlopCounterMode`` the CPU flash-attention kernels (it counts the CUDA ones and
    any attention computed by explicit matrix products, as fairseq's is)."""
    from torch.utils import flop_counter

    aten = torch.ops.aten
    cpu_forward = aten._scaled_dot_product_flash_attention_for_cpu
    if cpu_forward in flop_counter.flop_registry:
        return

    def forward(query, key, value, *args, out_shape=None, **kwargs) -> int:
        return flop_counter.sdpa_flop_count(query, key, value)

    def backward(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
        return flop_counter.sdpa_backward_flop_count(grad_out, query, key, value)

    flop_counter.register_flop_formula(cpu_forward)(forward)
    flop_counter.register_flop_formula(aten._scaled_dot_product_flash_attention_for_cpu_backward)(
        backward
    )


def training_flops(step) -> int:
    """Matrix-product FLOPs of one training forward and backward (``step()`` returns the
    loss; the gradients are dropped afterwards), by ``torch.utils.flop_counter``: linear
    layers, attention (non-causal count for causal attention, as torch's formulas do) and the
    output projection; element-wise work is not counted."""
    from torch.utils.flop_counter import FlopCounterMode

    _count_cpu_flash_attention()
    with FlopCounterMode(display=False) as counter:
        step().backward()
    return counter.get_total_flops()


def _tensors(value: object, seen: set[int]) -> Iterator[torch.Tensor]:
    """Every tensor reachable from ``value`` through dicts, sequences and object attributes."""
    if id(value) in seen:
        return
    seen.add(id(value))
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item, seen)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item, seen)
    elif hasattr(value, "__dict__"):
        yield from _tensors(vars(value), seen)


def storage_bytes(value: object) -> int:
    """Bytes of the distinct tensor storages reachable from ``value`` (a view of a buffer
    counts the whole buffer once: that is what stays allocated)."""
    storages = {}
    for t in _tensors(value, set()):
        storage = t.untyped_storage()
        storages[(t.device, storage.data_ptr())] = storage.nbytes()
    return sum(storages.values())


def sync(device: torch.device) -> None:
    """Waits for queued CUDA work, so that wall-clock timings cover it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def emit(result: dict) -> None:
    """Prints a worker's figures for :func:`run_workers`."""
    print(RESULT + json.dumps(result), flush=True)


def forward_flags(opts: argparse.Namespace, names: Sequence[str]) -> list[str]:
    """``--name=value`` flags that hand ``opts.<name>`` on to a worker."""
    return [f"--{n.replace('_', '-')}={getattr(opts, n)}" for n in names]


class Turns:
    """A worker's side of the turn-taking of :func:`run_workers`.

    Constructed at the start of the worker, it waits for the first turn; :meth:`wait` hands
    the machine to the next worker and returns when this one has it again. Outside
    :func:`run_workers` (a worker called in-process, or run by hand) it never waits.
    """

    def __init__(self) -> None:
        self.enabled = os.environ.get(TURNS_ENV) == "1"
        self.wait()

    def wait(self) -> None:
        """Ends this worker's turn; returns at its next one."""
        if not self.enabled:
            return
        print(TURN, flush=True)
        if sys.stdin.readline().strip() != GO:
            sys.exit("benchmark worker: the parent process went away")


def start_worker(opts: argparse.Namespace) -> tuple[Turns, torch.device, MixedPrecision]:
    """A worker's first steps: its first turn (:class:`Turns`), then torch seeded with
    ``opts.seed`` on ``opts.threads`` threads (0: torch's default), the ``--device`` and the
    ``--dtype``."""
    turns = Turns()  # heavy work only in this worker's turns
    torch.manual_seed(opts.seed)
    if opts.threads:
        torch.set_num_threads(opts.threads)
    device = resolve_device(opts.device)
    return turns, device, MixedPrecision.build(opts.dtype, device)


def fastest_round(
    turns: Turns, rounds: int, run: Callable[[], None], device: torch.device
) -> float:
    """Seconds of the fastest of ``rounds`` runs of ``run``, each in a turn of its own (the
    fastest is the one least disturbed by other work on the machine)."""
    best = math.inf
    for _ in range(rounds):
        turns.wait()
        sync(device)
        start = time.perf_counter()
        run()
        sync(device)
        best = min(best, time.perf_counter() - start)
    return best


class _Worker:
    """One worker process of :func:`run_workers`, driven through its stdin and stdout."""

    def __init__(self, name: str, argv: list[str], cwd: Path, turns: bool) -> None:
        self.name = name
        self.stderr = tempfile.TemporaryFile(mode="w+")  # a pipe could fill and block it
        env = {**os.environ, TURNS_ENV: "1" if turns else "0"}
        self.proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            text=True,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
        )
        self.result: dict | None = None

    def run_until_turn(self) -> bool:
        """Reads the worker's output until it waits for a turn (True) or ends (False)."""
        for line in self.proc.stdout:
            if line.rstrip("\n") == TURN:
                return True
            if line.startswith(RESULT):
                self.result = json.loads(line[len(RESULT) :])
        code = self.proc.wait()
        if code or self.result is None:
            self.stderr.seek(0)
            tail = self.stderr.read()[-2000:].strip() or "(no output)"
            raise WorkerError(f"benchmark worker {self.name} failed (exit {code}):\n{tail}")
        return False

    def go(self) -> bool:
        """Gives the worker a turn; False once it has finished."""
        self.proc.stdin.write(GO + "\n")
        self.proc.stdin.flush()
        return self.run_until_turn()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout, self.stderr):
            with contextlib.suppress(OSError):
                stream.close()


def run_workers(
    script: Path,
    worker_flag: str,
    names: Sequence[str],
    flags: Sequence[str],
    cwd: Path,
    sequential: bool = False,
) -> list[dict]:
    """Runs ``script worker_flag NAME *flags`` for every name, one process each, taking turns
    (see the module's docstring); returns their results in the order of ``names``.

    Raises:
        WorkerError: a worker failed; the message ends with the end of its stderr.
    """
    workers: list[_Worker] = []
    try:
        if sequential:
            for name in names:
                print(f"benchmarking {name} ...", flush=True)
                worker = _Worker(name, _worker_argv(script, worker_flag, name, flags), cwd, False)
                workers.append(worker)
                worker.run_until_turn()
            return [w.result for w in workers]
        print(f"benchmarking {', '.join(names)}, taking turns ...", flush=True)
        for name in names:
            argv = _worker_argv(script, worker_flag, name, flags)
            workers.append(_Worker(name, argv, cwd, True))
        # every worker has started (imported its libraries) before any turn is given
        running = [w for w in workers if w.run_until_turn()]
        while running:  # one turn each, in order, until every worker has finished
            still = []
            for w in running:
                if w.go():
                    still.append(w)
                else:
                    print(f"  {w.name} done", flush=True)
            running = still
        return [w.result for w in workers]
    finally:
        for w in workers:
            w.close()


def _worker_argv(script: Path, worker_flag: str, name: str, flags: Sequence[str]) -> list[str]:
    return [sys.executable, str(script), worker_flag, name, *flags]


@dataclass(frozen=True)
class Column:
    """A table column: ``key`` of each result, printed with ``fmt``; ``ratio`` adds a column
    with the value divided by the reference row's."""

    title: str
    key: str
    fmt: str
    ratio: bool = True
    scale: float = 1.0
    suffix: str = ""


def ratio_table(results: Sequence[dict], name_key: str, columns: Sequence[Column]) -> str:
    """A fixed-width table of ``results`` with ratios to ``results[0]``."""
    base = results[0]
    width = max(len(name_key), *(len(str(r[name_key])) for r in results)) + 2
    header = f"{name_key:<{width}}"
    for c in columns:
        header += f"{c.title:>{max(len(c.title), 9) + 2}}" + (f"{'ratio':>7}" if c.ratio else "")
    lines = [header, "-" * len(header)]
    for r in results:
        line = f"{r[name_key]:<{width}}"
        for c in columns:
            cell = format(r[c.key] / c.scale, c.fmt) + c.suffix
            line += f"{cell:>{max(len(c.title), 9) + 2}}"
            if c.ratio:
                line += f"{r[c.key] / max(base[c.key], 1e-12):>7.2f}"
        lines.append(line)
    return "\n".join(lines)


def nmt_model_flags(arch: str, opts: argparse.Namespace) -> list[str]:
    """fairseq flags of one architecture at the benchmarks' common size (``opts``: embed_dim,
    ffn_dim, heads, levels, device; :func:`recurnmt.experiments.experiment.size_flags`), GELU,
    shared embeddings, dropout 0.1."""
    flags = [*size_flags(opts, arch), "--activation-fn", "gelu", "--share-all-embeddings"]
    flags += ["--dropout", "0.1"]
    if opts.device == "cpu":
        flags.append("--cpu")
    return flags


def random_token_batch(
    dictionary, batch: int, length: int, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A fixed batch of random tokens (no specials) for timing and memory measurements.

    Returns:
        ``(src_tokens, src_lengths, prev_output_tokens)``, B x T, B and B x T.
    """
    g = torch.Generator().manual_seed(seed)
    shape = (batch, length)
    src = torch.randint(dictionary.nspecial, len(dictionary), shape, generator=g)
    prev = torch.randint(dictionary.nspecial, len(dictionary), shape, generator=g)
    return src, torch.full((batch,), length), prev


def generation_batches(
    sample: dict, sentences: int, batch_size: int, pad: int, left_pad: bool = True
) -> list[dict]:
    """The first ``sentences`` sources of ``sample`` as ``net_input`` dicts of ``batch_size``.

    ``sample`` is one large batch, padded to its longest sentence; each returned batch is
    padded only to its own longest sentence, as fairseq's collater pads the batches of
    ``fairseq-generate`` (on the left unless ``--left-pad-source False``).
    """
    net = sample["net_input"]
    src, lengths = net["src_tokens"][:sentences], net["src_lengths"][:sentences]
    batches = []
    for i in range(0, src.size(0), batch_size):
        tokens, lens = src[i : i + batch_size], lengths[i : i + batch_size]
        width = int(lens.max())
        kept = tokens[:, -width:] if left_pad else tokens[:, :width]
        if int(kept.ne(pad).sum()) != int(lens.sum()):
            raise ValueError("the batch's padding is not on the side left_pad says")
        batches.append({"src_tokens": kept.contiguous(), "src_lengths": lens})
    return batches


def load_generation_batches(data: Path, sentences: int, batch_size: int) -> list[dict]:
    """:func:`generation_batches` of ``sentences`` test sentences of ``data``: those around
    its median source length, as ``fairseq-generate`` batches its middle (sorted by length).

    A typical batch, not the longest: the embedded test set's sources have a median of 17
    tokens, its longest 7 % 72-128, and one batch of those made cross-attention (which a
    shared decoder reads once per sentence, fairseq's transformer once per hypothesis) most
    of a step. Fewer sentences than asked only where the test set has fewer.
    """
    task = translation_task(data, "test")
    dataset = task.dataset("test")
    by_length = sorted(range(len(dataset)), key=lambda i: int(dataset.src_sizes[i]))
    n = min(sentences, len(by_length))
    start = (len(by_length) - n) // 2
    sample = dataset.collater([dataset[i] for i in by_length[start : start + n]])
    pad, left_pad = task.source_dictionary.pad(), task.cfg.left_pad_source
    return generation_batches(sample, n, batch_size, pad, left_pad)


def translation_task(data: Path, split: str, max_tokens: int = 4096, seed: int = 1):
    """fairseq's translation task on ``data`` with ``split`` loaded, on the CPU."""
    from fairseq import options, tasks

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(
        parser,
        [
            str(data),
            "--task",
            "translation",
            "--arch",
            "transformer",
            "--cpu",
            "--max-tokens",
            str(max_tokens),
            "--seed",
            str(seed),
        ],
    )
    task = tasks.setup_task(args)
    task.load_dataset(split)
    return task


def load_batches(data: Path, split: str, max_tokens: int, count: int, seed: int):
    """``count`` real batches of ``split`` (fairseq's own batching), on the CPU."""
    task = translation_task(data, split, max_tokens, seed)
    itr = task.get_batch_iterator(
        dataset=task.dataset(split),
        max_tokens=max_tokens,
        seed=seed,
        max_positions=(128, 128),
        ignore_invalid_inputs=True,
    ).next_epoch_itr(shuffle=True)
    batches = []
    for sample in itr:
        batches.append(sample)
        if len(batches) == count:
            break
    return task, batches


def fixed_length_generator(model, task, beam: int, length: int, generator_cls=None):
    """fairseq's beam search that always decodes ``length`` tokens, so that every model
    decodes the same number of steps whatever it predicts (``generator_cls``: a subclass of
    fairseq's ``SequenceGenerator`` in its place)."""
    from fairseq.sequence_generator import SequenceGenerator

    return (generator_cls or SequenceGenerator)(
        [model],
        task.target_dictionary,
        beam_size=beam,
        max_len_a=0,
        max_len_b=length,
        min_len=length,
    )


def device_name(device: torch.device) -> str:
    """The device in words: the GPU's name, or the CPU's."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    import platform

    return f"CPU ({platform.machine()}, {torch.get_num_threads()} threads)"


def write_json(
    path: Path, results: Sequence[dict], opts: argparse.Namespace, settings: Sequence[str]
) -> None:
    """Writes the results with what they were measured on and with (``--json``)."""
    device = torch.device(opts.device)
    document = {
        "device": str(device),
        "device_name": device_name(device),
        "dtype": opts.dtype,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "settings": {name: str(getattr(opts, name)) for name in settings},
        "results": list(results),
    }
    write_document(path, document)
