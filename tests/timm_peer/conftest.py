"""timm's own model tests, taken from timm's source distribution, run against every recurnmt model
timm knows.

The test file is not in this repository: :mod:`.peer_source` downloads timm's source
distribution of the installed version from the package index once (pip, with the indexes the
environment was installed from) and keeps its ``tests/test_models.py`` in the ignored folder
``sdist/timm-<version>/``, where pytest collects it unchanged (a cache folder of another timm
version is not collected). Where it cannot be had, ``test_suite.py::test_timms_suite_is_here``
is skipped with the one-line reason, the only trace the suite leaves then: it is never passed
silently.

timm's tests are parametrized over ``timm.list_models()``; importing :mod:`recurnmt.vision`
first registers recurnmt's models with timm (plain names and ``recurnmt_`` aliases), and this
conftest keeps the items of those models only, marked ``timm_peer`` (``pytest -m timm_peer``
runs them alone; ``make test`` runs them with the rest). The markers the test file uses (base,
cfg, features, ...) are registered as it names them.

A model timm knows under both of its names (``<name>`` and the ``recurnmt_<name>`` alias, one
entry point builder) is tested under its plain name; its alias runs only the tests that read the
name (the pretrained configurations: ``NAME_TESTS``), since every other test would build the same
model a second time (``tests/test_vision_models.py`` checks that the two names build the same
model). That leaves out 44 models' fx, TorchScript and gradient tests, about 11 of the suite's
CPU-minutes.

timm has two configuration tests: ``test_model_default_cfgs`` asks ``forward_features`` for a
map with two spatial axes (``model.output_fmt``, NCHW unless a model says otherwise), and
``test_model_default_cfgs_non_std``, with its own assertions, takes models whose features are
tokens (B x T x D). timm routes its own models between them by name (``NON_STD_FILTERS``:
``vit_*``, ``deit*``, ...); our names say nothing of it, so the model decides: one whose
``output_fmt`` has no two spatial axes (timm's own ``get_spatial_dim``; our ViTs, DVT cascades
and Mixers say ``NLC``) runs the non-standard test in place of the standard one
(``selection.token_output``, :func:`route_token_output`), every other model the standard test.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

import recurnmt.vision  # noqa: F401  (registers the models with timm before collection)
from tests.timm_peer.peer_source import Unavailable, cached_path, fetch_installed, installed_version
from tests.timm_peer.selection import (
    NAME_TESTS,
    NON_STD_CFG_TEST,
    STD_CFG_TEST,
    own_name,
    recurnmt_models,
    suite_may_run,
    token_output,
    twin_aliases,
)

HERE = Path(__file__).parent
CACHE = HERE / "sdist"  # ignored by git (.gitignore)
DIST, MEMBER = "timm", "tests/test_models.py"
# pytest's own markers, which the test file uses but which need no registering
PYTEST_MARKS = {"parametrize", "skip", "skipif", "xfail", "usefixtures", "filterwarnings"}

SUITE = pytest.StashKey["Suite"]()


@dataclass(frozen=True)
class Suite:
    """timm's test file of this run: its cached path, or why there is none."""

    path: Path | None
    reason: str = ""


def marker_names(test_file: Path) -> set[str]:
    """The ``pytest.mark.<name>`` markers ``test_file`` uses that pytest does not know itself."""
    used = set(re.findall(r"pytest\.mark\.(\w+)", test_file.read_text(encoding="utf-8")))
    return used - PYTEST_MARKS


def load_suite(config: pytest.Config) -> Suite:
    """timm's test file for the installed timm, downloaded on first use."""
    run_id = getattr(config, "workerinput", {}).get("testrunuid")
    try:
        return Suite(fetch_installed(DIST, MEMBER, CACHE, run_id=run_id))
    except Unavailable as err:
        return Suite(None, f"timm's {MEMBER} not available, its suite not run: {err}")


def pytest_configure(config: pytest.Config) -> None:
    registered = {
        line.split(":", 1)[0].split("(", 1)[0].strip() for line in config.getini("markers")
    }
    if suite_may_run(config.option.markexpr, registered):
        suite = load_suite(config)
    else:
        suite = Suite(None, f"timm's suite is not selected by -m {config.option.markexpr!r}")
    config.stash[SUITE] = suite
    for marker in sorted(marker_names(suite.path)) if suite.path else ():
        config.addinivalue_line("markers", f"{marker}: timm's test_models.py marker")


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """The cache folders of other timm versions are not collected."""
    if collection_path.parent == CACHE and collection_path.is_dir():
        own = cached_path(CACHE, DIST, installed_version(DIST), MEMBER).parent
        return collection_path != own or None
    return None


@pytest.fixture
def timm_suite(request: pytest.FixtureRequest) -> Suite:
    """This run's timm test file; the test is skipped with the reason where there is none."""
    suite = request.config.stash[SUITE]
    if suite.path is None:
        pytest.skip(suite.reason)
    return suite


def route_token_output(item: pytest.Function) -> pytest.Function:
    """``item`` of timm's standard configuration test as timm's non-standard one (its own
    function, in the same module, with the same parameters).

    The two functions take the same arguments (model, batch size, device fixture), so the new
    item takes the old one's resolved fixtures, parametrized arguments included; were they
    ever to differ, collection stops here saying so rather than run a half-set-up test.
    """
    std, non_std = (getattr(item.module, name) for name in NAME_TESTS)
    if inspect.signature(std) != inspect.signature(non_std):
        raise pytest.UsageError(
            f"timm's {STD_CFG_TEST}{inspect.signature(std)} and {NON_STD_CFG_TEST}"
            f"{inspect.signature(non_std)} take different arguments: the routing of "
            "token-output models in tests/timm_peer/conftest.py needs updating"
        )
    return pytest.Function.from_parent(
        item.parent,
        name=item.name.replace(STD_CFG_TEST, NON_STD_CFG_TEST, 1),
        callspec=item.callspec,
        fixtureinfo=item._fixtureinfo,
        originalname=NON_STD_CFG_TEST,
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    ours = recurnmt_models()
    twins = twin_aliases(ours)
    suite = config.stash[SUITE].path
    keep, drop = [], []
    for item in items:
        if HERE not in Path(str(item.path)).parents:
            keep.append(item)
            continue
        if suite is None or Path(str(item.path)) != suite:  # our own files here
            item.add_marker(pytest.mark.timm_peer)
            keep.append(item)
            continue
        params = getattr(getattr(item, "callspec", None), "params", {})
        name = params.get("model_name")
        if name not in ours or (name in twins and item.originalname not in NAME_TESTS):
            drop.append(item)
            continue
        if item.originalname == STD_CFG_TEST and token_output(own_name(name, twins)):
            item = route_token_output(item)
        item.add_marker(pytest.mark.timm_peer)
        keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
    items[:] = keep
