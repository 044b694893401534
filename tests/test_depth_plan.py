"""Depth plans: level -> unique block (Takase & Kiyono 2021 sharing orders)."""

from __future__ import annotations

import pytest

from recurnmt.modules import ConfigError, DepthPlan


@pytest.mark.parametrize(
    ("scheme", "expected"),
    [
        ("sequence", (0, 0, 1, 1, 2, 2)),
        ("cycle", (0, 1, 2, 0, 1, 2)),
        ("cycle_rev", (0, 1, 2, 2, 1, 0)),
    ],
)
def test_sharing_orders(scheme, expected):
    assert DepthPlan.build(6, 3, scheme).block_of_level == expected


def test_fully_recurrent_and_vanilla():
    assert DepthPlan.build(4, 1).block_of_level == (0, 0, 0, 0)
    assert DepthPlan.build(4).block_of_level == (0, 1, 2, 3)


def test_levels_of_block():
    assert DepthPlan.build(6, 2, "cycle_rev").levels_of_block(1) == [1, 3, 4]


def test_bad_scheme_is_named():
    with pytest.raises(ConfigError, match="scheme='spiral': unknown sharing scheme"):
        DepthPlan.build(6, 2, "spiral")


@pytest.mark.parametrize(("levels", "unique"), [(3, 4), (0, 1), (3, 0)])
def test_impossible_counts(levels, unique):
    with pytest.raises(ConfigError):
        DepthPlan.build(levels, unique)
