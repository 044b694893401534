"""A side is one object of the block library: every front end's encoder and decoder is a
``Side``, built by one constructor around one token front end, and the token front end's own
positions (fairseq's layout, without fairseq) are fairseq's position modules' to the bit."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from torch import nn

from recurnmt.export import convert
from recurnmt.modules.decoding.protocol import DecodingSide
from recurnmt.modules.memory import Memory
from recurnmt.modules.side import Side
from recurnmt.modules.tokens import TokenConfig, TokenFrontEnd
from recurnmt.nmt.embedding import TokenEmbedding
from recurnmt.nmt.generation import decoding_side
from tests.nmt_helpers import DICT, batch, build

ROOT = Path(__file__).resolve().parents[1]


def test_every_front_ends_sides_are_the_block_librarys_side():
    model, args, _ = build("universal_transformer_tiny")
    hf = convert(model.eval(), args, "universal_transformer_tiny")
    sides = [model.encoder, model.decoder, hf.encoder, hf.decoder]
    assert all(isinstance(side, Side) for side in sides)
    assert all(isinstance(side.embed, TokenFrontEnd) for side in sides)
    assert isinstance(model.encoder.embed, TokenEmbedding)  # fairseq's positions, in fairseq
    assert type(hf.encoder.embed) is TokenFrontEnd  # the exported model's own
    assert all(side.positions_every_level and not side.embed.add_positions for side in sides)


def test_the_token_front_end_and_the_side_constructor_are_written_once():
    """No front end builds a side's parts itself: only the side's constructor assigns a
    built stack or token front end to a module, and ``embed_scale *`` appears in one module."""
    makers = ("build_stack", "TokenFrontEnd", "TokenEmbedding", "front_end")
    built, sums = set(), []
    for path in (ROOT / "recurnmt").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        name = path.relative_to(ROOT).as_posix()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                func = node.value.func
                called = getattr(func, "id", None) or getattr(func, "attr", None)
                on_self = any(isinstance(t, ast.Attribute) for t in node.targets)
                if called in makers and on_self:
                    built.add(name)
        if "embed_scale *" in text:
            sums.append(name)
    assert built == {"recurnmt/modules/side.py"}
    assert sums == ["recurnmt/modules/tokens.py"]


@pytest.mark.parametrize("positions", ["sinusoidal", "learned"])
def test_the_block_librarys_positions_are_fairseqs(positions):
    """Full passes with padding, steps at an offset, several positions at once, the rows a
    static step reads, and positions beyond fairseq's built table."""
    torch.manual_seed(0)
    tokens = TokenConfig(positions=positions)
    embed = nn.Embedding(len(DICT), 16, padding_idx=DICT.pad())
    theirs = TokenEmbedding(tokens, embed, max_positions=12)
    ours = TokenFrontEnd(tokens, embed, max_positions=12)
    if positions == "learned":
        ours.embed_positions.load_state_dict(theirs.embed_positions.state_dict())
    src, _, _ = batch()  # left padding in the second sentence
    assert torch.equal(ours.positions(src), theirs.positions(src))
    step = src[:, -2:].clamp(min=DICT.nspecial)  # generated tokens hold no padding
    for offset in (1, 5):
        assert torch.equal(ours.positions(step, offset), theirs.positions(step, offset))
    assert torch.equal(ours.position_rows(10), theirs.position_rows(10))
    x, scaled, p = theirs(src)
    assert torch.equal(theirs.embedded(src, p), x) and torch.equal(ours(src)[0], x)
    if positions == "sinusoidal":  # fairseq extends its table; so do the rows read from it
        assert torch.equal(ours.position_rows(40), theirs.position_rows(40))


def test_a_fairseq_decoders_step_embeds_as_its_full_pass():
    model, _, _ = build("ringformer_tiny")
    model.eval()
    src, lengths, prev = batch()
    decoder = model.decoder
    with torch.no_grad():
        full, _, _ = decoder.embed(prev)
        for t in range(prev.size(1)):
            step, _ = decoder.embed_step(prev[:, t : t + 1], t)
            assert torch.equal(step[:, 0], full[:, t])


def test_a_decoding_side_keeps_the_rows_asked_for_and_their_group():
    model, _, _ = build("ringformer_tiny")
    model.eval()
    src, lengths, prev = batch()
    with torch.no_grad():
        encoder_out = model.encoder(src, lengths)
    side = decoding_side(model.decoder, encoder_out, group=2)
    assert isinstance(side, DecodingSide) and side.memory.group == 2
    assert side.memory.padding_mask is not None  # the second sentence is padded
    side.select(torch.tensor([1, 2]))
    memory = encoder_out["encoder_out"][0].transpose(0, 1)
    assert torch.equal(side.memory.states, memory[[1, 2]]) and side.memory.group == 2
    padded = DecodingSide(model.decoder, Memory(memory), model.decoder.output_layer)
    padded.select(torch.tensor([0]))
    assert padded.memory.padding_mask is None
