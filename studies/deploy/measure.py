"""The measurements of ``scripts/deploy_bench.py``: trained models decoded by recurnmt in
PyTorch (fairseq's generator) and by CTranslate2 from the directory ``recurnmt-export-ct2``
writes, on the embedded test set (docs/deploy.md).

Every figure is measured in this process on the CPU, one model at a time: sacreBLEU of every
engine (greedy and beam 4), how many greedy outputs CTranslate2 (float32) gives token for token
as fairseq's generator does, tokens/s at batch 1 and in batches, beam 1 and 4, and the size of
the model on disk. CTranslate2 decodes the batches fairseq's generator decodes, with the same
length limit (``1.5 x`` the batch's source width ``+ 10``) and length penalty.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from recurnmt.experiments.artifacts import portable, write_json
from studies.speculative.measure import BEAM, LENPEN, TestSet, beam, bleu, decode, greedy, load

ENGINES = ("pytorch", "ct2 float32", "ct2 int8")
SETTINGS = (("batch 1", 1, 1), ("batch 1", 1, BEAM), ("batch 16", 16, 1), ("batch 16", 16, BEAM))


class CT2:
    """A CTranslate2 translator of an exported directory, decoding fairseq's batches."""

    def __init__(self, path: Path, compute_type: str, threads: int, test: TestSet) -> None:
        import ctranslate2

        self.translator = ctranslate2.Translator(
            str(path), device="cpu", compute_type=compute_type, intra_threads=threads
        )
        self.test = test
        self.src_dict = test.dataset.src_dict

    def pieces(self, sample: dict) -> list[list[str]]:
        """The batch's sources as pieces (no padding, no end-of-sentence: CTranslate2 adds it)."""
        pad, eos = self.test.pad, self.src_dict.eos()
        return [
            [self.src_dict[t] for t in row.tolist() if t not in (pad, eos)]
            for row in sample["net_input"]["src_tokens"]
        ]

    def decode(self, batches, beam_size: int) -> tuple[dict[int, list[str]], float, int]:
        """Every sentence's best hypothesis (pieces), the wall time and the tokens generated
        (the end of sentence included, as :func:`~studies.speculative.measure.decode` counts)."""
        out, tokens = {}, 0
        start = time.perf_counter()
        for ids, sample in batches:
            width = sample["net_input"]["src_tokens"].size(1)  # fairseq's src_len: eos, padding
            results = self.translator.translate_batch(
                self.pieces(sample), beam_size=beam_size, length_penalty=LENPEN,
                max_decoding_length=int(1.5 * width + 10),
            )  # fmt: skip
            for i, result in zip(ids, results, strict=True):
                out[i] = result.hypotheses[0]
                tokens += len(out[i]) + 1
        return out, time.perf_counter() - start, tokens


def _text(pieces: list[str]) -> str:
    return "".join(pieces).replace("\u2581", " ").strip()  # fairseq's sentencepiece post-process


def _ct2_bleu(test: TestSet, hyps: dict[int, list[str]]) -> float:
    from recurnmt.experiments.scoring import corpus_bleu

    ids = sorted(hyps)
    score, _ = corpus_bleu([_text(hyps[i]) for i in ids], [test.references[i] for i in ids])
    return round(score.score, 2)


def export(checkpoint: Path, out: Path, data: Path, log: Callable[[str], None]) -> dict:
    """The model's CTranslate2 directories (float32 and int8) and its sizes on disk."""
    from recurnmt.nmt import ct2_export

    sizes = {"parameters_mib": None}
    model, task = ct2_export.load(checkpoint, data)
    params = {id(p): p.numel() for p in model.parameters()}  # unique tensors
    sizes["parameters_mib"] = round(sum(params.values()) * 4 / 2**20, 2)
    for quantization in ("float32", "int8"):
        path = ct2_export.write(model, task, out / quantization, quantization)
        sizes[quantization + "_mib"] = round((path / "model.bin").stat().st_size / 2**20, 2)
        log(f"  exported {quantization}: model.bin {sizes[quantization + '_mib']} MiB")
    return sizes


def measure_model(name: str, checkpoint: Path, args: argparse.Namespace, test: TestSet,
                  log: Callable[[str], None]) -> dict[str, Any]:  # fmt: skip
    """Every figure of one model (module docstring)."""
    row: dict[str, Any] = {"sizes": export(checkpoint, args.out / name / "ct2", args.data, log)}
    model = load(checkpoint)[0]
    engines = {
        "pytorch": None,
        "ct2 float32": CT2(args.out / name / "ct2" / "float32", "float32", args.threads, test),
        "ct2 int8": CT2(args.out / name / "ct2" / "int8", "int8", args.threads, test),
    }
    everything = test.batches(range(len(test.dataset)), 64)
    quality, outputs = {}, {}
    with torch.no_grad():
        for engine, ct2 in engines.items():
            for beam_size in (1, BEAM):
                if ct2 is None:
                    make = greedy if beam_size == 1 else beam
                    hyps, _, _ = decode(make(model, test.tgt_dict), model, everything)
                    outputs[engine, beam_size] = {
                        i: [test.tgt_dict[t] for t in h.tolist()[:-1]] for i, h in hyps.items()
                    }
                    score = bleu(test, hyps)
                else:
                    outputs[engine, beam_size], _, _ = ct2.decode(everything, beam_size)
                    score = _ct2_bleu(test, outputs[engine, beam_size])
                quality[f"{engine}, beam {beam_size}"] = score
    want = outputs["pytorch", 1]
    got = outputs["ct2 float32", 1]
    row["identical_greedy"] = {"same": sum(got[i] == want[i] for i in want), "of": len(want)}
    row["bleu"] = quality
    log(f"  BLEU {quality}; greedy identical {row['identical_greedy']}")
    speed: dict[str, dict] = {}
    ids = test.spread(args.sentences)
    for _round in range(args.rounds):
        for setting, size, beam_size in SETTINGS:
            batches = test.batches(ids, size)
            for engine, ct2 in engines.items():
                if ct2 is None:
                    make = greedy if beam_size == 1 else beam
                    with torch.no_grad():
                        _, seconds, tokens = decode(make(model, test.tgt_dict), model, batches)
                else:
                    _, seconds, tokens = ct2.decode(batches, beam_size)
                key = f"{engine}, {setting}, beam {beam_size}"
                if key not in speed or seconds < speed[key]["seconds"]:
                    speed[key] = {"seconds": round(seconds, 3), "tokens": tokens,
                                  "tokens_per_s": round(tokens / seconds, 1)}  # fmt: skip
    row["speed"] = speed
    return row


def storage(data: Path, out: Path) -> dict[str, dict[str, float]]:
    """What sharing saves on disk: ``model.bin`` (float32) of a ``recurrent_transformer`` of
    this corpus at H=128 and 6 levels a side, one block a side against six, beside its unique
    parameters in float32 (the weights do not change the sizes: as built)."""
    from recurnmt.experiments.benchmark import translation_task
    from recurnmt.nmt import ct2_export
    from recurnmt.nmt.build import build_model

    task = translation_task(data, "test")
    sizes = ["--encoder-embed-dim", "128", "--decoder-embed-dim", "128", "--share-all-embeddings",
             "--encoder-ffn-embed-dim", "512", "--decoder-ffn-embed-dim", "512",
             "--encoder-layers", "6", "--decoder-layers", "6", "--encoder-normalize-before",
             "--decoder-normalize-before"]  # fmt: skip
    out_sizes = {}
    for name, unique in (("one block a side", "1"), ("six blocks a side", "6")):
        flags = [*sizes, "--encoder-unique-layers", unique, "--decoder-unique-layers", unique]
        model = build_model("recurrent_transformer", ["--dropout", "0", *flags],
                            task.source_dictionary, task.target_dictionary)[0].eval()  # fmt: skip
        path = ct2_export.write(model, task, out / unique)
        params = {id(p): p.numel() for p in model.parameters()}
        positions = model.encoder.embed.embed_positions.weights.numel()
        out_sizes[name] = {
            "parameters_mib": round(sum(params.values()) * 4 / 2**20, 2),
            "position_table_mib": round(positions * 4 / 2**20, 2),
            "model_bin_mib": round((path / "model.bin").stat().st_size / 2**20, 2),
        }
    return out_sizes


def measure(args: argparse.Namespace, titles: dict[str, str]) -> dict:
    """Every model of ``args.models`` trained under ``args.runs``, kept in the JSON beside
    ``args.doc`` as each is measured (a stopped run resumes), then the page and its plot."""
    torch.set_num_threads(args.threads)
    raw = args.doc.with_suffix(".json")
    results = json.loads(raw.read_text()) if raw.exists() else {}
    results["settings"] = {k: str(v) for k, v in vars(args).items()}
    results["titles"] = {n: titles[n] for n in args.models}
    results.setdefault("models", {})
    test = TestSet(args.data)
    if "storage" not in results:
        results["storage"] = storage(args.data, args.out / "storage")
        write_json(raw, results)
    for name in args.models:
        if name in results["models"]:
            print(f"{name}: measured already ({portable(raw)})", flush=True)
            continue
        checkpoint = args.runs / name / "checkpoints" / "checkpoint_last.pt"
        print(f"{name}: {titles[name]}", flush=True)
        results["models"][name] = measure_model(
            name, checkpoint, args, test, lambda line: print(line, flush=True)
        )
        write_json(raw, results)
    return results
