"""SReT's shallow branch is a mode of the stacks (no forward takes an argument for it)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from recurnmt.modules import StackConfig, build_stack, shallow_branch

REPO = Path(__file__).resolve().parents[1]
SRET = StackConfig.from_options(
    embed_dim=16, ffn_dim=32, num_heads=2, num_levels=4, num_unique=2, sharing="sequence"
)


def test_the_mode_runs_the_first_loop_and_is_undone_after_the_block():
    stack = build_stack(SRET).eval()
    x = torch.randn(2, 3, 16)
    full, first_loop = stack(x).output, stack(x, levels=[0, 2]).output
    with shallow_branch(stack):
        assert stack.active_levels == [0, 2]
        torch.testing.assert_close(stack(x).output, first_loop)
        with shallow_branch(stack):  # nested: still shallow, and still after the inner block
            pass
        torch.testing.assert_close(stack(x).output, first_loop)
    torch.testing.assert_close(stack(x).output, full)
    with pytest.raises(RuntimeError), shallow_branch(stack):
        raise RuntimeError
    assert stack.shallow_levels is None


def test_no_forward_in_recurnmt_takes_a_shallow_argument():
    found = []
    for path in (REPO / "recurnmt").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef) and "forward" in node.name:
                names = [a.arg for a in node.args.args + node.args.kwonlyargs]
                if "shallow" in names:
                    found.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}")
    assert not found
