"""``recurnmt-convert``: a trained transformer as a relaxed recursive model (Relaxed Recursive
Transformers). At full rank the converted model's logits are the source's; at rank 0 it is
plain sharing; a bad source or setting fails at once, naming it. The command line through
fairseq-generate and fairseq-train is in ``tests/test_convert_e2e.py``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from recurnmt.nmt import convert as conv
from recurnmt.nmt.build import arch_train_args
from tests.nmt_helpers import DICT, batch, build

SIZES = [
    "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
    "--encoder-ffn-embed-dim", "48", "--decoder-ffn-embed-dim", "48",
    "--encoder-layers", "4", "--decoder-layers", "2",
    "--encoder-attention-heads", "4", "--decoder-attention-heads", "2",
]  # fmt: skip
PRE_LN = ["--encoder-normalize-before", "--decoder-normalize-before"]


def _trained(model) -> None:
    """Gives every weight a value of its own, as training would (norms and biases too)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(mean=1.0 if "norm" in name and name.endswith("weight") else 0.0, std=0.2)


def save_source(path: Path, arch: str, *flags: str):
    """A fairseq checkpoint of ``arch`` (random "trained" weights); returns the model."""
    model, _, _ = build(arch, *SIZES, *flags)
    _trained(model)
    args = arch_train_args(arch, ["--dropout", "0", *SIZES, *flags])
    state = {
        "args": None,
        "cfg": {"model": args, "task": {"_name": "translation", "data": "unused"}},
        "model": model.state_dict(),
        "criterion": None,
        "optimizer_history": [
            {"criterion_name": "X", "optimizer_name": "Y", "lr_scheduler_state": {}}
        ],
        "extra_state": {"train_iterator": {"epoch": 3}},
        "last_optimizer_state": None,
    }
    torch.save(state, path)
    return model.eval()


def load_converted(path: Path):
    """The converted model of a checkpoint written by ``recurnmt-convert``."""
    state = torch.load(path, weights_only=True)
    args = state["cfg"]["model"]
    vocab = (len(DICT), len(DICT))
    model = conv._build(args, vocab, conv._joined(args))
    model.load_state_dict(state["model"], strict=True)
    return model.eval(), state


def max_diff(a, b) -> float:
    src, lengths, prev = batch(bsz=4)
    with torch.no_grad():
        return (a(src, lengths, prev)[0] - b(src, lengths, prev)[0]).abs().max().item()


CASES = [
    ("transformer", [], "stepwise"),  # post-LN, embeddings of its own, untied head
    ("transformer", [*PRE_LN, "--share-all-embeddings"], "average"),
    ("transformer", ["--share-decoder-input-output-embed", "--encoder-learned-pos"], "lower"),
    ("transformer", ["--layernorm-embedding", "--decoder-normalize-before"], "stepwise"),
    ("recurrent_transformer", [*PRE_LN, "--share-all-embeddings"], "average"),
    # a shared source: untied first
    ("recurrent_transformer", ["--encoder-unique-layers", "2", "--activation-fn", "gelu"], "lower"),
]


@pytest.mark.parametrize(("arch", "flags", "init"), CASES, ids=lambda c: str(c))
def test_full_rank_conversion_gives_the_sources_logits(tmp_path, arch, flags, init):
    source = save_source(tmp_path / "src.pt", arch, *flags)
    result = conv.convert(
        tmp_path / "src.pt",
        tmp_path / "out.pt",
        encoder_unique_layers=2,
        decoder_unique_layers=1,
        init=init,
        level_lora_rank="full",
    )
    model, state = load_converted(tmp_path / "out.pt")
    assert max_diff(model, source) <= 1e-4
    assert model.encoder.stack.plan.block_of_level == (0, 1, 0, 1)  # the paper's loop (eq. 2)
    assert model.encoder.stack.block_of_level(0) is model.encoder.stack.block_of_level(2)
    assert state["optimizer_history"][-1]["num_updates"] == 0
    assert result.p_star > result.p_star_source  # full rank: more than the source
    assert "--level-lora-rank=full" in result.flags


def test_rank_zero_is_plain_sharing_of_the_chosen_layers(tmp_path):
    source = save_source(tmp_path / "src.pt", "transformer", *PRE_LN)
    blocks = {"encoder_unique_layers": 2, "decoder_unique_layers": 1}
    conv.convert(tmp_path / "src.pt", tmp_path / "out.pt", **blocks, level_lora_rank=0)
    model, _ = load_converted(tmp_path / "out.pt")
    assert all(parts.lora is None for parts in model.encoder.stack.levels)
    # stepwise over 4 layers and 2 blocks: layers 0 and 3 (the authors' linspace)
    ours = model.encoder.stack.blocks[1].ffn.up.weight
    assert torch.equal(ours, source.encoder.layers[3].fc1.weight)
    low = conv.convert(tmp_path / "src.pt", tmp_path / "r8.pt", **blocks, level_lora_rank=8)
    relaxed, _ = load_converted(tmp_path / "r8.pt")
    # level 2 runs block 0 (layer 0's weights): rank 8 moves its W_up towards layer 2's
    want = source.encoder.layers[2].fc1.weight
    shared = relaxed.encoder.stack.blocks[0].ffn.up.weight
    lora = relaxed.encoder.stack.levels[2].lora["ffn_up"].weight_delta()
    assert torch.dist(shared + lora, want) < torch.dist(shared, want)
    assert low.p_star < low.p_star_source


def test_the_command_prints_the_fine_tuning_flags(tmp_path, capsys):
    save_source(tmp_path / "src.pt", "transformer")
    out = tmp_path / "out.pt"
    argv = [str(tmp_path / "src.pt"), str(out), "--unique-layers", "1", "--init", "average"]
    assert conv.cli([*argv, "--level-lora-rank", "4", "--arch", "relaxed_transformer_tiny"]) == 0
    printed = capsys.readouterr().out
    assert "--arch relaxed_transformer_tiny --encoder-unique-layers=1" in printed
    assert "--level-lora-rank=4" in printed and f"--finetune-from-model {out}" in printed
    assert conv.cli(argv) == 2  # OUT exists
    assert "pass --force" in capsys.readouterr().err


def _one_line_error(capsys, argv) -> str:
    assert conv.cli(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    return err


def test_bad_sources_fail_naming_the_file_or_model(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("RECURNMT_TRACEBACK", raising=False)
    out = str(tmp_path / "out.pt")
    err = _one_line_error(capsys, [str(tmp_path / "none.pt"), out])
    assert err == f"recurnmt-convert: error: checkpoint {tmp_path / 'none.pt'} does not exist"
    (tmp_path / "bad.pt").write_bytes(b"not a checkpoint")
    assert "bad.pt is not a fairseq checkpoint" in _one_line_error(
        capsys, [str(tmp_path / "bad.pt"), out]
    )
    save_source(tmp_path / "ring.pt", "ringformer_tiny")
    err = _one_line_error(capsys, [str(tmp_path / "ring.pt"), out])
    assert "holds a 'ringformer_tiny' model; recurnmt-convert converts fairseq's transformer" in err
    save_source(tmp_path / "ut.pt", "recurrent_transformer", "--positions", "every-level")
    err = _one_line_error(capsys, [str(tmp_path / "ut.pt"), out])
    assert "the source has --positions='every-level'" in err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--level-lora-rank", "33"],
            "--level-lora-rank=33: must lie between 0 (no relaxation) and "
            "--encoder-embed-dim=32 (the full rank)",
        ),
        (["--level-lora-rank", "most"], "--level-lora-rank='most': choose a rank >= 0 or full"),
        (
            ["--unique-layers", "3"],
            "--decoder-unique-layers=3: must not exceed --decoder-layers=2 (every unique "
            "block runs at one level or more)",
        ),
        (["--arch", "relaxed"], "--arch='relaxed' is not a recurnmt translation architecture"),
    ],
)
def test_bad_settings_fail_naming_the_flag(tmp_path, capsys, monkeypatch, flags, message):
    monkeypatch.delenv("RECURNMT_TRACEBACK", raising=False)
    save_source(tmp_path / "src.pt", "transformer")
    err = _one_line_error(capsys, [str(tmp_path / "src.pt"), str(tmp_path / "o.pt"), *flags])
    assert err == f"recurnmt-convert: error: {message}"
    assert not (tmp_path / "o.pt").exists()


def test_a_checkpoint_reads_after_a_safe_globals_context_took_namespace_back(tmp_path):
    """torch's ``safe_globals`` context (timm's load_checkpoint) removes argparse.Namespace
    from the allow-list on exit; reading a fairseq checkpoint allows it again."""
    import argparse

    save_source(tmp_path / "src.pt", "transformer")
    with torch.serialization.safe_globals([argparse.Namespace]):
        pass
    _, args, kind = conv.read_checkpoint(tmp_path / "src.pt")
    assert (args.arch, kind) == ("transformer", "fairseq")


def test_every_loader_reads_a_checkpoint_after_a_safe_globals_context(tmp_path):
    """The same for fairseq's own loader (under every ``load_model_ensemble*``: evaluation,
    export, CKA, fairseq-generate in the process) and checkpoint averaging."""
    import argparse

    from fairseq import checkpoint_utils

    from recurnmt import export
    from recurnmt.runs import averaging

    path = tmp_path / "src.pt"
    save_source(path, "transformer")
    for load in (
        lambda: checkpoint_utils.load_checkpoint_to_cpu(str(path)),
        lambda: averaging._load(path),
    ):
        with torch.serialization.safe_globals([argparse.Namespace]):
            pass
        assert load()["extra_state"]["train_iterator"]["epoch"] == 3
    with torch.serialization.safe_globals([argparse.Namespace]):
        pass
    with pytest.raises(ValueError, match="not a recurnmt"):  # read, then refused by name
        export.read_checkpoint(path)
