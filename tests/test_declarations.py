"""One declaration system (issue 73): every setting is an Option, a stack option or not; the
block library names options, and each front end spells them."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import re
from pathlib import Path

import pytest

from recurnmt.flags import add_options, spell
from recurnmt.modules.config import ConfigError, StackConfig
from recurnmt.modules.declarations import (
    Option,
    Part,
    Settings,
    option,
    option_fields,
    option_keywords,
)
from recurnmt.modules.declarations import part as part_field
from recurnmt.nmt import flags as nmt_flags
from tests.nmt_helpers import build

MODULES = Path(__file__).resolve().parents[1] / "recurnmt" / "modules"
FLAG = re.compile(r"(?<![\w-])--[a-z]")


def _docstrings(tree: ast.AST) -> set[int]:
    kinds = ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef
    return {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, kinds)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }


def test_no_string_in_the_block_library_spells_a_flag():
    """Code strings of recurnmt/modules/ (help texts, errors, names) spell no command-line flag:
    options carry neutral names and the front ends spell them. Docstrings may say which flag of
    a front end reaches the code they document."""
    found = []
    for path in sorted(MODULES.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if id(node) not in docs and FLAG.search(node.value):
                    found.append(f"{path.relative_to(MODULES)}:{node.lineno} {node.value!r}")
    assert not found, found


# ---------------------------------------------------------------- a stack option by the rule


@dataclasses.dataclass(frozen=True)
class ScaleConfig(Part):
    """A new paper's per-level scale.

    Attributes:
        scale: every level's output is multiplied by it.
    """

    scale: float = option(
        1.0, "every level's output times S (its {num_levels} levels)", name="level_scale",
        type=float, metavar="S",
    )  # fmt: skip

    def check(self, stack: StackConfig) -> None:
        if self.scale <= 0:
            raise ConfigError("level_scale", self.scale, "must be > 0")


@dataclasses.dataclass(frozen=True)
class ScaledStackConfig(StackConfig):
    scaled: ScaleConfig = part_field(ScaleConfig)


def test_a_new_option_named_by_the_rule_needs_only_its_declaration(monkeypatch):
    args = build("ringformer_tiny")[1]
    monkeypatch.setattr(nmt_flags, "StackConfig", ScaledStackConfig)
    monkeypatch.setattr(nmt_flags, "option_declarations", lambda: option_fields(ScaledStackConfig))
    parser = argparse.ArgumentParser()
    nmt_flags.add_recurrent_args(parser)
    action = next(a for a in parser._actions if a.dest == "level_scale")
    assert action.option_strings == ["--level-scale"] and action.metavar == "S"
    assert action.help == "every level's output times S (its --encoder-layers levels)"
    assert nmt_flags.recurnmt_defaults()["level_scale"] == 1.0
    args.level_scale = 0.5
    assert all(s.scaled.scale == 0.5 for s in nmt_flags.stack_configs(args))
    args.level_scale = 0.0
    with pytest.raises(ConfigError, match=r"^--level-scale=0.0: must be > 0$"):
        nmt_flags.stack_configs(args)


# ---------------------------------------------------------------- a group that is no stack part


@dataclasses.dataclass(frozen=True)
class DraftOptions(Settings):
    """A settings group of the kind decoding declares (issue 73 item 3)."""

    draft_levels: int | None = option(None, "draft with the first R levels", type=int)
    draft_tokens: int = option(4, "tokens a draft proposes", type=int, metavar="K")
    static: bool = option(False, "static-shape cache", words={"on": True, "off": False})
    order: str = option("greedy", "how drafts are chosen", choices=("greedy", "sampled"))

    def check(self) -> None:
        if self.draft_tokens < 1:
            raise ConfigError("draft_tokens", self.draft_tokens, "must be >= 1")


def test_a_settings_group_is_declared_validated_and_rendered_once():
    assert DraftOptions().options() == dict(
        draft_levels=None, draft_tokens=4, static=False, order="greedy"
    )
    assert [o.name for o in DraftOptions.declarations()] == list(DraftOptions().options())
    with pytest.raises(ConfigError, match="order='beam': choose one of greedy, sampled"):
        DraftOptions(order="beam")
    with pytest.raises(ConfigError, match="draft_tokens=0: must be >= 1"):
        DraftOptions.from_options(draft_tokens=0)
    with pytest.raises(TypeError, match="'tokens' is no option of DraftOptions"):
        DraftOptions.from_options(tokens=2)
    # a command line: flags by the rule, read back through the options' words
    parser = argparse.ArgumentParser()
    add_options(parser, DraftOptions.declarations(), with_defaults=True)
    args = parser.parse_args(["--draft-levels", "2", "--static", "on"])
    texts = {o.name: getattr(args, o.dest) for o in DraftOptions.declarations()}
    assert DraftOptions.from_texts(texts) == DraftOptions(draft_levels=2, static=True)
    assert parser.parse_args([]).static == "off"
    with pytest.raises(ConfigError, match="^--draft-tokens=0: must be >= 1$") as err:
        try:
            DraftOptions.from_texts(texts | {"draft_tokens": 0})
        except ConfigError as raised:
            raise raised.renamed({o.name: spell(o) for o in DraftOptions.declarations()}) from None
    assert err.value.value == 0
    # keywords (transformers' generate, the image models): the names
    assert set(option_keywords(DraftOptions)) == set(DraftOptions().options())


def test_translation_renders_a_settings_group_as_a_fairseq_dataclass():
    """fairseq's task configs are dataclasses: the group's options become their fields, whose
    flags fairseq makes by the same rule, with the declared defaults."""
    from fairseq.dataclass import FairseqDataclass
    from fairseq.dataclass.utils import gen_parser_from_dataclass

    switch = Option(
        "drafts from the static cache", name="static", default=False, action="store_true"
    )
    options = (*DraftOptions.declarations()[:2], switch)
    config = nmt_flags.fairseq_config("DraftConfig", options, FairseqDataclass)
    parser = argparse.ArgumentParser()
    gen_parser_from_dataclass(parser, config())
    args = parser.parse_args(["--draft-levels", "2", "--static"])
    assert (args.draft_levels, args.draft_tokens, args.static) == (2, 4, True)
    assert parser.parse_args([]).static is False


def test_the_converters_take_the_stacks_declarations():
    """The converters' --unique-layers, --sharing-scheme and --level-lora-rank are the stack's
    options num_unique, sharing and lora_rank: one help text, one parser, one default (unset:
    the target architecture's)."""
    from recurnmt.flags import BLOCKS, LEVEL_LORA_RANK, SHARING_SCHEME
    from recurnmt.modules.config import option_declarations

    stack = option_declarations()
    for converter, name in [(BLOCKS, "num_unique"), (SHARING_SCHEME, "sharing"),
                            (LEVEL_LORA_RANK, "lora_rank")]:  # fmt: skip
        declared = stack[name].option
        assert converter.help.startswith(
            declared.help_in({"side": "target's", "num_levels": "the source's layers"})
        )
        assert (converter.choices, converter.parse, converter.type) == (
            declared.choices, declared.parse, declared.type,
        )  # fmt: skip
    assert SHARING_SCHEME.default == stack["sharing"].option.default


def test_the_converter_plain_options_are_base():
    from recurnmt.nmt import convert
    from recurnmt.nmt.defaults import BASE

    assert convert._vanilla() == {name: BASE[name] for name in convert._PER_LEVEL}
    assert convert._vanilla()["level_lora_rank"] == "0"
    assert convert._vanilla()["positions"] == "input"


def test_translation_derives_most_spellings_by_the_rule():
    """Every recurnmt flag of a stack option is the rule's or a line of the table, and the
    table holds only spellings the rule does not give."""
    for name, word in nmt_flags.SPELLINGS.items():
        assert spell(name)[2:] != word, name
    by_rule = [
        n
        for n in option_fields(StackConfig)
        if nmt_flags.has_flag(n) and n not in nmt_flags.SPELLINGS
    ]
    assert "act_threshold" in by_rule and "ffn_sharing" in by_rule
