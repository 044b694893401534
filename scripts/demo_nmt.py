"""The main job (`make demo`): train a small RingFormer from scratch on the CPU, translate, score.

Steps, each a real command (the full command lines are in the log files):

1. ``python -m data_prep.embedded prepare``: sentencepiece-encode and binarize the shipped
   German-English LibreOffice help corpus into ``data-bin/lohelp_de_en``;
2. ``fairseq-train --user-dir user_dir --arch ringformer_iwslt_de_en`` with the recipe below,
   showing fairseq's progress bar; its log goes to ``WORK/train.log``;
3. ``fairseq-generate`` on the test set (beam search, sentencepiece removed);
4. sacreBLEU of the detokenized output against the raw references, with its signature, and
   five test sentences (source, reference, translation) picked by length, not by quality;
5. ``recurnmt-export-ct2 --quantization int8``: the model as a CTranslate2 directory, the five
   sentences translated by it, and both engines' speed on the test set (docs/deploy.md).

Run from the repository root: ``python scripts/demo_nmt.py [--max-update N] [-- FLAGS]``;
flags after ``--`` are appended to the ``fairseq-train`` command (later flags win).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path

from data_prep.embedded import data_dir
from recurnmt.cli import UserError, entry_point, split_extra_args
from recurnmt.experiments.commands import generate_command, run_logged, train_command
from recurnmt.experiments.experiment import processes, recipe_flags, size_flags
from recurnmt.experiments.fairseq_log import last_valid_stats

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent

PROG = "python scripts/demo_nmt.py"

# The model: RingFormer (one shared block per side, per-level norms, rank-8 level signals),
# width 128, FFN 512, pre-LN, embeddings shared by encoder, decoder and output.
SIZE = {"embed_dim": 128, "ffn_dim": 512, "heads": 4}
MAX_UPDATE = 1400
# Training recipe, each choice measured (docs/demo.md gives the runs): Adam with
# a short warm-up and a linear decay to zero over the fixed budget (the old inverse-sqrt
# schedule never annealed); batches of 2,048 tokens (twice the updates of 4,096 for the same
# tokens); no dropout (three epochs do not overfit: dropout 0.1 ended at validation perplexity
# 30.4 against 25.9 without); a 4,000-piece vocabulary learned on the training split (the
# output layer was half of a training step at 8,000 pieces); two data-parallel processes of
# one thread each (more tokens per second than one process with two threads).
RECIPE = dict(dropout=0.0, lr=3e-3, lr_scheduler="polynomial_decay", warmup=200, seed=1)
MAX_TOKENS = 2048  # per update, over all processes
VOCAB_SIZE = 4000
NPROC = 2
BEAM, LENPEN = 4, 1.5
NUM_SAMPLES = 5


def demo_size_flags(levels: int) -> list[str]:
    """fairseq flags of the demo's model size (both sides alike, pre-LN)."""
    return size_flags(argparse.Namespace(**SIZE, levels=levels, pre_ln=True))


def param_counts(arch: str, levels: int) -> tuple[int, int]:
    """P* of the demo model and of fairseq's vanilla ``transformer`` at the same size."""
    from recurnmt.nmt.build import build_model
    from recurnmt.parameters import parameter_report

    flags = demo_size_flags(levels) + ["--share-all-embeddings"]
    ours = parameter_report(build_model(arch, flags)[0]).p_star
    vanilla = parameter_report(build_model("transformer", flags)[0]).p_star
    return ours, vanilla


def pick_samples(refs: list[str], n: int = NUM_SAMPLES) -> list[int]:
    """``n`` test sentences spread over the test set, 8 to 20 reference words long."""
    fit = [i for i, r in enumerate(refs) if 8 <= len(r.split()) <= 20]
    return [fit[(2 * k + 1) * len(fit) // (2 * n)] for k in range(n)] if fit else []


def minutes(seconds: float) -> str:
    return f"{int(seconds) // 60} min {int(seconds) % 60:02d} s"


def translate(directory: Path, spm_model: Path, sentences: list[str], *, beam_size: int = BEAM,
              threads: int = 1) -> tuple[list[str], float, int]:  # fmt: skip
    """``sentences`` (raw text) translated by the CTranslate2 model in ``directory``: encoded
    by the corpus's sentencepiece model, decoded in batches of 64 (CTranslate2 sorts them by
    length), the pieces joined back. Returns the translations, the seconds decoding took and
    the tokens generated (the end of sentence included)."""
    import ctranslate2
    import sentencepiece

    spm = sentencepiece.SentencePieceProcessor(model_file=str(spm_model))
    translator = ctranslate2.Translator(str(directory), intra_threads=threads)
    pieces = spm.encode(sentences, out_type=str)
    start = time.perf_counter()
    results = translator.translate_batch(
        pieces, beam_size=beam_size, length_penalty=LENPEN, max_batch_size=64,
        max_decoding_length=max(int(1.5 * (len(p) + 1) + 10) for p in pieces),
    )  # fmt: skip
    seconds = time.perf_counter() - start
    best = [r.hypotheses[0] for r in results]
    text = ["".join(p).replace("\u2581", " ").strip() for p in best]  # sentencepiece removed
    return text, seconds, sum(len(p) + 1 for p in best)


def serve(checkpoint: Path, data: Path, work: Path, sources: list[str], refs: list[str],
          args: argparse.Namespace, pytorch_speed: str | None) -> None:  # fmt: skip
    """The trained model exported to CTranslate2 (int8, ``recurnmt-export-ct2``), the five
    sentences translated by it, and both engines' speed on the whole test set."""
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        print("\n(CTranslate2 is not installed: pip install 'recurnmt[deploy]' to serve the "
              "model with it)")  # fmt: skip
        return
    from recurnmt.experiments.scoring import corpus_bleu

    out = work / "ct2-int8"
    export = [str(BIN / "python"), "-m", "recurnmt.nmt.ct2_export", str(checkpoint), str(out)]
    export += ["--data", str(data), "--quantization", "int8", "--force"]
    shown = " ".join(["recurnmt-export-ct2", *export[3:]])
    print(f"\nExporting to CTranslate2 (int8): {shown} ...", flush=True)
    run_logged(export, work / "export.log", cwd=ROOT)
    hyps, seconds, tokens = translate(out, data / "spm.model", sources, beam_size=args.beam)
    print(f"\nThe same {NUM_SAMPLES} sentences by CTranslate2 (int8):")
    for i in pick_samples(refs):
        print(f"  HYP  {hyps[i]}")
    bleu, _ = corpus_bleu(hyps, refs)
    print(f"\nSpeed on the {len(refs):,} test sentences, beam {args.beam}, this CPU:")
    if pytorch_speed:
        print(f"  recurnmt in PyTorch (fairseq-generate): {pytorch_speed}")
    print(f"  CTranslate2 int8: {tokens / seconds:,.1f} tokens/s, {len(refs) / seconds:,.1f} "
          f"sentences/s, sacreBLEU {bleu.score:.2f}")  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    argv, extra = split_extra_args(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="ringformer_iwslt_de_en")
    parser.add_argument("--max-update", type=int, default=MAX_UPDATE)
    parser.add_argument("--levels", type=int, default=3, help="levels N of each side")
    parser.add_argument("--beam", type=int, default=BEAM)
    parser.add_argument("--lenpen", type=float, default=LENPEN)
    parser.add_argument(
        "--vocab-size",
        type=int,
        default=VOCAB_SIZE,
        help="joint sentencepiece vocabulary learned on the training split (0: the shipped "
        "8,000-piece model)",
    )
    parser.add_argument(
        "--nproc",
        type=int,
        default=min(NPROC, os.cpu_count() or 1),
        help="data-parallel training processes (gloo, one thread each); the update stays "
        f"{MAX_TOKENS:,} tokens",
    )
    parser.add_argument("--data", help="prepared corpus (default: by --vocab-size)")
    parser.add_argument("--work", default="work/demo_nmt", help="checkpoints, outputs, logs")
    parser.add_argument("--fresh", action="store_true", help="delete earlier demo checkpoints")
    args = parser.parse_args(argv)

    start = time.time()
    from recurnmt.nmt.build import check_arch

    check_arch(args.arch)  # before preparing data and training
    work = ROOT / args.work
    if args.fresh and work.exists():
        import shutil

        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)

    args.data = args.data or str(data_dir(args.vocab_size or None))
    data = ROOT / args.data
    if not (data / "dict.en.txt").exists():
        print(f"Preparing the embedded corpus into {args.data} ...", flush=True)
        prep = [str(BIN / "python"), "-m", "data_prep.embedded", "prepare", "--out", args.data]
        prep += ["--vocab-size", str(args.vocab_size)] if args.vocab_size else []
        run_logged(prep, work / "prepare.log", cwd=ROOT)

    p_star, vanilla = param_counts(args.arch, args.levels)
    n_train = sum(1 for _ in (data / "train.raw.en").open(encoding="utf-8"))
    sources = (data / "test.raw.de").read_text(encoding="utf-8").splitlines()
    refs = (data / "test.raw.en").read_text(encoding="utf-8").splitlines()
    h, ff = SIZE["embed_dim"], SIZE["ffn_dim"]
    print(
        f"recurnmt demo: a RingFormer ({args.arch}: H={h}, FF={ff}, {args.levels} levels, "
        f"level-signal rank {h // 16}, pre-LN)\n"
        f"  P* = {p_star / 1e6:.2f}M parameters; fairseq's vanilla transformer at the same "
        f"size has P* = {vanilla / 1e6:.2f}M\n"
        f"  trained from scratch with fairseq-train on the CPU ({processes(args.nproc)}): "
        f"{args.max_update} updates on "
        f"{n_train:,} German-English sentence pairs\n"
        f"  (LibreOffice help pages), then translates the {len(refs):,} test sentences.",
        flush=True,
    )

    train_log = work / "train.log"
    if args.nproc < 1 or MAX_TOKENS % args.nproc:
        raise UserError(f"--nproc must divide the {MAX_TOKENS:,}-token update, got {args.nproc}")
    from recurnmt.experiments.launch import cpu_train_command

    recipe = argparse.Namespace(
        **RECIPE, max_tokens=MAX_TOKENS, nproc=args.nproc, max_update=args.max_update
    )
    flags = [*demo_size_flags(args.levels), *recipe_flags(recipe), "--num-workers", "0"]
    flags += ["--save-dir", str(work / "checkpoints"), "--no-epoch-checkpoints"]
    flags += ["--log-format", "tqdm", "--log-interval", "10"]
    flags += ["--tensorboard-logdir", str(work / "tensorboard"), *extra]
    train = train_command(args.data, args.arch, flags, start=cpu_train_command(args.nproc))
    rel = work.relative_to(ROOT) if work.is_relative_to(ROOT) else work
    print(f"\nTraining (log: {rel}/train.log) ...", flush=True)
    t0 = time.time()
    run_logged(train, train_log, show_stderr=True, cwd=ROOT)
    valid = last_valid_stats(train_log)
    print(
        f"Trained {args.max_update} updates in {minutes(time.time() - t0)}; "
        f"validation perplexity {valid.get('ppl', '?')}.",
        flush=True,
    )

    gen_out, gen_log = work / "generate-test.txt", work / "generate.log"
    decoding = ["--gen-subset", "test", "--beam", str(args.beam), "--lenpen", str(args.lenpen)]
    # without --required-batch-size-multiple 1 fairseq drops a last batch not a multiple of 8
    decoding += ["--max-tokens", "8000", "--required-batch-size-multiple", "1"]
    decoding += ["--post-process", "sentencepiece", "--scoring", "sacrebleu", "--cpu"]
    checkpoint = work / "checkpoints" / "checkpoint_last.pt"
    generate = generate_command(args.data, checkpoint, decoding)
    print(f"\nTranslating the test set (beam {args.beam}) ...", flush=True)
    run_logged(generate, gen_log, stdout=gen_out, cwd=ROOT)
    lines = gen_out.read_text(encoding="utf-8").splitlines()
    speed = re.search(r"Translated .*", gen_log.read_text(encoding="utf-8"))
    if speed:
        print(speed.group(0))

    from recurnmt.experiments.scoring import score

    result, hyps = score(lines, refs, kind="D")
    hyp_out = work / "test.hyp.en"
    hyp_out.write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
    print(f"\n{NUM_SAMPLES} test sentences (German source, English reference, translation):")
    for i in pick_samples(refs):
        print(f"\n  SRC  {sources[i]}\n  REF  {refs[i]}\n  HYP  {hyps[i]}")
    sacre = result["sacrebleu"]
    print(f"\nsacreBLEU on the {len(refs):,} test sentences: {sacre['text']}")
    print(f"signature: {sacre['signature']}")
    serve(checkpoint, data, work, sources, refs, args, speed.group(0) if speed else None)
    print(
        f"\nDemo finished in {minutes(time.time() - start)}. All translations: {rel}/test.hyp.en; "
        f"fairseq's output: {rel}/generate-test.txt;\nlogs: {rel}/train.log, "
        f"{rel}/generate.log; checkpoints: {rel}/checkpoints/."
    )


if __name__ == "__main__":
    sys.exit(entry_point(main, PROG)())
