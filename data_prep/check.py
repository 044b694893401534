"""``python -m data_prep.check DATA_DIR``: does ``fairseq-train`` accept a binarized directory?

Trains a tiny ``transformer`` for one update on CPU (into a throw-away directory) and reports
success or fairseq's error. Used by the end-to-end tests of every preparation command.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

from data_prep.errors import PrepError
from recurnmt.cli import entry_point
from recurnmt.experiments.experiment import size_flags

PROG = "python -m data_prep.check"

TINY_SIZE = SimpleNamespace(embed_dim=16, ffn_dim=32, heads=2, levels=1)
TINY_TRANSFORMER = ["--arch", "transformer", *size_flags(TINY_SIZE), "--share-all-embeddings"]


def smoke_train_command(data_dir: Path, save_dir: Path, src: str, tgt: str) -> list[str]:
    """The one-update ``fairseq-train`` command line (current Python, ``fairseq_cli.train``)."""
    return [
        sys.executable, "-m", "fairseq_cli.train", str(data_dir),
        "--source-lang", src, "--target-lang", tgt,
        *TINY_TRANSFORMER,
        "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "512",
        "--max-update", "1", "--cpu", "--num-workers", "0", "--seed", "1",
        # no read-ahead thread: one update needs none, and one still collating when the
        # interpreter exits aborts it (see recurnmt.nmt.shutdown; this check runs no plugin)
        "--data-buffer-size", "0",
        "--save-dir", str(save_dir), "--no-save", "--disable-validation",
        "--log-format", "simple", "--log-interval", "1",
    ]  # fmt: skip


def _languages(data_dir: Path) -> tuple[str, str]:
    stamp = data_dir / "prepare.json"
    if stamp.is_file():
        recorded = json.loads(stamp.read_text(encoding="utf-8"))["stamp"]
        return recorded["src"], recorded["tgt"]
    # Fall back on the binarized file names: train.<src>-<tgt>.<src>.bin
    for path in sorted(data_dir.glob("train.*-*.*.bin")):
        src, tgt = path.name.split(".")[1].split("-")
        return src, tgt
    raise PrepError(f"{data_dir}: no prepare.json and no train.*-*.*.bin files")


def smoke_train(data_dir: Path, timeout: float = 300.0) -> str:
    """Run one tiny training update on ``data_dir``.

    Returns:
        fairseq's output.

    Raises:
        PrepError: With the tail of fairseq's output if training fails.
    """
    src, tgt = _languages(Path(data_dir))
    with tempfile.TemporaryDirectory(prefix="data-prep-check-") as save_dir:
        cmd = smoke_train_command(Path(data_dir), Path(save_dir), src, tgt)
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    output = result.stdout + result.stderr
    if result.returncode != 0 or "done training" not in output:
        tail = "\n".join(output.splitlines()[-20:])
        raise PrepError(f"fairseq-train rejected {data_dir} (exit {result.returncode}):\n{tail}")
    return output


def main(argv: list[str] | None = None) -> None:
    """Runs the check.

    Raises:
        FileNotFoundError: no such directory.
        PrepError: fairseq-train rejected it.
    """
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__)
    parser.add_argument("data_dir", type=Path)
    args = parser.parse_args(argv)
    if not args.data_dir.is_dir():
        raise FileNotFoundError(f"{args.data_dir} is not a directory")
    smoke_train(args.data_dir)
    print(f"{args.data_dir}: fairseq-train ran one update")


cli = entry_point(main, PROG)

if __name__ == "__main__":
    sys.exit(cli())
