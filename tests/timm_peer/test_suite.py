"""timm's suite itself: taken from timm's source distribution of the installed version, and
routed so that every recurnmt model runs the configuration test that fits its features."""

from __future__ import annotations

from pathlib import Path

import pytest
import timm

from tests.timm_peer.conftest import CACHE, DIST, MEMBER, SUITE
from tests.timm_peer.peer_source import cached_path, installed_version
from tests.timm_peer.selection import (
    NON_STD_CFG_TEST,
    STD_CFG_TEST,
    own_name,
    recurnmt_models,
    token_output,
    twin_aliases,
)


def test_timms_suite_is_here(timm_suite):
    """The file collected is the installed timm's, from its sdist, in the ignored cache (where
    the index could not be reached this test is skipped with the reason, and nothing of timm's
    suite runs)."""
    assert timm_suite.path == cached_path(CACHE, DIST, installed_version(DIST), MEMBER)
    assert timm_suite.path.parent.name == f"timm-{timm.__version__}"


def _timm_items(session: pytest.Session, suite_path: Path) -> list[pytest.Function]:
    """The items of timm's test file this session runs."""
    return [i for i in session.items if Path(str(i.path)) == suite_path]


def test_each_model_runs_the_configuration_test_of_its_features(request):
    """A model whose features are tokens runs timm's non-standard configuration test (timm's
    function, its assertions), one with a feature map the standard test, the one that timm's
    name filters give it; every recurnmt name runs one of the two, and nothing of timm's suite
    is an expected failure."""
    suite = request.config.stash[SUITE]
    if suite.path is None:
        pytest.skip("no timm suite in this run (test_timms_suite_is_here says why)")
    items = _timm_items(request.session, suite.path)
    cfg = [i for i in items if i.originalname in (STD_CFG_TEST, NON_STD_CFG_TEST)]
    if not cfg:
        pytest.skip("timm's configuration tests are not selected in this run")
    module = cfg[0].module  # timm's test file
    ours, twins = recurnmt_models(), twin_aliases(recurnmt_models())
    by_test: dict[str, list[str]] = {STD_CFG_TEST: [], NON_STD_CFG_TEST: []}
    for item in cfg:
        assert item.obj is getattr(module, item.originalname)  # timm's own function
        by_test[item.originalname].append(item.callspec.params["model_name"])
    std, non_std = by_test[STD_CFG_TEST], by_test[NON_STD_CFG_TEST]
    assert len(set(std + non_std)) == len(std + non_std)  # each name in one of the two
    everything = not request.config.option.keyword and request.config.option.markexpr in (
        "",
        "timm_peer",
    )
    by_name = set(timm.list_models(module.NON_STD_FILTERS))  # where timm's names send them
    assert [n for n in std if token_output(own_name(n, twins))] == []
    assert [n for n in non_std if not token_output(own_name(n, twins)) and n not in by_name] == []
    if everything:  # nothing deselected: every name of ours runs one of them, both tests run
        assert set(std + non_std) == ours
        assert std and [n for n in non_std if n not in by_name]  # SReT; routed ViTs
    assert [i.nodeid for i in items if i.get_closest_marker("xfail")] == []
