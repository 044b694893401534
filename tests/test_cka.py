"""Linear CKA (Kornblith et al. 2019) and the level states it compares (RingFormer Fig. 2)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from recurnmt.analysis.cka import (
    CKAAccumulator,
    cka_matrix,
    linear_cka,
    nmt_level_states,
    vision_cka,
)
from tests import nmt_fixtures
from tests.nmt_helpers import DICT, batch, build, train_signals

data = nmt_fixtures.data  # the shared fixture, found by pytest under this name


def _features(n: int = 200, p: int = 12, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, p, generator=g, dtype=torch.float64) + 3.0  # not centred


def _explicit_cka(x: torch.Tensor, y: torch.Tensor) -> float:
    """HSIC(K, L) = tr(K H L H) / (n - 1)^2 with K = X X^T, L = Y Y^T (Gretton et al.)."""
    n = x.size(0)
    h = torch.eye(n, dtype=torch.float64) - 1.0 / n

    def hsic(k, l_):
        return torch.trace(k @ h @ l_ @ h) / (n - 1) ** 2

    k, l_ = x @ x.T, y @ y.T
    return float(hsic(k, l_) / (hsic(k, k) * hsic(l_, l_)).sqrt())


def test_cka_with_itself_is_one():
    x = _features()
    assert linear_cka(x, x).item() == pytest.approx(1.0, abs=1e-12)


def test_invariant_to_orthogonal_transforms_and_isotropic_scaling():
    x, y = _features(seed=0), _features(p=7, seed=1)
    y = y + 0.5 * x[:, :7]  # related, so the value is far from 0
    q, _ = torch.linalg.qr(torch.randn(12, 12, dtype=torch.float64))
    base = linear_cka(x, y).item()
    assert 0.05 < base < 0.95
    assert linear_cka(x @ q * 3.7, y).item() == pytest.approx(base, abs=1e-10)
    assert linear_cka(x, 0.01 * y).item() == pytest.approx(base, abs=1e-10)
    assert linear_cka(x + 5.0, y).item() == pytest.approx(base, abs=1e-10)  # centred


def test_not_invariant_to_general_invertible_linear_maps():
    x, y = _features(seed=0), _features(p=7, seed=1)
    y = y + 0.5 * x[:, :7]
    a = torch.diag(torch.logspace(-2, 2, 12, dtype=torch.float64))  # invertible, anisotropic
    assert abs(linear_cka(x @ a, y).item() - linear_cka(x, y).item()) > 0.05


def test_matches_explicit_hsic_formula():
    x, y = _features(n=60, seed=2), _features(n=60, p=5, seed=3)
    y = y + x[:, :5] ** 2
    assert linear_cka(x, y).item() == pytest.approx(_explicit_cka(x, y), abs=1e-10)


def test_matrix_is_pairwise_and_streaming_is_exact():
    xs = [_features(seed=s) for s in range(3)]
    ys = [_features(p=5, seed=10 + s) + xs[s][:, :5] for s in range(2)]
    full = cka_matrix(xs, ys)
    assert full.shape == (3, 2)
    for i in range(3):
        for j in range(2):
            assert full[i, j].item() == pytest.approx(linear_cka(xs[i], ys[j]).item(), abs=1e-12)
    acc = CKAAccumulator()
    for lo, hi in ((0, 17), (17, 120), (120, 200)):  # uneven batches, float32 products
        acc.update([x[lo:hi].float() for x in xs], [y[lo:hi].float() for y in ys])
    assert torch.allclose(acc.result(), full, atol=1e-5)


@pytest.mark.parametrize(
    "arch, flags",
    [
        ("transformer", ["--encoder-layers", "3", "--decoder-layers", "2"]),
        ("ringformer_tiny", ["--decoder-layers", "2"]),
        ("universal_transformer_tiny", ["--decoder-layers", "2"]),
    ],
)
def test_nmt_level_states_count_shapes_and_padding(arch, flags):
    small = ["--encoder-embed-dim", "16", "--decoder-embed-dim", "16"]
    small += ["--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32"]
    small += ["--encoder-attention-heads", "2", "--decoder-attention-heads", "2"]
    model, _, _ = build(arch, *small, *flags)
    train_signals(model)
    model.eval()
    src, lengths, prev = batch(bsz=3, src_len=7, tgt_len=6)
    target = torch.cat([prev[:, 1:], torch.full((3, 1), DICT.eos())], dim=1)
    target[2, -2:] = DICT.pad()  # a shorter target (right padding)
    prev[2, -1] = DICT.pad()
    sample = {
        "net_input": {"src_tokens": src, "src_lengths": lengths, "prev_output_tokens": prev},
        "target": target,
    }
    states = nmt_level_states(model, sample, DICT.pad())
    assert len(states["encoder"]) == 3 and len(states["decoder"]) == 2
    n_src, n_tgt = int(src.ne(DICT.pad()).sum()), int(target.ne(DICT.pad()).sum())
    assert all(s.shape == (n_src, 16) for s in states["encoder"])
    assert all(s.shape == (n_tgt, 16) for s in states["decoder"])
    # the padded sentence alone, without padding, gives the same token states
    alone = {
        "net_input": {
            "src_tokens": src[1:2, 2:],
            "src_lengths": lengths[1:2],
            "prev_output_tokens": prev[1:2],
        },
        "target": target[1:2],
    }
    single = nmt_level_states(model, alone, DICT.pad())
    first = int(src[0].ne(DICT.pad()).sum())
    for level, s in enumerate(single["encoder"]):
        assert torch.allclose(states["encoder"][level][first : first + s.size(0)], s, atol=1e-5)
    for level, s in enumerate(single["decoder"]):
        assert torch.allclose(states["decoder"][level][6:12], s, atol=1e-5)


def test_vision_cka_of_a_model_with_itself(tmp_path):
    from recurnmt.vision.checkpoint import save_checkpoint
    from recurnmt.vision.registry import create_model

    kwargs = {"img_size": 16, "num_classes": 10, "in_chans": 1, "depth": 3}
    paths = []
    for i, name in enumerate(("ringformer_vit_mini_patch4", "uit_mini_patch4")):
        model = create_model(name, **kwargs)
        payload = {"model_name": name, "model_kwargs": kwargs, "model": model.state_dict()}
        paths.append(tmp_path / f"{i}.pt")
        save_checkpoint(paths[-1], payload)
    names, mats = vision_cka(
        [paths[0], paths[0], paths[1]], "digits", None, 16, 8, torch.device("cpu")
    )
    assert names == ["ringformer_vit_mini_patch4"] * 2 + ["uit_mini_patch4"]
    assert torch.allclose(torch.diagonal(mats[0]), torch.ones(3, dtype=torch.float64))
    assert mats[1].shape == (3, 3) and bool((mats[1] < 1).all())


# ---------------------------------------------------------------------------- command line


def _save_nmt_checkpoint(path: Path, data: Path, arch: str) -> None:
    """An untrained checkpoint in fairseq's format (as fairseq-train would write one)."""
    from fairseq import tasks

    from recurnmt.nmt.build import arch_train_args

    small = ["--encoder-embed-dim", "16", "--decoder-embed-dim", "16"]
    small += ["--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32"]
    small += ["--encoder-attention-heads", "2", "--decoder-attention-heads", "2"]
    small += ["--encoder-layers", "3", "--decoder-layers", "3", "--share-all-embeddings"]
    small += ["--source-lang", "de", "--target-lang", "en"]
    args = arch_train_args(arch, small, data=str(data))
    model = tasks.setup_task(args).build_model(args)
    history = [{"criterion_name": "x", "optimizer_name": "x", "lr_scheduler_state": {}}]
    state = {"args": args, "model": model.state_dict(), "optimizer_history": history}
    torch.save({**state, "extra_state": {"epoch": 1}}, path)


@pytest.mark.e2e
def test_cli_draws_figure_2_for_fairseq_transformer_and_ours(data, tmp_path, capsys):
    from recurnmt.analysis.cka import main

    ckpts = []
    for arch in ("transformer", "ringformer_tiny", "universal_transformer_tiny"):
        ckpts.append(tmp_path / f"{arch}.pt")
        _save_nmt_checkpoint(ckpts[-1], data, arch)
    out = tmp_path / "cka.png"
    result = main(
        ["--data", str(data), "--subset", "test", "--reference", *map(str, ckpts)]
        + ["--max-sentences", "10", "--batch-size", "4", "-o", str(out)]
        + ["--json", str(tmp_path / "cka.json")]
    )
    assert out.stat().st_size > 10_000 and (tmp_path / "cka.json").exists()
    assert result["models"] == ["ringformer_tiny", "universal_transformer_tiny"]
    for side in ("encoder", "decoder"):
        assert len(result["diagonal"][side]) == 2
        assert all(len(d) == 3 and all(0 <= v <= 1 for v in d) for d in result["diagonal"][side])
    printed = capsys.readouterr().out
    assert "encoder  ringformer_tiny vs transformer: diagonal" in printed
