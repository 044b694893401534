"""The README's main job: train a small RingFormer on the embedded corpus, translate, score.

Steps (each a real command, printed before it runs):

1. ``python -m data_prep.embedded prepare``: sentencepiece-encode and binarize the shipped
   German-English LibreOffice help corpus into ``data-bin/lohelp_de_en``;
2. ``fairseq-train --user-dir user_dir --arch ringformer_...`` on the CPU, with fairseq's
   progress output;
3. ``fairseq-generate`` on the test set (beam search, sentencepiece removed);
4. sacrebleu on the detokenized output against the raw references, with its signature.

Run from the repository root: ``python scripts/demo_nmt.py [--max-update N]``.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from recurnmt.cli import UserError, entry_point  # noqa: E402

PROG = "python scripts/demo_nmt.py"


def run(cmd: list[str], stdout=None) -> None:
    """Prints and runs one step; its own output says why it failed.

    Raises:
        UserError: the step failed.
    """
    print(f"\n$ {shlex.join(cmd)}", flush=True)
    status = subprocess.run(cmd, cwd=ROOT, stdout=stdout).returncode
    if status:
        raise UserError(f"step failed with exit status {status}: {shlex.join(cmd)}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="ringformer_iwslt_de_en")
    parser.add_argument("--max-update", type=int, default=600)
    parser.add_argument("--levels", type=int, default=3, help="levels N of each side")
    parser.add_argument("--data", default="data-bin/lohelp_de_en")
    parser.add_argument("--work", default="work/demo_nmt", help="checkpoints and outputs")
    parser.add_argument("--fresh", action="store_true", help="delete earlier demo checkpoints")
    args = parser.parse_args(argv)
    from recurnmt.nmt.build import check_arch

    check_arch(args.arch)  # before preparing data and training

    start = time.time()
    work = ROOT / args.work
    if args.fresh and work.exists():
        import shutil

        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    data = ROOT / args.data

    if not (data / "dict.en.txt").exists():
        run([str(BIN / "python"), "-m", "data_prep.embedded", "prepare", "--out", args.data])

    # A small RingFormer (H=128, FF=512, 3 levels, rank H/16 = 8), pre-LN so that a large
    # learning rate trains stably in a few CPU minutes.
    run(
        [
            str(BIN / "fairseq-train"),
            args.data,
            "--user-dir",
            "user_dir",
            "--arch",
            args.arch,
            "--encoder-embed-dim",
            "128",
            "--decoder-embed-dim",
            "128",
            "--encoder-ffn-embed-dim",
            "512",
            "--decoder-ffn-embed-dim",
            "512",
            "--encoder-layers",
            str(args.levels),
            "--decoder-layers",
            str(args.levels),
            "--encoder-normalize-before",
            "--decoder-normalize-before",
            "--share-all-embeddings",
            "--dropout",
            "0.1",
            "--optimizer",
            "adam",
            "--adam-betas",
            "(0.9, 0.98)",
            "--clip-norm",
            "1.0",
            "--lr",
            "2e-3",
            "--lr-scheduler",
            "inverse_sqrt",
            "--warmup-updates",
            "100",
            "--criterion",
            "recurrent_label_smoothed_cross_entropy",
            "--label-smoothing",
            "0.1",
            "--max-tokens",
            "4096",
            "--max-update",
            str(args.max_update),
            "--cpu",
            "--num-workers",
            "0",
            "--seed",
            "1",
            "--save-dir",
            str(work / "checkpoints"),
            "--no-epoch-checkpoints",
            "--log-interval",
            "50",
            "--tensorboard-logdir",
            str(work / "tensorboard"),
        ]
    )

    gen_out = work / "generate-test.txt"
    with gen_out.open("w", encoding="utf-8") as f:
        run(
            [
                str(BIN / "fairseq-generate"),
                args.data,
                "--user-dir",
                "user_dir",
                "--path",
                str(work / "checkpoints" / "checkpoint_last.pt"),
                "--gen-subset",
                "test",
                "--beam",
                "5",
                "--lenpen",
                "1.0",
                "--max-tokens",
                "8000",
                "--required-batch-size-multiple",
                "1",  # else fairseq drops a last batch that is not a multiple of 8
                "--post-process",
                "sentencepiece",
                "--scoring",
                "sacrebleu",
                "--cpu",
            ],
            stdout=f,
        )
    print(gen_out.read_text(encoding="utf-8").strip().splitlines()[-1])

    run(
        [
            str(BIN / "python"),
            "-m",
            "recurnmt.nmt.evaluate",
            str(gen_out),
            "--reference",
            str(data / "test.raw.en"),
            "--hyp-out",
            str(work / "test.hyp.en"),
        ]
    )
    print(f"\ndemo finished in {time.time() - start:.0f} s; outputs in {work}")


if __name__ == "__main__":
    sys.exit(entry_point(main, PROG)())
