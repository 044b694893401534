"""Writes the compatibility fixtures under tests/fixtures/compat/ (run once, output committed).

Saved models of the code as it was when they were written, and what they computed then, so
that a later change to names, flags or modules that breaks loading them (or changes what they
compute) fails ``tests/test_compat_fixtures.py``:

* ``nmt/ARCH.pt``: a checkpoint of every recurnmt ``*_tiny`` translation architecture, in
  fairseq's format (its parsed arguments and weights, as ``fairseq-train`` saves them, at a
  width of 16 over a 20-symbol dictionary), with a source batch, the decoder's input and the
  logits of the full pass;
* ``vision/NAME.pt``: an image model as ``recurnmt.vision.training.train`` saves one (name,
  keyword arguments, weights), with images and their logits;
* ``hf/ARCH/``: a model exported to ``transformers`` (``config.json``, weights), with
  ``expected.pt`` (its inputs and logits).

Usage: ``python scripts/make_compat_fixtures.py [--out DIR]`` (written anew; the tests read
the committed copy).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import torch

from recurnmt.cli import UserError, entry_point

ROOT = Path(__file__).resolve().parents[1]
PROG = "python scripts/make_compat_fixtures.py"
OUT = ROOT / "tests" / "fixtures" / "compat"

NMT_ARCHS = (
    "recurrent_transformer_tiny", "ringformer_tiny", "universal_transformer_tiny",
    "universal_transformer_act_tiny", "owf_tiny", "sret_tiny", "relaxed_transformer_tiny",
)  # fmt: skip
NMT_SIZE = [
    "--encoder-embed-dim", "16", "--decoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32",
    "--decoder-ffn-embed-dim", "32", "--encoder-attention-heads", "2",
    "--decoder-attention-heads", "2", "--share-all-embeddings",
]  # fmt: skip
VOCAB = 20  # symbols beyond fairseq's four specials
VISION = {"ringformer_vit_mini_patch4": dict(embed_dim=32, num_heads=2, num_classes=10)}
HF_ARCH = "ringformer_tiny"
# what fairseq-train writes beside the arguments and weights (fairseq's loader reads it)
FAIRSEQ_STATE = {
    "optimizer_history": [
        {"criterion_name": "RecurrentLabelSmoothedCrossEntropyCriterion",
         "optimizer_name": "FairseqAdam", "lr_scheduler_state": {"best": None},
         "num_updates": 0}
    ],
    "extra_state": {"train_iterator": {"epoch": 1}},
    "last_optimizer_state": None,
}  # fmt: skip


def nmt_inputs(vocab_len: int) -> dict[str, torch.Tensor]:
    """A source batch (right-aligned padding, as fairseq's) and the decoder's input."""
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, vocab_len, (2, 7), generator=g)
    src[1, :2] = 1  # padding on the left of the shorter sentence
    src[:, -1] = 2  # </s>
    prev = torch.randint(4, vocab_len, (2, 5), generator=g)
    prev[:, 0] = 2
    return {"src": src, "src_lengths": torch.tensor([7, 5]), "prev": prev}


def nmt_logits(model, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """The full pass's logits (eval mode)."""
    model.eval()
    with torch.no_grad():
        return model(inputs["src"], inputs["src_lengths"], inputs["prev"])[0]


def nmt_model(arch: str, seed: int = 1):
    """``(model, args, task)`` of ``arch`` at the fixture size."""
    from recurnmt.nmt.build import build_model, toy_dictionary

    torch.manual_seed(seed)
    return build_model(arch, NMT_SIZE, toy_dictionary(VOCAB))


def vision_inputs() -> torch.Tensor:
    return torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))


def write(out: Path) -> None:
    from recurnmt.export import convert
    from recurnmt.vision.checkpoint import save_checkpoint
    from recurnmt.vision.registry import create_model

    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out}: not a folder")
    shutil.rmtree(out, ignore_errors=True)
    (out / "nmt").mkdir(parents=True)
    for arch in NMT_ARCHS:
        model, args, task = nmt_model(arch)
        inputs = nmt_inputs(len(task.source_dictionary))
        checkpoint = {"args": args, "model": model.state_dict(), **FAIRSEQ_STATE}
        torch.save({**checkpoint, **inputs, "logits": nmt_logits(model, inputs)},
                   out / "nmt" / f"{arch}.pt")  # fmt: skip
        if arch == HF_ARCH:
            hf = convert(model, args, arch).eval()
            hf.save_pretrained(out / "hf" / arch)
            with torch.no_grad():
                logits = hf(
                    input_ids=inputs["src"], attention_mask=inputs["src"].ne(1),
                    decoder_input_ids=inputs["prev"],
                ).logits  # fmt: skip
            torch.save({**inputs, "logits": logits}, out / "hf" / arch / "expected.pt")
    for name, kwargs in VISION.items():
        torch.manual_seed(1)
        model = create_model(name, **kwargs).eval()
        x = vision_inputs()
        with torch.no_grad():
            logits = model(x)
        payload = {"model_name": name, "model_kwargs": kwargs, "model": model.state_dict()}
        save_checkpoint(out / "vision" / f"{name}.pt", {**payload, "x": x, "logits": logits})
    print(f"wrote {out}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT)
    write(parser.parse_args(argv).out)


if __name__ == "__main__":
    sys.exit(entry_point(main, PROG)())
