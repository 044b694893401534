"""The size flags (``--embed-dim --ffn-dim --heads --levels --pre-ln``) are declared once, by
``recurnmt.experiments.experiment.add_size_arguments``, and every script takes them from there with
its own defaults (issue 41, item 2)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from recurnmt.experiments.experiment import add_size_arguments

REPO = Path(__file__).resolve().parents[1]
DECLARATION = re.compile(r"""add_argument\(\s*["']--(embed-dim|ffn-dim|heads|levels|pre-ln)["']""")


def test_no_file_but_the_declaration_declares_a_size_flag():
    files = [
        f for folder in ("recurnmt", "scripts", "studies") for f in (REPO / folder).rglob("*.py")
    ]
    found = {
        str(f.relative_to(REPO)): DECLARATION.findall(f.read_text(encoding="utf-8"))
        for f in files
        if f.name != "experiment.py" and DECLARATION.search(f.read_text(encoding="utf-8"))
    }
    # other options that share a spelling: the depths a memory sweep measures (a list), the
    # demo's depth (its recipe fixes the rest), an attention call's heads
    assert found == {
        "scripts/depth_memory.py": ["levels"],
        "scripts/demo_nmt.py": ["levels"],
        "scripts/sdpa_first_call.py": ["heads"],
    }, found


def test_a_script_keeps_its_own_defaults_and_may_go_without_pre_ln():
    parser = argparse.ArgumentParser()
    add_size_arguments(parser, pre_ln=None, embed_dim=256, ffn_dim=1024, heads=4)
    args = parser.parse_args([])
    assert (args.embed_dim, args.ffn_dim, args.heads, args.levels) == (256, 1024, 4, 6)
    assert not hasattr(args, "pre_ln")
    parser = argparse.ArgumentParser()
    add_size_arguments(parser, "levels per side in training", pre_ln=True)
    args = parser.parse_args(["--no-pre-ln", "--levels", "3"])
    assert (args.embed_dim, args.heads, args.levels, args.pre_ln) == (128, 8, 3, False)
