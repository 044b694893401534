"""``recurnmt-convert``: a trained transformer as a relaxed recursive model (Relaxed Recursive
Transformers). At full rank the converted model's logits are the source's; at rank 0 it is
plain sharing; a bad source or setting fails at once, naming it. The command line through
fairseq-generate and fairseq-train is in ``tests/test_convert_e2e.py``."""

from __future__ import annotations

import argparse
import re
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


def old_format(state: dict) -> dict:
    """``state`` (a fairseq checkpoint) as fairseq's older releases wrote theirs, the WMT16 and
    WMT19 transformers among them: every setting in a top-level ``args`` (no ``cfg``), the
    attention's Q, K and V fused in ``in_proj_weight``, norms as ``layer_norms.N``, an untied
    output projection as ``decoder.embed_out``, the epoch at the top of ``extra_state``."""
    cfg = state["cfg"]
    task = {k: v for k, v in dict(cfg["task"]).items() if k != "_name"}
    args = argparse.Namespace(**(task | vars(cfg["model"]) | {"task": cfg["task"]["_name"]}))
    for name in ("_name", "max_source_positions", "max_target_positions"):
        args.__dict__.pop(name, None)
    args.max_positions = 1024  # renamed to max_source/target_positions since
    model = dict(state["model"])
    for key in [k for k in model if k.endswith("q_proj.weight") or k.endswith("q_proj.bias")]:
        stem, kind = key.rsplit(".q_proj.", 1)
        parts = [model.pop(f"{stem}.{x}_proj.{kind}") for x in "qkv"]
        model[f"{stem}.in_proj_{kind}"] = torch.cat(parts)
    norms = {"encoder": ("self_attn", "final"), "decoder": ("self_attn", "encoder_attn", "final")}
    for key in [k for k in model if k.split(".")[1] == "layers" and "_layer_norm." in k]:
        side, _, i, name, *rest = key.split(".")
        if name.endswith("_layer_norm"):
            j = norms[side].index(name.removesuffix("_layer_norm"))
            model[".".join([side, "layers", i, "layer_norms", str(j), *rest])] = model.pop(key)
    if "decoder.output_projection.weight" in model:
        head = model.pop("decoder.output_projection.weight")
        if not (args.share_all_embeddings or args.share_decoder_input_output_embed):
            model["decoder.embed_out"] = head
    return {
        "args": args,
        "model": model,
        "optimizer_history": [
            {
                "criterion_name": "LabelSmoothedCrossEntropyCriterion",
                "optimizer_name": "FairseqAdam",
                "lr_scheduler_state": {"best": 3.5},
                "num_updates": 1000,
            }
        ],  # fmt: skip
        "extra_state": {"epoch": 3, "batch_offset": 0, "val_loss": 3.5},
        "last_optimizer_state": None,
    }


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


@pytest.mark.parametrize("flags", [[], [*PRE_LN, "--share-all-embeddings"]], ids=["untied", "tied"])
def test_a_checkpoint_of_fairseqs_older_releases_converts_exactly(tmp_path, flags):
    """fairseq's released WMT models keep ``args`` and no ``cfg``, fused in-projections and
    ``layer_norms.N``: read and upgraded as fairseq reads them."""
    source = save_source(tmp_path / "new.pt", "transformer", *flags)
    old = old_format(torch.load(tmp_path / "new.pt", weights_only=False))
    assert "encoder.layers.0.self_attn.in_proj_weight" in old["model"]
    torch.save(old, tmp_path / "old.pt")
    _, args, kind = conv.read_checkpoint(tmp_path / "old.pt")
    assert (kind, args.arch, args.max_source_positions) == ("fairseq", "transformer", 1024)
    conv.convert(tmp_path / "old.pt", tmp_path / "out.pt", encoder_unique_layers=2,
                 decoder_unique_layers=1, level_lora_rank="full")  # fmt: skip
    model, state = load_converted(tmp_path / "out.pt")
    assert max_diff(model, source) <= 1e-4
    assert state["args"] is None and state["cfg"]["model"].arch == "relaxed_transformer"


FAMILIES = {  # one architecture of every family: exact at full rank, or refused (why)
    "recurrent_transformer": None,
    "ringformer": None,  # its level signals start at zero
    "relaxed_transformer": None,
    "universal_transformer": "level_signal='static', positions='every-level'",
    "universal_transformer_act": "halt per token (ACT)",
    "owf": "share a module (One Wide FFN)",
    "sret": "the source's layers have no lrc.main",
}


def test_every_family_is_a_target():
    from recurnmt.nmt.defaults import ARCHS

    assert {family for family, *_ in ARCHS.values()} == set(FAMILIES)


@pytest.mark.parametrize("arch", FAMILIES)
def test_every_target_is_exact_at_full_rank_or_refused_saying_why(tmp_path, capsys, arch):
    source = save_source(tmp_path / "src.pt", "transformer")
    out = tmp_path / "out.pt"
    argv = [str(tmp_path / "src.pt"), str(out), "--arch", arch, "--encoder-unique-layers", "2",
            "--decoder-unique-layers", "1", "--level-lora-rank", "full"]  # fmt: skip
    if FAMILIES[arch] is None:
        assert conv.cli(argv) == 0
        assert max_diff(load_converted(out)[0], source) <= 1e-4
        assert "keep 100.0% of the energy" in capsys.readouterr().out
    else:
        err = _one_line_error(capsys, argv)
        assert f"error: --arch={arch}" in err and FAMILIES[arch] in err
        assert "--criterion" not in err and not out.exists()


def test_a_low_rank_prints_its_measured_difference_and_the_energy_kept(tmp_path, capsys):
    source = save_source(tmp_path / "src.pt", "transformer")
    out = tmp_path / "r8.pt"
    argv = [str(tmp_path / "src.pt"), str(out), "--unique-layers", "1", "--level-lora-rank", "8"]
    assert conv.cli(argv) == 0
    printed = capsys.readouterr().out
    kept = float(re.search(r"the LoRAs keep ([\d.]+)% of the energy", printed).group(1))
    said = float(re.search(r"max logit difference from the source (\S+) on", printed).group(1))
    assert 25 < kept < 100  # rank 8 of 32: part of it
    assert said == pytest.approx(conv.logit_difference(source, load_converted(out)[0],
                                                        (len(DICT), len(DICT)))[0], rel=1e-2)  # fmt: skip
    assert said > 1e-3  # not the source


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
    from recurnmt.experiments import averaging

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
