"""Which of timm's test items run on which recurnmt model (read by ``conftest.py``, checked by
``test_suite.py``).

- Only recurnmt's models, and a model timm knows under two names once: its ``recurnmt_``
  alias runs only the tests that read the name (:data:`NAME_TESTS`).
- timm's suite is not fetched for a run whose ``-m`` leaves it out (:func:`suite_may_run`).
- timm's standard configuration test asks ``forward_features`` for a map with two spatial axes;
  a model whose features are tokens (:func:`token_output`) runs timm's non-standard test in its
  place, as timm's own ViTs do by name.
"""

from __future__ import annotations

from functools import cache

from recurnmt.vision.timm_registry import TIMM_PREFIX

# timm's tests whose outcome depends on the name a model is built by, not only on the model
NAME_TESTS = ("test_model_default_cfgs", "test_model_default_cfgs_non_std")
STD_CFG_TEST, NON_STD_CFG_TEST = NAME_TESTS


def recurnmt_models() -> set[str]:
    """Every name timm knows a recurnmt model by."""
    import timm

    return set(timm.list_models(module="timm_registry"))


def twin_aliases(names: set[str]) -> set[str]:
    """The ``recurnmt_`` aliases of ``names`` whose plain name is registered too."""
    return {n for n in names if n.startswith(TIMM_PREFIX) and n[len(TIMM_PREFIX) :] in names}


def own_name(name: str, twins: set[str]) -> str:
    """The plain name of a twin alias (the same model), else ``name``."""
    return name[len(TIMM_PREFIX) :] if name in twins else name


@cache
def token_output(name: str) -> bool:
    """Whether timm model ``name``'s ``forward_features`` gives tokens rather than a map.

    The model says so itself, as timm's models do: its ``output_fmt`` (timm's ``Format``; NCHW
    where a model has none, as timm's standard test assumes) has no two spatial axes by timm's
    own ``get_spatial_dim``, which is what that test asserts first. The model is built on the
    meta device (no weights: milliseconds), once per name.
    """
    import timm
    import torch
    from timm.layers import get_spatial_dim

    with torch.device("meta"):
        model = timm.create_model(name)
    return len(get_spatial_dim(getattr(model, "output_fmt", "NCHW"))) != 2


def suite_may_run(markexpr: str, project_markers: set[str]) -> bool:
    """Whether ``-m markexpr`` can select an item of timm's suite, whose items carry
    ``timm_peer`` and timm's own markers but none of ``project_markers`` (the others the
    project registers: ``cuda``, ``smoke``, ``e2e`` ...). ``pytest -m cuda`` on a GPU machine
    without a package index, or ``-m smoke`` in ``make compat``, then asks no index for a
    suite it would not run. Where the expression cannot be read here, it may run."""
    if not markexpr.strip():
        return True
    try:
        from _pytest.mark.expression import Expression  # pytest's own -m parser
    except ImportError:  # moved in another pytest: fetch, as without -m
        return True
    others = project_markers - {"timm_peer"}
    try:
        return bool(Expression.compile(markexpr).evaluate(lambda name, **_: name not in others))
    except Exception:  # pytest reports a malformed expression itself
        return True
