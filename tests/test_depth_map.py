"""The depth map (issue 74 item 5): per decoder level, which teacher-forced argmaxes already are
the full depth's, checked against a slow reference that runs the model at each depth."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from recurnmt.analysis.depth_map import (
    DepthMap,
    check_decoder,
    depth_map,
    level_predictions,
    main,
    where_depth_pays,
)
from recurnmt.analysis.nmt_inputs import load_nmt_models, translation_batches
from tests.nmt_helpers import DICT, build, train_signals

SMALL = ["--encoder-embed-dim", "16", "--decoder-embed-dim", "16"]
SMALL += ["--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32"]
SMALL += ["--encoder-attention-heads", "2", "--decoder-attention-heads", "2"]
SMALL += ["--encoder-layers", "2", "--share-all-embeddings"]
SENTENCES = 10
IMAGE_CHECKPOINT = (
    Path(__file__).parent / "fixtures" / "compat" / "vision" / "ringformer_vit_mini_patch4.pt"
)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A binarized test subset of random sentences over the toy dictionary (``src``-``tgt``,
    the languages of ``nmt_helpers.build``'s arguments)."""
    from fairseq.data import indexed_dataset

    root = tmp_path_factory.mktemp("depth_map_data")
    g = torch.Generator().manual_seed(0)
    for lang in ("src", "tgt"):
        DICT.save(str(root / f"dict.{lang}.txt"))
        stem = str(root / f"test.src-tgt.{lang}")
        builder = indexed_dataset.make_builder(stem + ".bin", "mmap", vocab_size=len(DICT))
        for _ in range(SENTENCES):
            length = int(torch.randint(3, 9, (1,), generator=g))
            words = torch.randint(DICT.nspecial, len(DICT), (length,), generator=g)
            builder.add_item(torch.cat([words, torch.tensor([DICT.eos()])]))
        builder.finalize(stem + ".idx")
    return root


def save_checkpoint(path: Path, data: Path, arch: str, *flags: str) -> Path:
    """An untrained checkpoint in fairseq's format, its level signals made non-zero."""
    torch.manual_seed(0)
    model, args, _ = build(arch, *SMALL, *flags)
    train_signals(model)
    args.data = str(data)
    history = [{"criterion_name": "x", "optimizer_name": "x", "lr_scheduler_state": {}}]
    state = {"args": args, "model": model.state_dict(), "optimizer_history": history}
    torch.save({**state, "extra_state": {"epoch": 1}}, path)
    return path


def loaded(path: Path, data: Path):
    """(model, its test batches of 4 sentences, the padding index)."""
    models, _, task = load_nmt_models([path], data, torch.device("cpu"))
    return models[0], translation_batches(task, "test", None, 4), task.target_dictionary.pad()


# ------------------------------------------------------------------------------- the counts


def slow_counts(predictions: list[list[int]], target: list[int]) -> dict[str, list[int]]:
    """The definitions of the module docstring, one token at a time."""
    n_levels = len(predictions)
    out = {k: [0] * n_levels for k in ("agree", "corrects", "breaks", "exits", "correct")}
    for t, ref in enumerate(target):
        column = [predictions[r][t] for r in range(n_levels)]
        full = column[-1]
        agree = [a == full for a in column]
        for r in range(n_levels):
            before = agree[r - 1] if r else False
            out["agree"][r] += agree[r]
            out["corrects"][r] += agree[r] and not before
            out["breaks"][r] += before and not agree[r]
            out["correct"][r] += column[r] == ref
        exit_level = min(r for r in range(n_levels) if all(agree[r:]))
        out["exits"][exit_level] += 1
    return out


def test_counts_of_hand_made_predictions():
    # tokens: settled at 1; wrong then right; right, broken, right again; settled at 3
    predictions = torch.tensor([[5, 1, 7, 2], [5, 6, 3, 2], [5, 6, 7, 9]])
    result = DepthMap.of(predictions, torch.tensor([5, 6, 0, 2]))
    assert result.agree.tolist() == [2, 2, 4]
    assert result.corrects.tolist() == [2, 1, 2]
    assert result.breaks.tolist() == [0, 1, 0]
    assert result.exits.tolist() == [1, 1, 2]
    assert result.exit_share == [0.25, 0.5, 1.0]
    assert result.correct.tolist() == [2, 3, 2]
    assert result.mean_exit_level == pytest.approx((1 + 2 + 3 + 3) / 4)
    slow = slow_counts(predictions.tolist(), [5, 6, 0, 2])
    assert {k: getattr(result, k).tolist() for k in slow} == slow
    assert where_depth_pays(result) == (
        "25.0% of the tokens are settled at level 1, 25.0% settle at level 2 (the most of "
        "levels 2-2); 50.0% need all 3 levels; mean oracle exit level 2.25 of 3"
    )


def test_batches_add_up():
    g = torch.Generator().manual_seed(1)
    predictions = torch.randint(0, 3, (4, 50), generator=g)
    target = torch.randint(0, 3, (50,), generator=g)
    whole = DepthMap.of(predictions, target)
    summed = DepthMap.empty(4)
    for part in (slice(0, 13), slice(13, 50)):
        summed.add(DepthMap.of(predictions[:, part], target[part]))
    assert summed.as_dict() == whole.as_dict()
    with pytest.raises(ValueError, match="3 levels added to a map of 4"):
        summed.add(DepthMap.empty(3))


# --------------------------------------------------------------------- against the model


def elastic_reference(model, sample, pad: int, levels) -> list[list[int]]:
    """Each level's argmax from a full pass of the model run at that depth (``levels(r)``
    sets it), the output layer on the stack's output as fairseq's scorers read it."""
    keep = sample["target"].ne(pad)
    out = []
    with torch.no_grad():
        for r in range(1, model.decoder.stack.num_levels + 1):
            levels(model.decoder.stack, r)
            logits, _ = model(**sample["net_input"])  # B x T x V
            out.append(logits.argmax(-1)[keep].tolist())
    levels(model.decoder.stack, None)
    return out


def _elastic_depth(stack, r):
    stack.set_depth(r)  # --decoder-levels r: the first r levels of one shared block


def _first_levels(stack, r):
    # the first r levels in order (relaxed recursion's cycle, SReT's loops and a plain stack
    # have no elastic depth of every r, or another one)
    stack.run_levels = None if r is None else list(range(r))


@pytest.mark.parametrize(
    "arch, flags, levels",
    [
        ("ringformer_tiny", ["--decoder-layers", "4"], _elastic_depth),
        ("universal_transformer_tiny", ["--decoder-layers", "3"], _elastic_depth),
        ("relaxed_transformer_tiny", ["--decoder-layers", "6"], _first_levels),
        ("sret_tiny", [], _first_levels),
        ("recurrent_transformer_tiny", ["--decoder-layers", "3"], _first_levels),
    ],
)
def test_equals_the_slow_reference_at_every_depth(data, tmp_path, arch, flags, levels):
    model, batches, pad = loaded(save_checkpoint(tmp_path / "m.pt", data, arch, *flags), data)
    n_levels = model.decoder.stack.num_levels
    total = DepthMap.empty(n_levels)
    for sample in batches:
        predictions, target = level_predictions(model, sample, pad)
        reference = elastic_reference(model, sample, pad, levels)
        assert predictions.tolist() == reference
        slow = slow_counts(reference, sample["target"][sample["target"].ne(pad)].tolist())
        counts = DepthMap.of(predictions, target)
        assert {k: getattr(counts, k).tolist() for k in slow} == slow
        total.add(counts)
    assert total.as_dict() == depth_map(model, batches, pad, torch.device("cpu")).as_dict()
    assert total.tokens == sum(int(b["ntokens"]) for b in batches)
    assert total.agreement[0] < 1  # the levels differ: the comparison is not vacuous


def test_shares_are_monotone_and_corrections_balance(data, tmp_path):
    path = save_checkpoint(tmp_path / "m.pt", data, "ringformer_tiny", "--decoder-layers", "4")
    model, batches, pad = loaded(path, data)
    result = depth_map(model, batches, pad, torch.device("cpu"))
    exits, agreement = result.exit_share, result.agreement
    assert all(a <= b for a, b in zip(exits, exits[1:], strict=False))
    assert exits[-1] == 1.0 and agreement[-1] == 1.0
    assert all(e <= a for e, a in zip(exits, agreement, strict=True))
    agree = [0, *result.agree.tolist()]  # level 0 agrees nowhere
    for r in range(result.levels):
        assert int(result.corrects[r] - result.breaks[r]) == agree[r + 1] - agree[r]
    assert 1 <= result.mean_exit_level <= result.levels
    assert sum(result.exits.tolist()) == result.tokens


def test_a_decoder_without_a_recurnmt_stack_is_refused():
    model, _, _ = build("transformer", *SMALL, "--decoder-layers", "2")
    with pytest.raises(ValueError, match="TransformerDecoder.*not a recurnmt recurrent decoder"):
        check_decoder(model)


# ---------------------------------------------------------------------------- command line


@pytest.mark.e2e
def test_cli_writes_json_and_png_and_prints_a_table(data, tmp_path, capsys):
    path = save_checkpoint(tmp_path / "m.pt", data, "universal_transformer_tiny")
    out = tmp_path / "map"
    report = main([str(path), "--data", str(data), "--out", str(out), "--batch-size", "3"])
    written = json.loads((out / "depth_map.json").read_text(encoding="utf-8"))
    assert written == json.loads(json.dumps(report))
    assert written["arch"] == "universal_transformer_tiny" and written["sentences"] == SENTENCES
    rows = written["per_level"]
    assert [row["level"] for row in rows] == list(range(1, written["levels"] + 1))
    assert rows[-1]["agreement"] == 1.0 and rows[-1]["exit_share"] == 1.0
    assert (out / "depth_map.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "depth_map.png").stat().st_size > 10_000
    printed = capsys.readouterr().out
    assert "level   agree  exit<=r  corrects  breaks  accuracy" in printed
    assert "mean oracle exit level" in printed


def _one_line_error(capsys, argv: list[str]) -> str:
    from recurnmt.analysis.depth_map import cli

    assert cli(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("recurnmt-depth-map: error: "), err
    return err[0]


def test_a_missing_or_corrupt_checkpoint_fails_in_one_line(data, tmp_path, capsys):
    good = save_checkpoint(tmp_path / "good.pt", data, "ringformer_tiny").read_bytes()
    (tmp_path / "cut.pt").write_bytes(good[: len(good) // 2])
    (tmp_path / "notes.pt").write_text("not a checkpoint\n", encoding="utf-8")
    (tmp_path / "image.pt").write_bytes(IMAGE_CHECKPOINT.read_bytes())
    for name, says in (
        ("gone.pt", "does not exist"),
        ("cut.pt", "truncated or damaged"),
        ("notes.pt", "a text file"),
        ("image.pt", "not a fairseq checkpoint"),
    ):
        line = _one_line_error(capsys, [str(tmp_path / name), "--data", str(data)])
        assert name in line and says in line


@pytest.mark.e2e
def test_act_is_refused_in_one_line(data, tmp_path, capsys):
    path = save_checkpoint(tmp_path / "act.pt", data, "universal_transformer_act_tiny")
    line = _one_line_error(capsys, [str(path), "--data", str(data), "--out", str(tmp_path)])
    assert "ACT (--act on)" in line and "no level is an exit" in line
    assert not (tmp_path / "depth_map.json").exists()
