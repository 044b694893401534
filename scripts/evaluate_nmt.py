"""Evaluate a trained translation model the standard way for its dataset.

Runs the three commands of :func:`recurnmt.nmt.evaluation.evaluation_steps` (each printed
first): average the last checkpoints (fairseq's average_checkpoints logic), fairseq-generate
with the dataset's beam and length penalty (IWSLT14: 5 / 1.0; WMT14: 4 / 0.6), and scoring:
detokenized sacrebleu with its signature, tokenized BLEU (compound-split for WMT14), parameter
counts, all written to ``RUN_DIR/result.json`` for ``scripts/results_nmt.py``.

    python scripts/evaluate_nmt.py --save-dir runs/x/checkpoints --data data-bin/wmt14_en_de \\
        --dataset wmt14 [--average-last 5 --average-by update] [--run-dir runs/x]
    python scripts/evaluate_nmt.py ... --average-last 1 --checkpoint best

Models trained with a length limit (the RingFormer A.1 recipes: 50 tokens) translate the whole
test set with ``--model-overrides "{'max_source_positions': 1024, 'max_target_positions':
1024}"`` (sinusoidal positions only; learned ones have a fixed table).
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from recurnmt.cli import entry_point  # noqa: E402
from recurnmt.nmt.evaluation import EvalSettings, evaluation_steps  # noqa: E402
from recurnmt.nmt.presets import PRESETS  # noqa: E402
from recurnmt.nmt.steps import run_steps  # noqa: E402

PROG = "python scripts/evaluate_nmt.py"


def main(argv: list[str] | None = None) -> int:
    """Runs (or prints) the evaluation; returns the exit status of the step that failed.

    Raises:
        FileNotFoundError: the save or data directory does not exist (without ``--dry-run``).
    """
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--save-dir", type=Path, required=True, help="fairseq's --save-dir")
    parser.add_argument("--data", type=Path, help="binarized data (default: the preset's)")
    parser.add_argument("--dataset", choices=sorted(PRESETS), required=True)
    parser.add_argument("--run-dir", type=Path, help="outputs (default: save dir's parent)")
    parser.add_argument("--name", help="the run's name in the results table")
    parser.add_argument("--average-last", type=int, default=5, help="0/1: no averaging")
    parser.add_argument("--average-by", choices=("update", "epoch"), default="update")
    parser.add_argument("--checkpoint", default="last", help="without averaging: last/best/PATH")
    parser.add_argument("--subset", default="test")
    parser.add_argument("--beam", type=int, help="default: the dataset's")
    parser.add_argument("--lenpen", type=float, help="default: the dataset's")
    parser.add_argument("--model-overrides", help="fairseq-generate --model-overrides")
    parser.add_argument("--dry-run", action="store_true", help="print the commands only")
    args = parser.parse_args(argv)

    preset = PRESETS[args.dataset]
    save_dir = args.save_dir.resolve()
    run_dir = (args.run_dir or save_dir.parent).resolve()
    data = (args.data or Path(preset.data)).resolve()
    settings = EvalSettings(
        average_last=args.average_last,
        average_by=args.average_by,
        checkpoint=args.checkpoint,
        subset=args.subset,
    )
    options = (
        ("beam", args.beam),
        ("lenpen", args.lenpen),
        ("model_overrides", args.model_overrides),
    )
    generate = {k: v for k, v in options if v is not None}
    meta = {"name": args.name or run_dir.name}
    if not args.dry_run:
        for flag, path in (("--save-dir", save_dir), ("--data", data)):
            if not path.is_dir():
                raise FileNotFoundError(f"{flag} {path} does not exist")
    steps = evaluation_steps(preset, data, save_dir, run_dir, settings, generate, meta)
    return run_steps(steps, dry_run=args.dry_run)


cli = entry_point(main, PROG)

if __name__ == "__main__":
    sys.exit(cli())
