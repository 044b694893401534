"""The small translation experiments of the scripts that compare models.

``scripts/compare_nmt.py`` (the families at one size), ``scripts/depth_sweep.py`` (a trained
model at every depth), ``scripts/fairseq_speed.py`` (the real commands, timed) and
``scripts/demo_nmt.py`` train every model at one size with one recipe and translate the test
set the same way; the benchmarks build their models at a size too. The settings they share
live here, as fairseq flags for :func:`recurnmt.experiments.commands.train_command` and
:func:`~recurnmt.experiments.commands.generate_command`: the model size (:func:`size_flags`, the only
writer of ``--encoder-embed-dim`` and its kin), the training recipe (:func:`recipe_flags`),
the runs' bookkeeping (:func:`run_flags`: what :mod:`recurnmt.experiments.fairseq_log` reads back)
and the test-set decoding (:func:`decoding_flags`), with the command-line options that set
the first two (RingFormer's Table 4 setting by default).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from recurnmt.experiments.results import split_arch
from recurnmt.modules.families import FAMILIES

SCHEDULES = {"inverse_sqrt": "inverse-sqrt decay", "polynomial_decay": "linear decay to 0"}


def size_flags(size: Any, arch: str = "") -> list[str]:
    """fairseq flags of one model size, the same for every architecture and both sides.

    Args:
        size: ``embed_dim``, ``ffn_dim``, ``heads``, ``levels`` (0: the architecture's own) and
            optionally ``pre_ln`` (parsed options, or a ``SimpleNamespace``).
        arch: the architecture; a family that fixes its loop count runs the levels as that
            many loops of fewer blocks (:meth:`~recurnmt.modules.Family.blocks`: SReT's 3
            blocks x 2 loops for 6 levels).
    """
    family = FAMILIES.get(split_arch(arch)[0])
    flags = []
    for side in ("encoder", "decoder"):
        flags += [f"--{side}-embed-dim", str(size.embed_dim)]
        flags += [f"--{side}-ffn-embed-dim", str(size.ffn_dim)]
        flags += [f"--{side}-attention-heads", str(size.heads)]
        if size.levels:
            flags += [f"--{side}-layers", str(size.levels)]
            blocks = None if family is None else family.blocks(size.levels)
            if blocks is not None:  # a family that fixes its loop count (SReT's two)
                flags += [f"--{side}-unique-layers", str(blocks)]
        if getattr(size, "pre_ln", False):
            flags.append(f"--{side}-normalize-before")
    return flags


def recipe_flags(args: argparse.Namespace) -> list[str]:
    """The training recipe shared by every model (``args``: dropout, lr, lr_scheduler,
    warmup, max_tokens, nproc, max_update, seed): shared embeddings, Adam (0.9, 0.98), one of
    :data:`SCHEDULES`, label smoothing 0.1 under the recurrent criterion."""
    from recurnmt.nmt.registry import RECURRENT_CRITERION  # fairseq: not for the size alone

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
        RECURRENT_CRITERION,
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


def run_flags(save_dir: Path) -> list[str]:
    """The runs' bookkeeping: no data workers, the last checkpoint only (in ``save_dir``), a
    json log line every 25 updates (:mod:`recurnmt.experiments.fairseq_log` reads it)."""
    return [
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


def decoding_flags(beam: int, lenpen: float, device: str = "cpu") -> list[str]:
    """``fairseq-generate`` of the test set on the CPU (or ``device="cuda"``: the GPU),
    sentencepiece removed."""
    return [
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
    ]


def processes(nproc: int) -> str:
    """How training ran (``nproc`` processes, :func:`recurnmt.experiments.launch.cpu_train_command`),
    in words."""
    return "one process" if nproc == 1 else f"{nproc} data-parallel processes (gloo)"


def missing_corpus(data: Path) -> str | None:
    """What is wrong with ``--data`` where it holds no binarized corpus (None: it does)."""
    if (data / "dict.en.txt").exists():
        return None
    return (
        f"--data {data}: no binarized corpus there (python -m data_prep.embedded prepare "
        "--vocab-size 4000 makes data-bin/lohelp_de_en_spm4000)"
    )


def add_size_arguments(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    levels_help: str = "levels per side",
    pre_ln_help: str | None = None,
    pre_ln: bool | None = False,
    *,
    embed_dim: int = 128,
    ffn_dim: int = 512,
    heads: int = 8,
    levels: int = 6,
) -> None:
    """``--embed-dim --ffn-dim --heads --levels --pre-ln/--no-pre-ln`` (:func:`size_flags`),
    the size flags of every script, declared here only: by default at RingFormer's Table 4
    size (H=128, FF=512, 8 heads, 6 levels), post-LN unless ``pre_ln`` (the default of
    ``--pre-ln``; None: no such flag). A script at another size passes its defaults."""
    parser.add_argument("--embed-dim", type=int, default=embed_dim, help="model width H")
    parser.add_argument("--ffn-dim", type=int, default=ffn_dim, help="FFN width")
    parser.add_argument("--heads", type=int, default=heads, help="attention heads")
    parser.add_argument("--levels", type=int, default=levels, help=levels_help)
    if pre_ln is not None:
        parser.add_argument(
            "--pre-ln", action=argparse.BooleanOptionalAction, default=pre_ln, help=pre_ln_help
        )


def add_recipe_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """The options of :func:`recipe_flags` but ``--nproc`` and ``--seed``, at RingFormer's
    Table 4 setting: Adam at lr 1e-3, inverse-sqrt decay after 100 warm-up updates, dropout
    0.1, 800 updates of 4,096 tokens."""
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--lr-scheduler", choices=sorted(SCHEDULES), default="inverse_sqrt")
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--max-tokens", type=int, default=4096)
    parser.add_argument("--max-update", type=int, default=800)
