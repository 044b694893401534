"""timm's own model tests, run against every recurnmt model timm knows.

``test_models.py`` here is timm's ``tests/test_models.py`` unchanged (huggingface/
pytorch-image-models at commit aa4b5850c1543fa488abf260f18390eda46cf85d, timm 1.0.29.dev0,
Apache License 2.0; ``tests/test_timm_peer_copy.py`` checks it against the team's copy in
``../shared/peer-tests/timm`` where that exists). Its tests are parametrized over
``timm.list_models()``; importing :mod:`recurnmt.vision` first registers recurnmt's models with
timm (plain names and ``recurnmt_`` aliases), and this conftest keeps the items of those models
only, marked ``timm_peer`` (``pytest -m timm_peer`` runs them alone; ``make test`` runs them with
the rest). The test file's own markers (base, cfg, features, ...) are registered here so that
pytest knows them.

A model timm knows under both of its names (``<name>`` and the ``recurnmt_<name>`` alias, one
entry point builder) is tested under its plain name; its alias runs only the tests that read the
name (the pretrained configurations: ``NAME_TESTS``), since every other test would build the same
model a second time (``tests/test_vision_models.py`` checks that the two names build the same
model). That leaves out 44 models' fx, TorchScript and gradient tests, about 11 of the suite's
CPU-minutes.

Items timm's tests apply to a recurnmt model but that it does not pass yet are marked
``xfail(strict=True)`` below, each with its reason, so they are reported (and a fix that makes
one pass fails the run until its mark is removed); see recurnmt/vision/README.md.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import recurnmt.vision  # noqa: F401  (registers the models with timm before collection)
from recurnmt.vision.registry import entry_point
from recurnmt.vision.timm_registry import TIMM_PREFIX

HERE = Path(__file__).parent
TIMM_MARKERS = ("base", "cfg", "features", "fxforward", "fxbackward", "torchscript", "timeout")


# timm's tests whose outcome depends on the name a model is built by, not only on the model
NAME_TESTS = ("test_model_default_cfgs", "test_model_default_cfgs_non_std")


def recurnmt_models() -> set[str]:
    import timm

    return set(timm.list_models(module="timm_registry"))


def twin_aliases(names: set[str]) -> set[str]:
    """The ``recurnmt_`` aliases of ``names`` whose plain name is registered too."""
    return {n for n in names if n.startswith(TIMM_PREFIX) and n[len(TIMM_PREFIX) :] in names}


def _family_file(name: str) -> str:
    """The model file of a timm name (``vit``, ``dvt``, ``sret`` ...)."""
    own = name[len(TIMM_PREFIX) :] if name.startswith(TIMM_PREFIX) else name
    return entry_point(own).__module__.rsplit(".", 1)[-1]


# What timm applies to our models and they do not pass yet, by test and model file.
TOKEN_OUTPUT = (
    "forward_features gives tokens B x T x D (class token first), as timm's ViTs do; timm's "
    "standard-config test asks for a B x C x H x W map, which only timm's name filters "
    "(vit_*, deit*) spare its own ViTs from"
)
KNOWN_GAPS: dict[str, dict[str, str]] = {
    "test_model_default_cfgs": {"vit": TOKEN_OUTPUT, "dvt": TOKEN_OUTPUT},
    # every model scripts, directly (test_model_forward_torchscript: as its fx graph,
    # recurnmt.vision.layers.scripting) and through timm's fx feature extractor
    # (test_model_forward_fx_torchscript)
}


def pytest_configure(config: pytest.Config) -> None:
    for marker in TIMM_MARKERS:
        config.addinivalue_line("markers", f"{marker}: timm's test_models.py marker")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    ours = recurnmt_models()
    twins = twin_aliases(ours)
    keep, drop = [], []
    for item in items:
        if HERE not in Path(str(item.path)).parents:
            keep.append(item)
            continue
        params = getattr(getattr(item, "callspec", None), "params", {})
        name = params.get("model_name")
        if name not in ours or (name in twins and item.originalname not in NAME_TESTS):
            drop.append(item)
            continue
        item.add_marker(pytest.mark.timm_peer)
        reason = KNOWN_GAPS.get(item.originalname, {}).get(_family_file(name))
        if reason:
            item.add_marker(pytest.mark.xfail(reason=reason, strict=True))
        keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
