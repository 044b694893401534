"""Training and translating on a binarized corpus, for the scripts that compare models.

``scripts/compare_nmt.py`` (the families at one size), ``scripts/depth_sweep.py`` (a trained
model at every depth) and ``scripts/demo_nmt.py`` run the same ``fairseq-train`` and
``fairseq-generate`` commands, each with its output in a log file; the command lines, the
recipe they share and the reading of the logs live here, below all three.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from recurnmt.cli import UserError
from recurnmt.nmt.quiet import quiet_env
from recurnmt.runs.commands import fairseq_tool, user_dir
from recurnmt.runs.launch import cpu_train_command

SCHEDULES = {"inverse_sqrt": "inverse-sqrt decay", "polynomial_decay": "linear decay to 0"}


def run_logged(
    cmd: Sequence[str],
    log: Path,
    *,
    stdout: Path | None = None,
    show_stderr: bool = False,
    cwd: Path | None = None,
) -> float:
    """Runs one command with its output in ``log`` (stdout in ``stdout`` if given).

    Args:
        cmd: the command line; written at the top of ``log``.
        log: receives stdout and stderr (stderr only when ``stdout`` is given).
        stdout: a file for the command's stdout (fairseq-generate's translations).
        show_stderr: let stderr (fairseq's progress bar) reach the terminal instead.
        cwd: the working directory.

    Returns:
        The wall time in seconds.

    Raises:
        UserError: the command failed; the message quotes the end of its log.
    """
    env = quiet_env(dict(os.environ, PYTHONUNBUFFERED="1"))
    start = time.time()
    with log.open("w", encoding="utf-8") as log_f:
        log_f.write(f"$ {shlex.join(cmd)}\n")
        log_f.flush()
        out_f = stdout.open("w", encoding="utf-8") if stdout else log_f
        try:
            status = subprocess.run(
                list(cmd), cwd=cwd, env=env, stdout=out_f, stderr=None if show_stderr else log_f
            ).returncode
        finally:
            if stdout:
                out_f.close()
    if status:
        tail = "\n".join(log.read_text(encoding="utf-8").splitlines()[-15:])
        raise UserError(f"{cmd[0]} failed with exit status {status} (log: {log}):\n{tail}")
    return time.time() - start


def size_flags(args: argparse.Namespace, arch: str = "") -> list[str]:
    """Model size flags (``args``: embed_dim, ffn_dim, heads, levels, pre_ln), the same for
    every architecture and both sides; SReT runs its levels as blocks looped twice (3 blocks
    x 2 loops for 6 levels)."""
    flags = []
    for side in ("encoder", "decoder"):
        flags += [f"--{side}-embed-dim", str(args.embed_dim)]
        flags += [f"--{side}-ffn-embed-dim", str(args.ffn_dim)]
        flags += [f"--{side}-attention-heads", str(args.heads)]
        if args.levels:
            flags += [f"--{side}-layers", str(args.levels)]
            if arch == "sret":
                flags += [f"--{side}-unique-layers", str(max(1, args.levels // 2))]
        if args.pre_ln:
            flags.append(f"--{side}-normalize-before")
    return flags


def recipe_flags(args: argparse.Namespace) -> list[str]:
    """The training recipe shared by every model (``args``: dropout, lr, lr_scheduler,
    warmup, max_tokens, nproc, max_update, seed): shared embeddings, Adam (0.9, 0.98), one of
    :data:`SCHEDULES`, label smoothing 0.1 under the recurrent criterion."""
    flags = [
        "--share-all-embeddings",
        "--dropout",
        str(args.dropout),
        "--optimizer",
        "adam",
        "--adam-betas",
        "(0.9, 0.98)",
        "--clip-norm",
        "1.0",
        "--lr",
        str(args.lr),
        "--lr-scheduler",
        args.lr_scheduler,
        "--warmup-updates",
        str(args.warmup),
        "--criterion",
        "recurrent_label_smoothed_cross_entropy",
        "--label-smoothing",
        "0.1",
        "--max-tokens",
        str(args.max_tokens // args.nproc),  # per process: the update sees --max-tokens
        "--max-update",
        str(args.max_update),
        "--seed",
        str(args.seed),
    ]
    if args.lr_scheduler == "polynomial_decay":  # linear decay to 0 over the budget
        flags += ["--end-learning-rate", "0", "--total-num-update", str(args.max_update)]
    return flags


def processes(nproc: int) -> str:
    """How training ran (:func:`train_command` with ``nproc``), in words."""
    return "one process" if nproc == 1 else f"{nproc} data-parallel processes (gloo)"


def train_command(
    data: str | Path,
    arch: str,
    flags: Sequence[str],
    save_dir: Path,
    nproc: int = 1,
    device: str = "cpu",
) -> list[str]:
    """Training of ``arch`` with ``flags`` on this machine's CPU (``nproc`` data-parallel
    processes through :mod:`recurnmt.runs.launch`) or, with ``device="cuda"``, on its GPU
    (fairseq's own choice: one process on the first device); the last checkpoint only, a json
    log line every 25 updates."""
    start = cpu_train_command(nproc) if device == "cpu" else fairseq_tool("train")
    return [
        *start,
        str(data),
        "--user-dir",
        str(user_dir()),
        "--arch",
        arch,
        *flags,
        "--num-workers",
        "0",
        "--save-dir",
        str(save_dir),
        "--no-epoch-checkpoints",
        "--log-format",
        "json",
        "--log-interval",
        "25",
    ]


def generate_command(
    data: str | Path,
    checkpoint: Path,
    *,
    beam: int,
    lenpen: float,
    extra: Sequence[str] = (),
    device: str = "cpu",
) -> list[str]:
    """``fairseq-generate`` of the test set on the CPU (or ``device="cuda"``: the GPU),
    sentencepiece removed; ``extra`` flags last."""
    return [
        *fairseq_tool("generate"),
        str(data),
        "--user-dir",
        str(user_dir()),
        "--path",
        str(checkpoint),
        "--gen-subset",
        "test",
        "--beam",
        str(beam),
        "--lenpen",
        str(lenpen),
        "--max-len-a",
        "1.5",
        "--max-len-b",
        "10",  # an undertrained model's runaway output stops at 1.5 x source + 10 tokens
        "--max-tokens",
        "8000",
        "--required-batch-size-multiple",
        "1",
        "--post-process",
        "sentencepiece",
        *(["--cpu"] if device == "cpu" else []),
        *extra,
    ]


def valid_ppl(train_log: Path) -> float | None:
    """Validation perplexity at the last validation of a ``fairseq-train`` log."""
    found = None
    for line in train_log.read_text(encoding="utf-8").splitlines():
        if "valid on 'valid' subset" in line and (m := re.search(r"\| ppl ([\d.]+)", line)):
            found = float(m.group(1))
        elif "| valid |" in line and (m := re.search(r'"valid_ppl": "([\d.]+)"', line)):
            found = float(m.group(1))  # --log-format json
    return found


def train_stats(train_log: Path) -> dict[str, float]:
    """Training loss and perplexity at the last logged update (json log lines)."""
    stats: dict[str, float] = {}
    for line in train_log.read_text(encoding="utf-8").splitlines():
        start = line.find("{")
        if "| train_inner |" in line and start >= 0:
            record = json.loads(line[start:])
            stats = {k: float(record[k]) for k in ("num_updates", "loss", "ppl") if k in record}
    return stats


def epoch_stats(train_log: Path) -> dict[int, dict[str, float]]:
    """fairseq's end-of-epoch training line (json log) per epoch: ``{epoch: {"wps": ...,
    "ups": ..., "wall": ..., "loss": ...}}`` (the ``train_`` prefix dropped)."""
    found = {}
    for line in train_log.read_text(encoding="utf-8").splitlines():
        start = line.find("{")
        if "| train |" in line and start >= 0:
            record = json.loads(line[start:])
            found[int(record["epoch"])] = {
                k.removeprefix("train_"): float(v)
                for k, v in record.items()
                if k.startswith("train_") and _is_number(v)
            }
    return found


def _is_number(value: object) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


# fairseq-generate's closing line: "Translated 1,555 sentences (33,982 tokens) in 33.6s
# (46.22 sentences/s, 1010.01 tokens/s)"
_TRANSLATED = re.compile(
    r"Translated ([\d,]+) sentences \(([\d,]+) tokens\) in ([\d.]+)s "
    r"\(([\d.]+) sentences/s, ([\d.]+) tokens/s\)"
)


def generation_speed(generate_log: Path) -> dict[str, float] | None:
    """What ``fairseq-generate`` says of its own speed (None: no such line)."""
    match = _TRANSLATED.search(generate_log.read_text(encoding="utf-8"))
    if match is None:
        return None
    sentences, tokens, seconds, per_s, tokens_per_s = match.groups()
    return {
        "sentences": int(sentences.replace(",", "")),
        "tokens": int(tokens.replace(",", "")),
        "seconds": float(seconds),
        "sentences_per_s": float(per_s),
        "tokens_per_s": float(tokens_per_s),
    }
