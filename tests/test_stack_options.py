"""Each stack option is declared once, on its part config; the rest is derived from it.

A new option with a flag is a field of a part config (and a line of its builder): the
translation flag (by the rule, ``--`` and its name; or a line of translation's table of
spellings, for a flag named otherwise), its help and default, the option -> flag map, the stack
config and the errors that name the flag follow from the declaration. The tests below add
two.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
from pathlib import Path

import pytest

from recurnmt.modules.config import ConfigError, StackConfig, option_declarations
from recurnmt.modules.declarations import Part, option, option_fields, part
from recurnmt.nmt import defaults
from recurnmt.nmt import flags as nmt_flags
from tests.nmt_helpers import build

REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- a new option, two declarations


@dataclasses.dataclass(frozen=True)
class GateConfig(Part):
    """A new paper's per-level gate (its part config).

    Attributes:
        init: every level's gate starts at this value.
    """

    init: float = option(
        1.0,
        "initial value of every level's gate (a new paper's)",
        name="gate_init",
        type=float,
    )

    def check(self, stack: StackConfig) -> None:
        if self.init < 0:
            raise ConfigError("gate_init", self.init, "must be >= 0")


@dataclasses.dataclass(frozen=True)
class GatedStackConfig(StackConfig):
    gate: GateConfig = part(GateConfig)


def build_gate(cfg: GatedStackConfig) -> float:
    """The part's builder (here: the value a gate module would start from)."""
    return cfg.gate.init


def test_a_new_option_with_a_flag_needs_only_its_part_config(monkeypatch):
    args = build("ringformer_tiny")[1]  # fairseq's arguments, before the option existed
    # the library's StackConfig with the new part (in the library: a field of StackConfig)
    monkeypatch.setattr(nmt_flags, "StackConfig", GatedStackConfig)
    monkeypatch.setattr(nmt_flags, "option_declarations", lambda: option_fields(GatedStackConfig))
    # its flag is not the rule's (--gate-init): a line of translation's table of spellings
    monkeypatch.setitem(nmt_flags.SPELLINGS, "gate_init", "level-gate-init")
    parser = argparse.ArgumentParser()
    nmt_flags.add_recurrent_args(parser)
    assert "--level-gate-init" in parser.format_help()
    assert nmt_flags.recurnmt_defaults()["level_gate_init"] == 1.0
    assert nmt_flags.flags_of_fields("decoder")["gate_init"] == "--level-gate-init"
    args.level_gate_init = 0.5
    encoder, decoder = nmt_flags.stack_configs(args)
    assert build_gate(encoder) == build_gate(decoder) == 0.5
    args.level_gate_init = -1.0
    with pytest.raises(ConfigError, match="--level-gate-init=-1.0: must be >= 0"):
        nmt_flags.stack_configs(args)


@dataclasses.dataclass(frozen=True)
class QuietGateConfig(Part):
    """A new option without a flag (translation keeps its declared default)."""

    init: float = option(1.0, name="quiet_gate_init")


@dataclasses.dataclass(frozen=True)
class QuietStackConfig(StackConfig):
    quiet: QuietGateConfig = part(QuietGateConfig)


def test_a_new_option_without_a_flag_takes_its_default_in_translation(monkeypatch):
    args = build("ringformer_tiny")[1]
    monkeypatch.setattr(nmt_flags, "StackConfig", QuietStackConfig)
    monkeypatch.setattr(nmt_flags, "option_declarations", lambda: option_fields(QuietStackConfig))
    encoder, decoder = nmt_flags.stack_configs(args)
    assert encoder.quiet.init == decoder.quiet.init == 1.0
    assert decoder.block.cross_attention and not encoder.block.cross_attention


def test_a_new_option_reaches_the_image_models_as_a_keyword(monkeypatch):
    """The same declaration gives the ViTs (timm's create_model keywords) the option, under its
    name (no keyword declared), with its errors."""
    from recurnmt.vision.models import vit

    monkeypatch.setattr(vit, "StackConfig", GatedStackConfig)
    cfg = vit.vit_stack_config(embed_dim=16, depth=2, num_heads=2, gate_init=0.5)
    assert build_gate(cfg) == 0.5 and cfg.embed_dim == 16 and cfg.depth.num_levels == 2
    with pytest.raises(ConfigError, match="gate_init=-1.0: must be >= 0"):
        vit.vit_stack_config(embed_dim=16, depth=2, num_heads=2, gate_init=-1.0)
    with pytest.raises(TypeError, match="'gate_start' is no keyword of a ViT's stack"):
        vit.vit_stack_config(embed_dim=16, depth=2, num_heads=2, gate_start=1.0)


def test_image_models_spell_options_as_timm_and_name_them_so_in_errors():
    """timm's keywords for the options timm has (depth, drop_path_rate, ...), the option's
    name for the rest (signal_rank for signal.rank); an error names the keyword."""
    from recurnmt.vision.models.vit import vit_stack_config
    from recurnmt.vision.registry import create_model

    model = create_model(
        "ringformer_vit_mini_patch4", depth=4, drop_path_rate=0.1, signal_rank=2, lrc="both"
    )
    cfg = model.stack_cfg
    assert (cfg.depth.num_levels, cfg.regularization.drop_path, cfg.signal.rank) == (4, 0.1, 2)
    assert cfg.residual.lrc == "both"
    with pytest.raises(ConfigError, match="unique_layers=7: must not exceed depth=6"):
        vit_stack_config(embed_dim=16, depth=6, num_heads=2, unique_layers=7)
    with pytest.raises(ConfigError, match="signal_rank=99: must lie between 1 and embed_dim=16"):
        vit_stack_config(embed_dim=16, depth=6, num_heads=2, signal_kind="lowrank", signal_rank=99)


# ---------------------------------------------------------------- every declared flag works


def test_every_declared_flag_is_added_defaulted_and_read():
    parser = argparse.ArgumentParser()
    nmt_flags.add_recurrent_args(parser)
    added = {a.dest for a in parser._actions}
    for side in ("encoder", "decoder"):
        for name in option_declarations():
            arg = nmt_flags.arg_of(name, side)
            if not nmt_flags.has_flag(name) or arg is None:
                continue
            assert arg in added and arg in defaults.BASE, (name, arg)
            assert nmt_flags.flags_of_fields(side)[name] == "--" + arg.replace("_", "-")


def test_the_defaults_build_the_stack_configs_defaults():
    """BASE is StackConfig's defaults as the flags spell them (a plain stack)."""
    args = build("recurrent_transformer_tiny")[1]
    values = nmt_flags.side_options(args, "encoder")
    default = StackConfig().options()
    flagged = [n for n in option_declarations() if nmt_flags.has_flag(n)]
    assert {n: values[n] for n in flagged} == {n: default[n] for n in flagged}


def test_options_keep_their_names_in_the_flat_dictionary():
    cfg = StackConfig.from_options(num_levels=4, lrc="both", **{"signal.kind": "static"})
    flat = cfg.to_dict()
    assert flat["num_levels"] == 4 and flat["lrc"] == "both"
    assert flat["signal"]["kind"] == "static"
    assert StackConfig.from_dict(flat) == cfg
    with pytest.raises(TypeError, match="no stack option"):
        cfg.replace(levels=3)


# ---------------------------------------------------------------- the shape the issue asks for


def test_stack_config_has_at_most_twelve_fields():
    assert len(dataclasses.fields(StackConfig)) <= 12


def test_no_function_in_recurnmt_or_the_studies_is_over_120_lines():
    long = []
    for path in [*(REPO / "recurnmt").rglob("*.py"), *(REPO / "studies").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                if node.end_lineno - node.lineno + 1 > 120:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}")
    assert not long


def test_the_level_loop_stays_small():
    lines = (REPO / "recurnmt" / "modules" / "stack.py").read_text(encoding="utf-8")
    assert len(lines.splitlines()) < 250
