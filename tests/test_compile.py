"""``--compile``: torch.compile gives the eager losses and gradients, and leaves incremental
decoding and checkpoints as they are.

The equivalence tests compile with the ``aot_eager`` backend: it traces the same forward and
backward graphs as ``inductor`` (dynamo, then AOT autograd) and runs them with eager kernels,
where inductor would generate and compile C++ first (several CPU-minutes on this machine's
contended cores). Compilation still costs seconds, so the models are one or two levels deep.
"""

from __future__ import annotations

import pytest
import torch

from recurnmt.flags import compile_settings as from_flags
from recurnmt.modules import ConfigError
from recurnmt.modules.compile import CompileSettings
from recurnmt.nmt.build import build_model
from tests.nmt_helpers import DICT, batch, full_and_stepwise, train_signals
from tests.test_checkpointing import _assert_same, _loss_and_grads
from tests.test_vision_models import build_small, perturb_zero_parameters


def _nmt_pair(levels: int):
    """An eager RingFormer of ``levels`` levels a side and the same weights with
    ``--compile aot_eager``."""
    flags = ["--dropout", "0", "--encoder-layers", str(levels), "--decoder-layers", str(levels)]
    eager, _, _ = build_model("ringformer_tiny", flags, DICT)
    train_signals(eager)
    compiled, _, _ = build_model("ringformer_tiny", [*flags, "--compile", "aot_eager"], DICT)
    compiled.load_state_dict(eager.state_dict())  # the parameter names are the eager ones
    return eager, compiled


def _nmt_loss(model):
    src, lengths, prev = batch()
    return lambda: model(src, lengths, prev)[0].logsumexp(-1).mean()


@pytest.mark.smoke
def test_nmt_compiled_training_equals_eager():
    eager, compiled = _nmt_pair(levels=2)  # the levels' gradients add up in the shared block
    assert compiled.encoder.stack.compile_settings == CompileSettings("aot_eager")
    eager.train(), compiled.train()
    _assert_same(
        _loss_and_grads(eager, _nmt_loss(eager)), _loss_and_grads(compiled, _nmt_loss(compiled))
    )


def test_nmt_compiled_model_decodes_step_by_step_eagerly():
    """The compiled full pass (the encoder, the decoder over the whole prefix) against the
    eager step-by-step decoder of the same model."""
    _, compiled = _nmt_pair(levels=1)
    compiled.eval()
    full, steps, _, _ = full_and_stepwise(compiled, *batch())
    torch.testing.assert_close(steps, full, atol=1e-5, rtol=1e-4)


def test_compile_flags_reach_both_stacks_and_name_the_flag():
    model, _, _ = build_model("ringformer_tiny", ["--compile"], DICT)
    expected = CompileSettings("inductor")
    assert model.encoder.stack.compile_settings == model.decoder.stack.compile_settings == expected
    model, _, _ = build_model("ringformer_tiny", [], DICT)
    assert model.encoder.stack.compile_settings is None
    with pytest.raises(ConfigError, match=r"--compile='no_such_backend': is not a torch.compile"):
        build_model("ringformer_tiny", ["--compile", "no_such_backend"], DICT)
    with pytest.raises(ConfigError, match=r"--compile-mode='fast': choose one of"):
        from_flags("inductor", "fast")
    with pytest.raises(ConfigError, match=r"--compile-mode='max-autotune': needs --compile"):
        from_flags(None, "max-autotune")


def test_vision_compiled_training_equals_eager():
    torch.manual_seed(0)
    model = build_small("ringformer_vit_mini_patch4", depth=1, drop_path_rate=0.0).train()
    perturb_zero_parameters(model)
    compiled = torch.compile(model, backend="aot_eager")
    x, y = torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 2, 3])

    def loss(net):
        return lambda: torch.nn.functional.cross_entropy(net(x), y)

    _assert_same(_loss_and_grads(model, loss(model)), _loss_and_grads(model, loss(compiled)))


def test_vision_trainer_refuses_an_unknown_backend(tmp_path):
    from recurnmt.vision.training import train as train_cli

    with pytest.raises(ConfigError, match=r"--compile='no_such_backend'"):
        train_cli.main(["--output", str(tmp_path), "--compile", "no_such_backend"])


@pytest.mark.e2e
def test_vision_trainer_compiled_run_equals_the_eager_one(tmp_path):
    from recurnmt.vision.checkpoint import load_checkpoint
    from tests.test_vision_train import train

    flags = ["--model", "ringformer_vit_mini_patch4", "--epochs", "1", "--limit-train", "64"]
    eager = train(tmp_path / "eager", *flags)
    compiled = train(tmp_path / "compiled", *flags, "--compile", "aot_eager")
    assert compiled[0]["losses"] == pytest.approx(eager[0]["losses"], rel=1e-5)
    assert compiled[0]["top1"] == pytest.approx(eager[0]["top1"])
    state = load_checkpoint(tmp_path / "compiled" / "checkpoint.pt")["model"]
    assert state.keys() == load_checkpoint(tmp_path / "eager" / "checkpoint.pt")["model"].keys()
