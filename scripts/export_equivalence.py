"""Export a checkpoint and compare the transformers model with fairseq on a whole test set.

``python scripts/export_equivalence.py CHECKPOINT --data data-bin/lohelp_de_en [--beam 4]``

1. ``python -m recurnmt.export`` writes the transformers directory (``--out``, a temporary one
   by default).
2. ``fairseq-generate --beam B --lenpen L --max-len-b N`` translates the test set (its ``H``
   lines, before any post-processing, are the reference token sequences).
3. The exported model, loaded with ``AutoModelForSeq2SeqLM``, translates the same binarized
   source sentences with ``generate(num_beams=B)`` in the same batches as fairseq's own
   generator, which runs again in this process: both are timed on identical batches (model
   loading, data reading and process start excluded).

It prints how many sentences have the same tokens as fairseq-generate, the largest logit
difference on the first batch (teacher forcing with the references), and both speeds with
their ratio.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from recurnmt.cli import entry_point

PROG = "python scripts/export_equivalence.py"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--data", type=Path, required=True, help="binarized data directory")
    parser.add_argument("--subset", default="test")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--lenpen", type=float, default=1.0)
    parser.add_argument("--max-len-b", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=64, help="sentences per batch")
    parser.add_argument("--out", type=Path, help="keep the exported directory here")
    return parser.parse_args(argv)


def fairseq_generate_tokens(args: argparse.Namespace) -> tuple[dict[int, str], float]:
    """``{sentence id: H tokens}`` of fairseq-generate, and its wall time."""
    from recurnmt.experiments.commands import generate_command
    from recurnmt.experiments.scoring import read_hypotheses

    flags = ["--gen-subset", args.subset, "--cpu", "--beam", str(args.beam)]
    flags += ["--lenpen", str(args.lenpen), "--max-len-b", str(args.max_len_b)]
    flags += ["--batch-size", str(args.batch_size), "--required-batch-size-multiple", "1"]
    cmd = generate_command(args.data, args.checkpoint, flags)
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    if proc.returncode:
        raise RuntimeError(f"fairseq-generate failed:\n{proc.stderr[-3000:]}")
    return dict(enumerate(read_hypotheses(proc.stdout.splitlines(), "H"))), wall


def main(argv: list[str] | None = None) -> dict:
    """Runs the comparison; returns the figures it prints."""
    args = parse_args(argv)
    if not args.checkpoint.is_file():
        raise FileNotFoundError(f"checkpoint {args.checkpoint} does not exist")
    import torch

    with torch.no_grad():  # not torch.set_grad_enabled: a caller's autograd stays as it was
        return _compare(args)


def _compare(args: argparse.Namespace) -> dict:
    """The comparison of :func:`main` (under ``torch.no_grad``)."""
    import torch
    from fairseq import checkpoint_utils
    from transformers import AutoModelForSeq2SeqLM

    import recurnmt.hf  # noqa: F401  (registers the model type)
    from recurnmt import export

    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp) / "hf"
        export.main([str(args.checkpoint), str(out), "--data", str(args.data), "--force",
                     "--beam", str(args.beam), "--lenpen", str(args.lenpen),
                     "--max-len-b", str(args.max_len_b)])  # fmt: skip
        hf = AutoModelForSeq2SeqLM.from_pretrained(out).eval()
    reference, cli_wall = fairseq_generate_tokens(args)

    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task(
        [str(args.checkpoint)], arg_overrides={"data": str(args.data)}
    )
    model = models[0].eval()
    task.load_dataset(args.subset)
    cfg.generation.beam, cfg.generation.lenpen = args.beam, args.lenpen
    cfg.generation.max_len_b = args.max_len_b
    generator = task.build_generator([model], cfg.generation)
    batches = list(
        task.get_batch_iterator(
            task.dataset(args.subset),
            max_sentences=args.batch_size,
            max_positions=None,
            required_batch_size_multiple=1,
        ).next_epoch_itr(shuffle=False)
    )
    tgt = task.target_dictionary
    pad = tgt.pad()
    first = batches[0]["net_input"]
    diff = (model(**first)[0] - hf(input_ids=first["src_tokens"],
                                   decoder_input_ids=first["prev_output_tokens"]).logits)  # fmt: skip
    timings = {"fairseq": 0.0, "transformers": 0.0}
    same = total = 0
    for batch in batches:
        src = batch["net_input"]["src_tokens"]
        start = time.perf_counter()
        task.inference_step(generator, [model], batch)
        timings["fairseq"] += time.perf_counter() - start
        start = time.perf_counter()
        ours = hf.generate(input_ids=src, attention_mask=src.ne(pad).long(), num_beams=args.beam)
        timings["transformers"] += time.perf_counter() - start
        for i, sample_id in enumerate(batch["id"].tolist()):
            tokens = [t for t in ours[i, 1:].tolist() if t not in (pad, tgt.eos())]
            total += 1
            same += tgt.string(torch.tensor(tokens)) == reference[sample_id]
    result = {
        "sentences": total,
        "same_as_fairseq_generate": same,
        "max_logit_diff_first_batch": float(diff.abs().max()),
        "fairseq_sent_per_s": total / timings["fairseq"],
        "transformers_sent_per_s": total / timings["transformers"],
        "speed_ratio_transformers_to_fairseq": timings["fairseq"] / timings["transformers"],
        "fairseq_generate_cli_wall_s": cli_wall,
    }
    print(f"{same} of {total} sentences: generate(num_beams={args.beam}) gives the tokens of "
          f"fairseq-generate --beam {args.beam} --lenpen {args.lenpen}")  # fmt: skip
    print(
        f"largest logit difference (first batch, teacher forcing): {result['max_logit_diff_first_batch']:.2e}"
    )
    print(f"speed on the same batches: fairseq {result['fairseq_sent_per_s']:.2f} sent/s, "
          f"transformers {result['transformers_sent_per_s']:.2f} sent/s "
          f"(ratio {result['speed_ratio_transformers_to_fairseq']:.2f}); "
          f"fairseq-generate command wall time {cli_wall:.1f} s")  # fmt: skip
    return result


cli = entry_point(main, PROG)

if __name__ == "__main__":
    sys.exit(cli())
