"""Activation checkpointing per level: the same losses and gradients, less saved memory."""

from __future__ import annotations

import math

import pytest
import torch

from recurnmt.experiments.activation_memory import saved_for_backward_bytes
from recurnmt.nmt.architectures import FAMILIES
from recurnmt.nmt.build import build_model
from recurnmt.vision import list_models
from recurnmt.vision.training.losses import ClassificationLoss
from tests.nmt_helpers import DICT, batch, train_signals
from tests.test_vision_models import build_small


def _loss_and_grads(model, forward) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    torch.manual_seed(123)  # dropout and stochastic depth draw the same masks
    loss = forward()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads


def _assert_same(plain, checkpointed) -> None:
    (loss_a, grads_a), (loss_b, grads_b) = plain, checkpointed
    torch.testing.assert_close(loss_b, loss_a, rtol=0, atol=1e-6)
    assert grads_a.keys() == grads_b.keys() and grads_a
    for name in grads_a:
        torch.testing.assert_close(grads_b[name], grads_a[name], atol=1e-6, rtol=1e-5, msg=name)


def _nmt_forward(model, device: torch.device | str = "cpu"):
    src, lengths, prev = (t.to(device) for t in batch())
    return lambda: model(src, lengths, prev)[0].float().logsumexp(-1).mean()


@pytest.mark.parametrize("family", list(FAMILIES))
def test_nmt_checkpointed_training_equals_plain(family, device):
    """On CUDA too: the recomputation in backward draws the same dropout masks (checkpoint
    saves and restores the device's RNG state)."""
    flags = ["--dropout", "0.2", "--attention-dropout", "0.1"]
    model, _, _ = build_model(f"{family}_tiny", flags, DICT)
    train_signals(model)
    model.to(device).train()
    forward = _nmt_forward(model, device)
    plain = _loss_and_grads(model, forward)
    saved_plain = saved_for_backward_bytes(forward)[1]
    for side in (model.encoder, model.decoder):
        side.stack.set_grad_checkpointing(True)
    _assert_same(plain, _loss_and_grads(model, forward))
    assert saved_for_backward_bytes(forward)[1] < saved_plain


def test_fairseq_flags_turn_checkpointing_on():
    model, _, _ = build_model("ringformer_tiny", ["--checkpoint-activations"], DICT)
    assert model.encoder.stack.grad_checkpointing and model.decoder.stack.grad_checkpointing
    assert not model.decoder.stack.offload_activations
    model, _, _ = build_model("ringformer_tiny", ["--offload-activations"], DICT)
    assert model.encoder.stack.grad_checkpointing and model.encoder.stack.offload_activations
    model.train()
    forward = _nmt_forward(model)
    plain_model, _, _ = build_model("ringformer_tiny", [], DICT)
    plain_model.load_state_dict(model.state_dict())
    plain_model.train()
    _assert_same(
        _loss_and_grads(plain_model, _nmt_forward(plain_model)),
        _loss_and_grads(model, forward),
    )


def test_checkpointing_stays_off_in_evaluation_and_decoding():
    model, _, _ = build_model("ringformer_tiny", ["--checkpoint-activations"], DICT)
    model.eval()
    src, lengths, prev = batch()
    with torch.no_grad():
        enc = model.encoder(src, lengths)
        state: dict = {}
        model.decoder(prev[:, :1], enc, incremental_state=state)  # no error: eval mode


@pytest.mark.parametrize("name", list_models())
def test_vision_checkpointed_training_equals_plain(name):
    extra = {} if "mixer" in name else {"drop_path_rate": 0.1}  # the Mixer has no drop path
    model = build_small(name, **extra).train()
    x = torch.randn(2, 3, 32, 32)
    y = torch.tensor([1, 3])

    loss = (
        ClassificationLoss()
    )  # the training loss: a DVT cascade's exits summed (a tuple in training)

    def forward():
        return loss(model(x), y)

    plain = _loss_and_grads(model, forward)
    model.set_grad_checkpointing(True)
    _assert_same(plain, _loss_and_grads(model, forward))


@pytest.mark.e2e  # about 8 s: with the slower tests
def test_a_100_level_shared_stack_trains_in_bounded_memory():
    """Issue 14: 100 levels of one shared block train with per-level checkpointing; the
    activations kept grow by one level input per level (measured: about 1/16 of the plain
    slope at this size)."""
    flags = ["--encoder-layers", "100", "--decoder-layers", "100", "--dropout", "0.1"]
    model, _, _ = build_model("universal_transformer_tiny", [*flags], DICT)
    src, lengths, prev = batch()
    forward = _nmt_forward(model)
    model.train()
    plain = saved_for_backward_bytes(forward)[1]
    model.zero_grad(set_to_none=True)
    for side in (model.encoder, model.decoder):
        side.stack.set_grad_checkpointing(True)
    assert saved_for_backward_bytes(forward)[1] < plain / 8
    model.zero_grad(set_to_none=True)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(3):
        loss = forward()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0]


@pytest.mark.parametrize("arch", ["universal_transformer_tiny", "ringformer_tiny", "sret_tiny"])
def test_sqrt_segments_train_like_the_plain_pass(arch):
    """Segments of ceil(sqrt(N)) levels (reentrant) inside per-level checkpoints: the same
    loss and gradients, the memory keys/values included (they are segment arguments)."""
    flags = ["--dropout", "0.2", "--encoder-layers", "5", "--decoder-layers", "5"]
    if arch == "sret_tiny":
        flags = ["--dropout", "0.2"]
    model, _, _ = build_model(arch, flags, DICT)
    train_signals(model)
    model.train()
    forward = _nmt_forward(model)
    plain = _loss_and_grads(model, forward)
    for side in (model.encoder, model.decoder):
        side.stack.set_grad_checkpointing(True, segment="sqrt")
        assert side.stack._segment_length(torch.ones(1, requires_grad=True), 5, ()) == 3
    _assert_same(plain, _loss_and_grads(model, forward))


def test_segments_keep_fewer_level_inputs_than_per_level_checkpoints():
    flags = ["--encoder-layers", "36", "--decoder-layers", "36"]
    model, _, _ = build_model("universal_transformer_tiny", flags, DICT)
    model.train()
    forward = _nmt_forward(model)
    kept = {}
    for segment in (0, "sqrt"):
        for side in (model.encoder, model.decoder):
            side.stack.set_grad_checkpointing(True, segment=segment)
        kept[segment] = saved_for_backward_bytes(forward)[1]
        model.zero_grad(set_to_none=True)
    assert kept["sqrt"] < kept[0] * 0.6  # 6 segment inputs per side instead of 36 level inputs


def test_segments_step_aside_for_state_carried_between_levels():
    model, _, _ = build_model("universal_transformer_act_tiny", [], DICT)
    stack = model.encoder.stack
    stack.set_grad_checkpointing(True, segment=2)
    stack.train()
    x = torch.ones(1, requires_grad=True)
    assert stack._segment_length(x, 6, ()) == 0  # ACT halting accumulates across levels
    model, _, _ = build_model("ringformer_tiny", [], DICT)
    stack = model.encoder.stack
    stack.set_grad_checkpointing(True, segment=2)
    stack.train()
    assert stack._segment_length(x, 6, ()) == 2
    from recurnmt.modules import LevelOutputs

    assert stack._segment_length(x, 6, (LevelOutputs(),)) == 0  # records every level


def test_segment_setting_is_checked():
    from recurnmt.modules import ConfigError

    with pytest.raises(ConfigError, match="--checkpoint-segment"):
        build_model(
            "ringformer_tiny", ["--checkpoint-activations", "--checkpoint-segment", "x"], DICT
        )
    model, _, _ = build_model(
        "ringformer_tiny", ["--checkpoint-activations", "--checkpoint-segment", "sqrt"], DICT
    )
    assert model.decoder.stack.checkpoint_segment == "sqrt"


@pytest.mark.e2e  # about 20 s: two 108-level models, one of them 48M parameters
def test_sret_108_pair_counts_and_trains_in_bounded_memory():
    """SReT's extreme-depth pair: DeiT-108 and the recursive DeiT-Ti of 108 levels (36 blocks x
    3 loops) at a third of its size; 16.39M is SReT Table 14's 36-layer DeiT-Ti."""
    from recurnmt.parameters import count_parameters
    from recurnmt.vision import create_model

    deep = create_model("deit_tiny_d108_patch16_224")
    recursive = create_model("deit_tiny_recursive_d108_patch16_224")
    assert deep.stack.num_levels == recursive.stack.num_levels == 108
    assert recursive.stack.plan.num_unique == 36
    assert count_parameters(recursive) / 1e6 == pytest.approx(16.39, abs=0.005)
    assert count_parameters(recursive) / count_parameters(deep) == pytest.approx(1 / 3, abs=0.01)
    model = create_model(
        "deit_tiny_recursive_d108_patch16_224", img_size=32, patch_size=8, num_classes=10
    )
    model.train()
    images, labels = torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 2, 3])

    def forward():
        return torch.nn.functional.cross_entropy(model(images), labels)

    plain = saved_for_backward_bytes(forward)[1]
    model.zero_grad(set_to_none=True)
    model.set_grad_checkpointing(True, segment="sqrt")
    assert saved_for_backward_bytes(forward)[1] < plain / 20
    model.zero_grad(set_to_none=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for _ in range(2):
        loss = forward()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    assert math.isfinite(loss.item())
