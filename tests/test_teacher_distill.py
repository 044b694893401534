"""--teacher-checkpoint / --teacher-distill: word-level knowledge distillation from a trained
teacher (Kim & Rush 2016) in the recurrent criterion."""

from __future__ import annotations

import pytest
import torch
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from omegaconf import OmegaConf

from recurnmt.nmt.criterion import RecurrentLabelSmoothedCrossEntropy
from tests.nmt_helpers import DICT, build
from tests.test_nmt_baselines import _sample


def _criterion(task, **kw):
    return RecurrentLabelSmoothedCrossEntropy(task, False, 0.1, **kw)


def _save(model, args, path) -> str:
    """``model`` as fairseq-train saves it (its config, weights and optimizer history)."""
    from scripts.make_compat_fixtures import FAIRSEQ_STATE

    cfg = OmegaConf.to_container(convert_namespace_to_omegaconf(args), resolve=True)
    torch.save({"cfg": cfg, "model": model.state_dict(), **FAIRSEQ_STATE}, path)
    return str(path)


@pytest.fixture
def teacher(tmp_path):
    torch.manual_seed(1)
    model, args, _ = build("transformer_tiny")
    return model.eval(), _save(model, args, tmp_path / "teacher.pt")


def test_the_loss_mixes_the_labels_and_the_kl_from_the_teacher(teacher):
    teacher_model, path = teacher
    torch.manual_seed(0)
    model, _, task = build("ringformer_tiny")
    model.train()
    sample = _sample(model)
    loss, _, log = _criterion(task, teacher_checkpoint=path, teacher_distill=0.3)(model, sample)
    out = model(**sample["net_input"])  # dropout is off: the same output
    labels, _ = _criterion(task).compute_loss(model, out, sample)
    with torch.no_grad():
        t = teacher_model.get_normalized_probs(teacher_model(**sample["net_input"]), log_probs=True)
    s = model.get_normalized_probs(out, log_probs=True)
    kl = ((t.exp() * (t - s)).sum(-1) * sample["target"].ne(DICT.pad())).sum()
    torch.testing.assert_close(log["teacher_kl"], kl.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(loss, 0.7 * labels + 0.3 * kl, rtol=1e-5, atol=1e-4)
    loss.backward()
    assert all(p.grad is None for p in teacher_model.parameters())


def test_validation_and_a_teacher_of_its_own_weights_change_nothing(tmp_path):
    """In evaluation the loss is the labels' alone (validation stays comparable), and a model
    distilled from a copy of itself has a zero KL term."""
    torch.manual_seed(0)
    model, args, task = build("ringformer_tiny")
    path = _save(model, args, tmp_path / "self.pt")
    criterion = _criterion(task, teacher_checkpoint=path, teacher_distill=0.5)
    sample = _sample(model)
    model.eval()
    plain, _, _ = _criterion(task)(model, sample)
    loss, _, log = criterion(model, sample)
    assert "teacher_kl" not in log and torch.equal(loss, plain)
    model.train()
    loss, _, log = criterion(model, sample)
    assert abs(float(log["teacher_kl"])) < 1e-4
    torch.testing.assert_close(loss, 0.5 * plain, rtol=1e-5, atol=1e-4)


def test_the_teacher_is_no_part_of_the_criterions_state(teacher):
    """Its parameters reach neither fairseq's optimizer (it takes the criterion's trainable
    parameters) nor the checkpoints (it saves the criterion's state dict)."""
    _, path = teacher
    _, _, task = build("ringformer_tiny")
    criterion = _criterion(task, teacher_checkpoint=path, teacher_distill=0.5)
    assert list(criterion.parameters()) == [] and criterion.state_dict() == {}
    criterion.half()  # fairseq's --fp16 casts the criterion: the teacher follows the model
    assert next(criterion._teacher[0].parameters()).dtype == torch.float32


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"teacher_checkpoint": "/no/such.pt", "teacher_distill": 0.5},
         "--teacher-checkpoint /no/such.pt: no such file"),
        ({"teacher_distill": 0.5}, "--teacher-checkpoint and --teacher-distill go together"),
        ({"teacher_checkpoint": "x.pt"}, "--teacher-checkpoint and --teacher-distill go"),
        ({"teacher_checkpoint": "x.pt", "teacher_distill": 1.5},
         "--teacher-distill=1.5: a weight in 0 .. 1"),
    ],
)  # fmt: skip
def test_bad_settings_are_named(kw, message):
    _, _, task = build("ringformer_tiny")
    with pytest.raises(ValueError, match=message):
        _criterion(task, **kw)


def test_a_teacher_of_another_vocabulary_is_refused_naming_the_flag(tmp_path):
    from fairseq.data import Dictionary

    other = Dictionary()
    for i in range(len(DICT) + 5):
        other.add_symbol(f"w{i}")
    from recurnmt.nmt.build import build_model

    bigger, args, _ = build_model("transformer_tiny", ["--dropout", "0"], other)
    path = _save(bigger, args, tmp_path / "other.pt")
    _, _, task = build("ringformer_tiny")
    with pytest.raises(ValueError, match="its weights do not fit this task's dictionaries"):
        _criterion(task, teacher_checkpoint=path, teacher_distill=0.5)
