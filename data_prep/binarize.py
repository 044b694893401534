"""Binarize segmented text with ``fairseq-preprocess`` (joined dictionary)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from data_prep.errors import BinarizeError


def preprocess_command(
    prefixes: Mapping[str, Path],
    destdir: Path,
    src: str,
    tgt: str,
    workers: int = 1,
    srcdict: Path | None = None,
) -> list[str]:
    """The ``fairseq_cli.preprocess`` command line for a joined-dictionary binarization.

    Args:
        prefixes: ``{"train": prefix, "valid": prefix, "test": prefix}``; each prefix has
            ``.{src}`` and ``.{tgt}`` files of space-separated subword units.
        destdir: Output directory for ``dict.*.txt`` and ``{split}.{src}-{tgt}.*.{bin,idx}``.
        src: Source language suffix.
        tgt: Target language suffix.
        workers: Parallel binarization workers.
        srcdict: A fixed dictionary to use instead of building one from train.

    Returns:
        The command as an argument list (run with the current Python).
    """
    cmd = [sys.executable, "-m", "fairseq_cli.preprocess"]
    cmd += ["--source-lang", src, "--target-lang", tgt, "--joined-dictionary"]
    for split in ("train", "valid", "test"):
        if split in prefixes:
            cmd += [f"--{split}pref", str(prefixes[split])]
    cmd += ["--destdir", str(destdir), "--workers", str(workers)]
    if srcdict is not None:
        cmd += ["--srcdict", str(srcdict)]
    return cmd


def binarize(
    prefixes: Mapping[str, Path],
    destdir: Path,
    src: str,
    tgt: str,
    workers: int = 1,
    srcdict: Path | None = None,
) -> None:
    """Run ``fairseq-preprocess --joined-dictionary`` (see :func:`preprocess_command`).

    Raises:
        BinarizeError: With the tail of fairseq's output if it exits non-zero.
    """
    cmd = preprocess_command(prefixes, destdir, src, tgt, workers, srcdict)
    print(f"binarizing with fairseq-preprocess into {destdir} ...", file=sys.stderr)
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-20:])
        raise BinarizeError(f"fairseq-preprocess failed (exit {result.returncode}):\n{tail}")
