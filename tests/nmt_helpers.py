"""Helpers for tests that build fairseq models."""

from __future__ import annotations

import copy

import torch

from recurnmt.nmt.build import build_model, toy_dictionary

DICT = toy_dictionary(40)


def build(arch: str, *extra: str):
    """(model, args, task) for ``arch`` with dropout off."""
    return build_model(arch, ["--dropout", "0", *extra], DICT)


def train_signals(model) -> None:
    """Makes every level signal and relaxed level's LoRA non-zero, as after training (they
    start at zero)."""
    for name, p in model.named_parameters():
        if "signal" in name or ".lora." in name:
            torch.nn.init.normal_(p, std=0.2)


def untied(model):
    """A copy of ``model`` whose encoder and decoder levels hold separate weight copies."""
    ref = copy.deepcopy(model)
    ref.encoder.stack = model.encoder.stack.untied()
    ref.decoder.stack = model.decoder.stack.untied()
    return ref.eval()


def batch(seed: int = 0, bsz: int = 3, src_len: int = 7, tgt_len: int = 6):
    """Random source (with some padding) and target-prefix token batches."""
    g = torch.Generator().manual_seed(seed)
    lo, hi = DICT.nspecial, len(DICT)
    src = torch.randint(lo, hi, (bsz, src_len), generator=g)
    src[:, -1] = DICT.eos()
    lengths = torch.full((bsz,), src_len)
    if bsz > 1:  # left-pad the second sentence, as fairseq's translation task does
        src[1, :2] = DICT.pad()
        lengths[1] = src_len - 2
    prev = torch.randint(lo, hi, (bsz, tgt_len), generator=g)
    prev[:, 0] = DICT.eos()
    return src, lengths, prev


def full_and_stepwise(model, src, lengths, prev):
    """The decoder's full pass over ``prev`` and its step-by-step outputs (concatenated),
    with the full pass's extra outputs and the incremental state after the last step."""
    with torch.no_grad():
        enc = model.encoder(src, lengths)
        full, extra = model.decoder(prev, enc)
        state: dict = {}
        steps = [
            model.decoder(prev[:, : t + 1], enc, incremental_state=state)[0]
            for t in range(prev.size(1))
        ]
    return full, torch.cat(steps, dim=1), extra, state
