"""Checkpoint averaging: fairseq's average_checkpoints.py semantics, sharing kept."""

from __future__ import annotations

import collections
from pathlib import Path

import pytest
import torch

from recurnmt.experiments import averaging
from recurnmt.experiments.averaging import average_checkpoints, last_checkpoints


def fake_checkpoint(path: Path, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    shared = torch.randn(4, 3, generator=g)
    model = collections.OrderedDict(
        [
            ("encoder.blocks.0.w", shared),
            ("encoder.levels.0.w", shared),  # one tensor under two keys (a shared block)
            ("decoder.b", torch.randn(3, generator=g)),
            ("decoder.half", torch.randn(2, generator=g).half()),
            ("encoder.version", torch.tensor([seed])),  # integer: not averaged
        ]
    )
    state = {"model": model, "cfg": {"seed": seed}, "last_optimizer_state": {"m": 1}}
    torch.save(state, path)
    return state


def fairseq_reference(paths):
    """fairseq's scripts/average_checkpoints.py loop (per key, float32 sums), for comparison."""
    sums = collections.OrderedDict()
    for p in paths:
        for k, v in torch.load(p)["model"].items():
            v = v.float() if v.is_floating_point() else v
            sums[k] = v.clone() if k not in sums else sums[k] + v
    return {k: v / len(paths) for k, v in sums.items() if v.is_floating_point()}


def test_average_matches_fairseq_and_keeps_sharing(tmp_path):
    paths = [tmp_path / f"checkpoint_1_{u}.pt" for u in (10, 20, 30)]
    states = [fake_checkpoint(p, i) for i, p in enumerate(paths)]
    avg = average_checkpoints(paths)
    ref = fairseq_reference(paths)
    for k, want in ref.items():
        torch.testing.assert_close(avg["model"][k].float(), want, rtol=1e-3, atol=1e-3)
        assert avg["model"][k].dtype == states[0]["model"][k].dtype
    torch.testing.assert_close(avg["model"]["decoder.b"], ref["decoder.b"], rtol=1e-6, atol=1e-7)
    assert torch.equal(avg["model"]["encoder.version"], torch.tensor([0]))  # the first's
    assert avg["cfg"] == {"seed": 0} and "last_optimizer_state" not in avg
    assert list(avg["model"]) == list(states[0]["model"])

    out = averaging.save_atomically(avg, tmp_path / "avg.pt")
    back = torch.load(out)["model"]
    a, b = back["encoder.blocks.0.w"], back["encoder.levels.0.w"]
    assert a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()  # stored once
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_last_checkpoints_by_number(tmp_path):
    for name in [
        "checkpoint_1_100.pt",
        "checkpoint_1_200.pt",
        "checkpoint_2_1000.pt",
        "checkpoint2.pt",
        "checkpoint10.pt",
        "checkpoint_last.pt",
        "checkpoint_best.pt",
        "checkpoint_avg5.pt",
    ]:
        (tmp_path / name).write_bytes(b"")
    names = lambda ps: [p.name for p in ps]  # noqa: E731
    assert names(last_checkpoints(tmp_path, 2)) == ["checkpoint_2_1000.pt", "checkpoint_1_200.pt"]
    assert names(last_checkpoints(tmp_path, 2, upper_bound=500)) == [
        "checkpoint_1_200.pt",
        "checkpoint_1_100.pt",
    ]
    assert names(last_checkpoints(tmp_path, 2, by="epoch")) == ["checkpoint10.pt", "checkpoint2.pt"]
    with pytest.raises(ValueError, match="holds 3 checkpoint_E_U.pt checkpoint"):
        last_checkpoints(tmp_path, 5)


def test_mismatched_checkpoints_are_refused(tmp_path):
    fake_checkpoint(tmp_path / "a.pt", 0)
    state = fake_checkpoint(tmp_path / "b.pt", 1)
    del state["model"]["decoder.b"]
    torch.save(state, tmp_path / "b.pt")
    with pytest.raises(ValueError, match="other parameters"):
        average_checkpoints([tmp_path / "a.pt", tmp_path / "b.pt"])
    with pytest.raises(ValueError, match="no checkpoints"):
        average_checkpoints([])


def test_command_line(tmp_path, capsys):
    for u in (1, 2):
        fake_checkpoint(tmp_path / f"checkpoint_1_{u}.pt", u)
    out = tmp_path / "avg.pt"
    assert averaging.main(["--dir", str(tmp_path), "--last", "2", "--output", str(out)]) == 0
    assert out.is_file() and "averaging" in capsys.readouterr().out
    assert averaging.cli(["--dir", str(tmp_path), "--last", "3", "--output", str(out)]) == 2
    assert "2 checkpoint_E_U.pt" in capsys.readouterr().err
