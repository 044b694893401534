"""The Universal Transformer's positions at every level: one rule (modules.hooks.positions_hooks)
for every front end, scaled with the level embedding (``coordinate_scale``)."""

from __future__ import annotations

from pathlib import Path

import torch

from recurnmt.modules import AddAtEveryLevel, RecurrentStack, sinusoidal_level_embedding
from tests.test_vision_models import build_small

REPO = Path(__file__).resolve().parents[1]


def test_only_the_rule_adds_positions_at_every_level():
    users = [
        str(p.relative_to(REPO))
        for p in (REPO / "recurnmt").rglob("*.py")
        if "AddAtEveryLevel(" in p.read_text(encoding="utf-8")
    ]
    assert users == ["recurnmt/modules/hooks.py"]


def test_the_image_model_honours_the_coordinate_scale(monkeypatch):
    seen = {}
    original = RecurrentStack.forward

    def spy(self, x, **kwargs):
        seen.update(kwargs)
        return original(self, x, **kwargs)

    monkeypatch.setattr(RecurrentStack, "forward", spy)
    x = torch.randn(1, 3, 32, 32)
    terms = {}
    for scale in (1.0, 0.25):
        model = build_small("uit_mini_patch4", coordinate_scale=scale).eval()
        model(x)
        (hook,) = [h for h in seen["hooks"] if isinstance(h, AddAtEveryLevel)]
        terms[scale] = hook.term
        level = sinusoidal_level_embedding(6, 32)[2]
        torch.testing.assert_close(model.stack.levels[2].level_embedding, scale * level)
    torch.testing.assert_close(terms[0.25], 0.25 * terms[1.0])
