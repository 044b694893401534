"""The commands of one evaluation: average the last checkpoints, ``fairseq-generate``, score.

:func:`evaluation_steps` builds them from a dataset preset (:mod:`recurnmt.nmt.presets`) and
the ``evaluate:`` settings of a recipe (:class:`EvalSettings`): checkpoint averaging with
:mod:`recurnmt.nmt.averaging`, ``fairseq-generate`` with the dataset's beam and length penalty,
then the scoring command :mod:`recurnmt.nmt.evaluate`, which writes ``result.json``.
``scripts/evaluate_nmt.py`` and ``python -m recurnmt.nmt.recipe run`` run them.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recurnmt.nmt.presets import DatasetPreset, segmentation_of
from recurnmt.nmt.steps import Step, fairseq_flags, fairseq_tool, user_dir


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
        :class:`recurnmt.nmt.steps.Step` objects, in order.
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
                    "recurnmt.nmt.averaging",
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
        "user_dir": str(user_dir()),
        "path": str(checkpoint),
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
    steps.append(Step((*fairseq_tool("generate"), str(data), *fairseq_flags(options)), gen_out))

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
        "recurnmt.nmt.evaluate",
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
