"""The commands of one evaluation: average the last checkpoints, ``fairseq-generate``, score.

:func:`evaluation_steps` builds them from a dataset preset (:mod:`recurnmt.experiments.presets`) and
the ``evaluate:`` settings of a recipe (:class:`EvalSettings`): checkpoint averaging with
:mod:`recurnmt.experiments.averaging`, ``fairseq-generate`` with the dataset's beam and length penalty,
then the scoring command :mod:`recurnmt.experiments.scoring`, which writes ``result.json``.
``recurnmt-run-nmt-recipe run`` runs them after training; this module's command runs them for
a run trained otherwise.

Command line (``recurnmt-evaluate-nmt``, also ``python -m recurnmt.experiments.evaluation``): average
the last checkpoints (fairseq's average_checkpoints logic), ``fairseq-generate`` with the
dataset's beam and length penalty (IWSLT14: 5 / 1.0; WMT14: 4 / 0.6), and scoring: detokenized
sacrebleu with its signature, tokenized BLEU (compound-split for WMT14), parameter counts, all
written to ``RUN_DIR/result.json`` for ``recurnmt-results-nmt``; each command is printed
first::

    recurnmt-evaluate-nmt --save-dir runs/x/checkpoints --data data-bin/wmt14_en_de \\
        --dataset wmt14 [--average-last 5 --average-by update] [--run-dir runs/x]
    recurnmt-evaluate-nmt ... --average-last 1 --checkpoint best

Models trained with a length limit (the RingFormer A.1 recipes: 50 tokens) translate the whole
test set with ``--model-overrides "{'max_source_positions': 1024, 'max_target_positions':
1024}"`` (sinusoidal positions only; learned ones have a fixed table).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recurnmt.cli import entry_point
from recurnmt.experiments.commands import Step, fairseq_flags, generate_command, run_steps
from recurnmt.experiments.presets import PRESETS, DatasetPreset, segmentation_of

PROG = "recurnmt-evaluate-nmt"  # also python -m recurnmt.experiments.evaluation


@dataclass(frozen=True)
class EvalSettings:
    """The ``evaluate:`` section of a recipe.

    Attributes:
        average_last: average the last N checkpoints (Vaswani et al. 2017: 5 for base
            models); 0 or 1 evaluates ``checkpoint`` instead.
        average_by: ``update`` (``checkpoint_E_U.pt``) or ``epoch`` (``checkpointE.pt``).
        checkpoint: without averaging: ``last``, ``best`` or a path.
        subset: the split to translate.
        sacrebleu_tokenize: sacrebleu's tokenizer.
        lowercase: case-insensitive sacrebleu; ``None``: the dataset's preset.
        tokenized_bleu: also report tokenized BLEU; ``None``: for Moses-tokenized (BPE) data.
        compound_split: with compound splitting; ``None``: the dataset's preset.
    """

    average_last: int = 5
    average_by: str = "update"
    checkpoint: str = "last"
    subset: str = "test"
    sacrebleu_tokenize: str = "13a"
    lowercase: bool | None = None
    tokenized_bleu: bool | None = None
    compound_split: bool | None = None


def checkpoint_to_evaluate(save_dir: Path, settings: EvalSettings) -> Path:
    """The checkpoint the evaluation translates with (the average, when averaging)."""
    if settings.average_last > 1:
        return save_dir / f"checkpoint_avg{settings.average_last}.pt"
    if settings.checkpoint in ("last", "best"):
        return save_dir / f"checkpoint_{settings.checkpoint}.pt"
    return Path(settings.checkpoint)


def evaluation_steps(
    preset: DatasetPreset,
    data: Path,
    save_dir: Path,
    run_dir: Path,
    settings: EvalSettings,
    generate_options: Mapping[str, Any] | None = None,
    meta: Mapping[str, Any] | None = None,
) -> list[Step]:
    """The commands of one evaluation: average, ``fairseq-generate``, score.

    Args:
        preset: the dataset's standard settings.
        data: the binarized data directory.
        save_dir: the training run's ``--save-dir``.
        run_dir: where the generation output and ``result.json`` go.
        settings: averaging and scoring options.
        generate_options: fairseq-generate options over the preset's (``beam``, ...);
            a ``None`` value removes the flag.
        meta: extra fields of ``result.json`` (``name``, ``arch``, ...).

    Returns:
        :class:`recurnmt.experiments.commands.Step` objects, in order.
    """
    segmentation = segmentation_of(data, preset.segmentation)
    steps = []
    checkpoint = checkpoint_to_evaluate(save_dir, settings)
    if settings.average_last > 1:
        steps.append(
            Step(
                (
                    sys.executable,
                    "-m",
                    "recurnmt.experiments.averaging",
                    "--dir",
                    str(save_dir),
                    "--last",
                    str(settings.average_last),
                    "--by",
                    settings.average_by,
                    "--output",
                    str(checkpoint),
                )
            )
        )
    options: dict[str, Any] = {
        "gen_subset": settings.subset,
        "source_lang": preset.source_lang,
        "target_lang": preset.target_lang,
        "beam": preset.beam,
        "lenpen": preset.lenpen,
        "batch_size": 128,
        # fairseq (main, fairseq-fixed) drops a last batch whose size is not a multiple of
        # this (default 8): 3 of newstest2014's 3,003 sentences would go untranslated
        "required_batch_size_multiple": 1,
        "post_process": "sentencepiece" if segmentation == "spm" else "subword_nmt",
    }
    if segmentation == "bibert":  # fairseq's BERT word-piece decoder joins the "##" pieces
        del options["post_process"]
        options.update(
            bpe="bert", bpe_cased=True, bpe_vocab_file=str(data / "tokenizer" / "vocab.txt")
        )
    options.update(generate_options or {})
    gen_out = run_dir / f"generate-{settings.subset}.txt"
    generate = generate_command(data, checkpoint, fairseq_flags(options))
    steps.append(Step(tuple(generate), gen_out))

    # word pieces split punctuation off as Moses does, so both are Moses-detokenized
    moses = segmentation in ("bpe", "bibert")
    tokenized = (
        segmentation == "bpe" if settings.tokenized_bleu is None else settings.tokenized_bleu
    )
    compound = preset.compound_split if settings.compound_split is None else settings.compound_split
    lowercase = preset.lowercase if settings.lowercase is None else settings.lowercase
    target = options.get("target_lang") or preset.target_lang
    score_cmd = [
        sys.executable,
        "-m",
        "recurnmt.experiments.scoring",
        str(gen_out),
        "--reference",
        str(data / f"{settings.subset}.raw.{target}"),
        "--tokenize",
        settings.sacrebleu_tokenize,
        "--hyp-out",
        str(run_dir / f"{settings.subset}.hyp.{target}"),
        "--json-out",
        str(run_dir / "result.json"),
        "--checkpoint",
        str(checkpoint),
        "--data",
        str(data),
    ]
    if moses:
        score_cmd += ["--detokenize", "moses", "--target-lang", target]
    if lowercase:
        score_cmd.append("--lowercase")
    if tokenized:
        score_cmd.append("--tokenized-bleu")
        if compound:
            score_cmd.append("--compound-split")
    fields = {"dataset": preset.name, "subset": settings.subset, **(meta or {})}
    fields.update(beam=options.get("beam"), lenpen=options.get("lenpen"))
    for key, value in fields.items():
        score_cmd += ["--meta", f"{key}={value}"]
    steps.append(Step(tuple(score_cmd)))
    return steps


def main(argv: list[str] | None = None) -> int:
    """Runs (or prints) the evaluation; returns the exit status of the step that failed.

    Raises:
        FileNotFoundError: the save or data directory does not exist, or the checkpoint
            without averaging (without ``--dry-run``).
        CheckpointError: that checkpoint is not a fairseq checkpoint (truncated, a text file,
            an image model's).
    """
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Evaluate a trained translation model the standard way for its dataset.",
    )
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
        if settings.average_last <= 1:  # the checkpoint itself, before the steps run
            from recurnmt.checkpoint_files import FAIRSEQ, read_checkpoint_file

            read_checkpoint_file(checkpoint_to_evaluate(save_dir, settings), FAIRSEQ, mmap=True)
    steps = evaluation_steps(preset, data, save_dir, run_dir, settings, generate, meta)
    return run_steps(steps, dry_run=args.dry_run)


cli = entry_point(main, PROG)  # the console script

if __name__ == "__main__":
    sys.exit(cli())
