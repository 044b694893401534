"""DVT cascades (Wang et al. 2021): exits, early exit, reuse mechanisms, thresholds, CLI."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from recurnmt.analysis.dispatch import count_dispatch
from recurnmt.modules import shallow_branch
from recurnmt.modules.attention import AttentionTerms, SelfAttention
from recurnmt.parameters import count_parameters
from recurnmt.vision import create_model
from recurnmt.vision.layers.reuse import (
    FeatureReuse,
    RelationReuse,
    upsample_relations,
    upsample_tokens,
)
from recurnmt.vision.models.dvt import DVTCascade
from recurnmt.vision.training.budget import (
    budget_table,
    candidate_thresholds,
    exit_costs,
    simulate,
    solve_thresholds,
)
from recurnmt.vision.training.exits import ExitLogits

SMALL = dict(embed_dim=32, ffn_dim=64, num_heads=2, img_size=32, patch_size=8, num_classes=5)


def cascade(name: str = "dvt_vit_mini_patch2", **kwargs) -> DVTCascade:
    torch.manual_seed(0)
    return create_model(name, **{**SMALL, "grids": (2, 3, 4), **kwargs})


def test_every_exit_has_logits_and_the_stages_see_their_grids():
    model = cascade()
    x = torch.randn(3, 3, 32, 32)
    outs = model.forward_exits(x)
    assert [o.shape for o in outs] == [(3, 5)] * 3
    assert [model.stage_input(k, x).shape[-1] for k in range(3)] == [16, 24, 32]
    assert [s.pos_embed.weight.shape[1] for s in model.stages] == [1 + 4, 1 + 9, 1 + 16]
    assert len(model.forward_exits(x, num_exits=2)) == 2
    model.eval()
    torch.testing.assert_close(model(x), model.forward_exits(x)[-1])
    # the training view sums the losses of all exits (DVT eq. 1)
    assert model.training_wrapper() is model
    exits = model.train()(x)
    assert isinstance(exits, tuple) and len(exits) == model.num_exits
    assert model.eval()(x).shape == (3, 5)


@pytest.mark.parametrize("name", ["dvt_vit_mini_patch2", "dvt_ringformer_vit_mini_patch2"])
def test_early_exit_equals_the_exit_each_sample_takes(name):
    model = cascade(name).eval()
    with torch.no_grad():  # make the heads confident enough to spread the exits
        for s in model.stages:
            s.head.weight.mul_(40)
    x = torch.randn(16, 3, 32, 32)
    with torch.no_grad():
        full = torch.stack(model.forward_exits(x))  # K x B x C
    conf = full.softmax(-1).amax(-1)
    thresholds = [conf[0].median().item(), conf[1].median().item()]
    logits, exit_at = model.early_exit(x, thresholds)
    assert set(exit_at.tolist()) == {0, 1, 2}  # all three exits are used
    expected = (conf[0] >= thresholds[0]).logical_not().long()
    expected += (expected == 1) & (conf[1] < thresholds[1])
    assert exit_at.tolist() == expected.tolist()
    torch.testing.assert_close(logits, full[exit_at, torch.arange(16)])
    last = exit_at == 2  # the last stage, run on a subset, equals the full cascade
    torch.testing.assert_close(logits[last], full[2, last])


def test_early_exit_runs_later_stages_on_the_active_samples_only(monkeypatch):
    model = cascade().eval()
    seen = []
    original = DVTCascade.run_stage

    def spy(self, k, images, up, keep):
        seen.append(images.size(0))
        return original(self, k, images, up, keep)

    monkeypatch.setattr(DVTCascade, "run_stage", spy)
    model.early_exit(torch.randn(6, 3, 32, 32), [0.0, 0.0])  # everyone leaves at exit 1
    assert seen == [6]
    seen.clear()
    model.early_exit(torch.randn(6, 3, 32, 32), [2.0, 2.0])  # nobody leaves early
    assert seen == [6, 6, 6]


def test_reuse_switches_change_parameters_and_outputs():
    both = cascade()
    none = cascade(feature_reuse=False, relation_reuse=False)
    feat = cascade(relation_reuse=False)
    rel = cascade(feature_reuse=False)
    n = {k: count_parameters(m) for k, m in dict(both=both, none=none, f=feat, r=rel).items()}
    assert n["none"] < n["f"] < n["both"] and n["none"] < n["r"] < n["both"]
    assert n["both"] - n["none"] == (n["f"] - n["none"]) + (n["r"] - n["none"])
    assert all(isinstance(m, FeatureReuse) for m in feat.feature_reuse)
    assert all(isinstance(m, RelationReuse) for m in rel.relation_reuse)
    # without reuse, stage k is a plain backbone: its output ignores the upstream stages
    x = torch.randn(2, 3, 32, 32)
    none.eval()
    torch.testing.assert_close(none.forward_exits(x)[2], none.stages[2](none.stage_input(2, x)))
    # with reuse, perturbing stage 1 changes stages 2 and 3
    for model in (feat, rel):
        model.eval()
        with torch.no_grad():  # trained-sized reuse weights (they start near zero)
            for p in [*model.feature_reuse.parameters(), *model.relation_reuse.parameters()]:
                p.normal_(std=0.5)
        before = model.forward_exits(x)
        with torch.no_grad():
            model.stages[0].patch_embed.proj.weight.normal_(std=0.5)
        after = model.forward_exits(x)
        assert not torch.allclose(before[1], after[1])
        assert not torch.allclose(before[2], after[2])


def test_feature_reuse_is_a_layer_norm_over_the_concatenation():
    """DVT eq. 5: MLP(LN(Concat(z', E))) with the backbone's FFN and D' extra columns."""
    model = cascade(relation_reuse=False).eval()
    fr, stage = model.feature_reuse[0], model.stages[1]
    block, norm = stage.stack.blocks[0], stage.stack.blocks[0].norms[1]
    z = torch.randn(2, 10, 32)
    contexts = torch.randn(len(fr.f), 2, 9, 48)
    h, delta = fr.ffn_input(contexts, 0, 1, z, norm)
    e = F.pad(contexts[0], (0, 0, 1, 0))
    ln = torch.nn.LayerNorm(32 + 48, eps=norm.eps)
    with torch.no_grad():
        ln.weight.copy_(torch.cat([norm.weight, fr.norms[0].weight]))
        ln.bias.copy_(torch.cat([norm.bias, fr.norms[0].bias]))
    u = ln(torch.cat([z, e], dim=-1))
    w1 = torch.cat([block.ffn.up.weight, fr.projs[0].weight], dim=1)  # F x (D + D')
    torch.testing.assert_close(block.ffn.up(h) + delta, u @ w1.T + block.ffn.up.bias)


def test_feature_reuse_context_sits_at_its_tokens_location():
    """DVT eq. 4: the context from upstream token n reaches the downstream tokens at the
    same image location (reshaped to the upstream grid, upsampled to the downstream one)."""
    torch.manual_seed(0)
    fr = FeatureReuse(16, 32, 64, (0, 0, 0), hidden_dim=8, context_dim=4)
    tokens = torch.randn(2, 1 + 6, 16)  # a class token, then a 2 x 3 grid
    with torch.no_grad():
        same = fr.contexts(tokens, (2, 3), (2, 3), prefix=1, mode="bilinear")  # L x B x N x D'
        assert same.shape == (3, 2, 6, 4)
        for level, f in enumerate(fr.f):
            torch.testing.assert_close(same[level], f(tokens[:, 1:]))  # level l, token n
        # 2 x 3 -> 4 x 6 by nearest: downstream (i, j) reads upstream (i // 2, j // 2)
        up = fr.contexts(tokens, (2, 3), (4, 6), prefix=1, mode="nearest")
        source = torch.tensor([(i // 2) * 3 + j // 2 for i in range(4) for j in range(6)])
        for level, f in enumerate(fr.f):
            torch.testing.assert_close(up[level], f(tokens[:, 1:])[:, source])


def test_the_last_models_last_level_has_no_context_mlp():
    """Its context would reach only patch tokens that the class-token head never reads."""
    model = cascade()
    assert [len(fr.f) for fr in model.feature_reuse] == [len(model.stages[1].stack.levels)] + [
        len(model.stages[2].stack.levels) - 1
    ]
    pooled = cascade(global_pool="avg")  # the average reads every patch token
    assert len(pooled.feature_reuse[1].f) == len(pooled.stages[2].stack.levels)
    x = torch.randn(2, 3, 32, 32)
    model.eval(), pooled.eval()
    assert torch.isfinite(model(x)).all() and torch.isfinite(pooled(x)).all()


def test_relation_reuse_is_an_additive_sdpa_mask():
    torch.manual_seed(0)
    attn = SelfAttention(16, 2).eval()
    x, bias = torch.randn(2, 5, 16), torch.randn(2, 2, 5, 5)
    logits: list = []
    explicit = attn(x, terms=AttentionTerms(bias=bias, probes=(logits.append,)))
    torch.testing.assert_close(attn(x, terms=AttentionTerms(bias=bias)), explicit)  # SDPA path
    q, k, _ = attn.qkv_proj(x).chunk(3, -1)
    q, k = (t.view(2, 5, 2, 8).transpose(1, 2) for t in (q, k))
    torch.testing.assert_close(logits[0], q @ k.transpose(-1, -2) / 8**0.5 + bias)
    assert not torch.allclose(attn(x), explicit)


def test_only_stages_feeding_relation_reuse_compute_logits(monkeypatch):
    model = cascade().eval()
    calls = []
    original = SelfAttention.forward

    def spy(self, x, **kwargs):
        terms = kwargs.get("terms") or AttentionTerms()
        calls.append((x.size(1), bool(terms.probes), terms.bias is not None))
        return original(self, x, **kwargs)

    monkeypatch.setattr(SelfAttention, "forward", spy)
    model(torch.randn(1, 3, 32, 32))
    depth = model.stages[0].stack.num_levels
    assert calls == (
        [(5, True, False)] * depth + [(10, True, True)] * depth + [(17, False, True)] * depth
    )
    calls.clear()
    cascade(relation_reuse=False).eval()(torch.randn(1, 3, 32, 32))
    assert not any(explicit or bias for _, explicit, bias in calls)


def test_relation_upsampling_resizes_rows_and_columns_on_the_grid():
    # a map that only depends on the key's column and the query's row upsamples to one
    # that still does, with the class-token row and column carried over (DVT Fig. 5)
    rows = torch.arange(2.0).repeat_interleave(2)  # query rows on a 2 x 2 grid
    cols = torch.arange(2.0).repeat(2)  # key columns
    a = torch.zeros(1, 1, 5, 5)
    a[0, 0, 1:, 1:] = rows[:, None] * 10 + cols[None, :]
    a[0, 0, 0, :] = 7.0
    a[0, 0, :, 0] = 3.0
    up = upsample_relations(a, (2, 2), (4, 4), prefix=1, mode="nearest")
    assert up.shape == (1, 1, 17, 17)
    r4, c4 = torch.arange(4).repeat_interleave(4) // 2, torch.arange(4).repeat(4) // 2
    torch.testing.assert_close(up[0, 0, 1:, 1:], (r4[:, None] * 10 + c4[None, :]).float())
    assert (up[0, 0, 0, 1:] == 7).all() and (up[0, 0, 1:, 0] == 3).all()


@pytest.mark.parametrize("mode", ["bilinear", "bicubic", "nearest"])
@pytest.mark.parametrize(("grid_in", "grid_out"), [((7, 7), (14, 14)), ((2, 3), (5, 4))])
def test_reuse_resizes_as_interpolate_does(mode, grid_in, grid_out):
    x = torch.randn(2, grid_in[0] * grid_in[1], 6, dtype=torch.float64)
    image = x.transpose(1, 2).reshape(2, 6, *grid_in)
    align = {} if mode == "nearest" else {"align_corners": False}
    expected = F.interpolate(image, size=grid_out, mode=mode, **align).flatten(2).transpose(1, 2)
    torch.testing.assert_close(upsample_tokens(x, grid_in, grid_out, mode), expected)


def test_reuse_backward_runs_no_interpolation_kernel():
    """The reuse terms resize through matrix products: F.interpolate's backward accumulates
    with atomic adds on CUDA, which made a resumed DVT run differ from one that never
    stopped (issue 25: test_resume_continues_the_same_run[cuda-dvt_vit_mini_patch2])."""
    model = cascade(relation_reuse=True).train()
    x = torch.randn(2, 3, 32, 32)
    with count_dispatch() as log:
        sum(o.sum() for o in model.forward_exits(x)).backward()
    assert [op for op in log.ops if "upsample" in op and "backward" in op] == []
    assert all(p.grad is not None for p in model.relation_reuse.parameters())


def test_recurrent_backbones_share_reuse_columns_like_their_blocks():
    rf = cascade("dvt_ringformer_vit_mini_patch2")
    fr = rf.feature_reuse[0]
    levels = rf.stages[1].stack.num_levels
    assert len(fr.f) == levels and len(fr.projs) == 1  # one shared block: one set of columns
    assert len(fr.norms) == levels  # RingFormer's per-level norms
    uit = cascade("dvt_deit_small_patch16_224", backbone="uit_mini_patch4")
    assert len(uit.feature_reuse[0].projs) == 1 and len(uit.feature_reuse[0].norms) == 1


def test_a_bfloat16_cascade_reuses_relations_in_bfloat16():
    """Attention hands its logits to relationship reuse in float32; the reuse MLP of a
    bfloat16 model takes them in its own dtype (timm's configuration tests cast every model).
    On the meta device, which checks dtypes but computes nothing (the CPU has no bfloat16
    bicubic resize for the stages' inputs)."""
    with torch.device("meta"):
        model = cascade(relation_reuse=True).eval().to(torch.bfloat16)
        out = model(torch.empty(2, 3, 32, 32, dtype=torch.bfloat16))
    assert out.dtype == torch.bfloat16 and out.shape == (2, 5)


def test_impossible_settings_name_the_setting():
    with pytest.raises(ValueError, match="backbone='vit_nope'"):
        cascade(backbone="vit_nope")
    with pytest.raises(ValueError, match="backbone='sret_mini'"):
        cascade(backbone="sret_mini")
    with pytest.raises(TypeError, match="not_a_model_arg"):  # no model's keyword: as any model
        cascade(not_a_model_arg=1)
    with pytest.raises(ValueError, match=r"grids=\(\(3, 3\), \(2, 2\)\) must grow"):
        cascade(grids=(3, 2))
    with pytest.raises(ValueError, match="at least two token grids"):
        cascade(grids=(4,))
    model = cascade().eval()
    with pytest.raises(ValueError, match="thresholds: 3 given.*needs 2"):
        model.early_exit(torch.randn(1, 3, 32, 32), [0.5, 0.5, 0.5])
    with pytest.raises(ValueError, match="shallow branch"), shallow_branch(model):
        model(torch.randn(1, 3, 32, 32))


def test_thresholds_respect_the_budget_and_beat_the_first_exit():
    torch.manual_seed(0)
    k, n = 3, 400
    targets = torch.randint(0, 4, (n,))
    # later exits are right more often; confidence tracks correctness
    logits = torch.randn(k, n, 4)
    for e, p in enumerate((0.5, 0.7, 0.9)):
        right = torch.rand(n) < p
        logits[e, right, targets[right]] += 3 + torch.rand(int(right.sum())) * 3
    val = ExitLogits(logits, targets)
    costs = [1.0, 3.0, 7.0]
    grid = candidate_thresholds(val.confidence, steps=20)
    for budget in (1.0, 2.0, 3.5, 5.0, 7.0):
        thr, acc, cost = solve_thresholds(val, costs, budget, grid)
        assert thr.shape == (2,) and cost <= budget + 1e-9
        sim_acc, sim_cost, share = simulate(val.confidence, val.correct, costs, thr[None])
        assert sim_acc.item() == pytest.approx(acc) and sim_cost.item() == pytest.approx(cost)
        assert share.sum().item() == pytest.approx(1.0)
    assert solve_thresholds(val, costs, 7.0, grid)[1] >= val.accuracy()[2] - 1e-9
    assert solve_thresholds(val, costs, 1.0, grid)[1] == pytest.approx(val.accuracy()[0])
    # below the first exit's cost everyone leaves there
    thr, _, cost = solve_thresholds(val, costs, 0.5, grid)
    assert cost == 1.0 and thr.tolist() == [0.0, 0.0]
    rows = budget_table(val, val, costs, [2.0, 4.0])
    assert rows[0].macs <= 2.0 + 1e-9 and rows[1].top1 >= rows[0].top1
    assert candidate_thresholds(val.confidence, steps=4).shape == (6 * 6, 2)


def test_exit_costs_grow_and_count_the_reuse_modules():
    model = cascade()
    costs = exit_costs(model, (3, 32, 32))
    plain = exit_costs(cascade(feature_reuse=False, relation_reuse=False), (3, 32, 32))
    assert costs[0] < costs[1] < costs[2]
    assert costs[0] == plain[0] and costs[1] > plain[1] and costs[2] > plain[2]


@pytest.mark.e2e
def test_train_and_budget_cli(tmp_path, capsys):
    from recurnmt.vision.training import budget as budget_cli
    from recurnmt.vision.training import train as train_cli

    out = tmp_path / "dvt"
    flags = ["--model", "dvt_vit_mini_patch2", "--epochs", "1", "--limit-train", "64"]
    flags += ["--limit-eval", "32", "--batch-size", "32", "--warmup-epochs", "1"]
    flags += ["--no-progress", "--no-tensorboard", "--threads", "1", "--output", str(out)]
    flags += ["--model-arg", "embed_dim=32", "--model-arg", "ffn_dim=64"]
    train_cli.main(flags)
    record = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert len(record["exit_top1"]) == 3 and record["top1"] == record["exit_top1"][-1]
    assert "exits" in capsys.readouterr().out
    with pytest.raises(ValueError, match="--mixed-depth"):
        train_cli.main([*flags, "--mixed-depth", "--output", str(tmp_path / "md")])
    # distillation: the teacher's logits are the target of every exit
    teacher = str(out / "checkpoint.pt")
    train_cli.main([*flags, "--teacher", teacher, "--output", str(tmp_path / "kd")])
    assert (tmp_path / "kd" / "checkpoint.pt").exists()
    report = budget_cli.main(
        [str(out / "checkpoint.pt"), "--num-budgets", "3", "--plot", str(tmp_path / "b.png")]
    )
    text = capsys.readouterr().out
    assert "per-exit" in text and "MMACs" in text and (tmp_path / "b.png").stat().st_size > 0
    assert len(report["rows"]) == 3 and len(report["exit_macs"]) == 3
