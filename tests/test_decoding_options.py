"""The decoding options are declared once (recurnmt/modules/decoding/options.py): fairseq's
task fields, ``generate()``'s keywords, the checks and the names in errors come from the
declarations, and a new option is one declaration."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass

import pytest
from fairseq.dataclass.utils import gen_parser_from_dataclass

from recurnmt.hf.generation import decoding_options
from recurnmt.modules.declarations import option
from recurnmt.modules.decoding.options import DecodingOptions
from recurnmt.modules.errors import ConfigError
from recurnmt.nmt import speculative


def _parser(config: type) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    gen_parser_from_dataclass(parser, config())
    return parser


def _actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {a.dest: a for a in parser._actions}


def test_the_task_fields_are_the_declarations():
    """Every declared option is a field of the task, with its default, its help and fairseq's
    spelling of its name; the flags are today's."""
    actions = _actions(_parser(speculative.SpeculativeTranslationConfig))
    for declared in DecodingOptions.declarations():
        action = actions[declared.dest]
        assert action.default == declared.default and action.help == declared.help
        assert action.option_strings == [speculative.FLAGS[declared.name]]
    assert sorted(speculative.FLAGS.values()) == [
        "--compile-decoding", "--draft-levels", "--draft-tokens", "--exit-classifier",
        "--exit-test", "--exit-threshold", "--min-exit-level", "--static-decoding",
    ]  # fmt: skip


@dataclass(frozen=True)
class _More(DecodingOptions):
    """The decoding options and one more, declared as every option is."""

    exit_patience: float = option(0.9, "leave the level loop above this confidence", type=float)

    def check(self) -> None:
        super().check()
        if not 0 < self.exit_patience <= 1:
            raise ConfigError("exit_patience", self.exit_patience, "must lie in (0, 1]")


def test_a_new_decoding_option_is_one_declaration():
    """A field declared with ``option`` is a fairseq flag with its help and default, a
    ``generate()`` keyword, checked by its class, and named in each front end's spelling."""
    config = speculative.task_config(_More, "MoreConfig")
    parser = _parser(config)
    assert _actions(parser)["exit_patience"].option_strings == ["--exit-patience"]
    assert _actions(parser)["exit_patience"].help.startswith("leave the level loop")
    args = parser.parse_args(["data", "--exit-patience", "0.5", "--draft-levels", "2"])
    options = speculative.task_options(args, _More)
    assert (options.exit_patience, options.draft_levels) == (0.5, 2)
    assert speculative.task_options(parser.parse_args(["data"]), _More).exit_patience == 0.9
    with pytest.raises(ConfigError, match=r"^--exit-patience=2.0: must lie in \(0, 1\]$"):
        speculative.task_options(parser.parse_args(["data", "--exit-patience", "2"]), _More)
    kwargs = {"exit_patience": 0.7, "max_new_tokens": 5}
    assert decoding_options(kwargs, _More).exit_patience == 0.7
    assert kwargs == {"max_new_tokens": 5}  # taken out: transformers never sees it
    with pytest.raises(ConfigError, match=r"^exit_patience=0: must lie in"):
        decoding_options({"exit_patience": 0}, _More)


@pytest.mark.parametrize(
    "values,fairseq,keyword",
    [
        ({"draft_levels": "two"}, "--draft-levels='two': a number of levels, or auto",
         "draft_levels='two': a number of levels, or auto"),
        ({"draft_levels": 1, "draft_tokens": 0}, "--draft-tokens=0: at least 1 drafted token",
         "draft_tokens=0: at least 1 drafted token"),
        ({"draft_levels": 1, "static_decoding": True},
         "--static-decoding=True: not with --draft-levels=1 (beam search or drafts)",
         "static_decoding=True: not with draft_levels=1 (beam search or drafts)"),
    ],
)  # fmt: skip
def test_one_check_named_by_each_front_end(values, fairseq, keyword):
    """The same check refuses the same options in both front ends, each naming them its way:
    fairseq by flag, ``generate()`` by keyword."""
    defaults = {f.name: f.default for f in dataclasses.fields(DecodingOptions)}
    with pytest.raises(ConfigError) as refused:
        speculative.task_options(argparse.Namespace(**{**defaults, **values}))
    assert str(refused.value) == fairseq
    with pytest.raises(ConfigError) as refused:
        decoding_options(dict(values))
    assert str(refused.value) == keyword


def test_a_draft_the_decoder_cannot_run_names_the_option_and_the_levels():
    options = DecodingOptions.from_texts({"draft_levels": "4"})
    assert options.draft_levels == 4 and options.speculative and not options.static
    with pytest.raises(ConfigError, match=r"^draft_levels=4: the draft runs 1 to 3 of the 4"):
        options.check_stack(4, act=False)
    with pytest.raises(ConfigError, match=r"^draft_levels=4: ACT's halting .* \(act='on'\)"):
        options.check_stack(6, act=True)
    with pytest.raises(ConfigError, match="the decoder has 1 level, nothing to draft"):
        DecodingOptions.from_texts({"draft_levels": "auto"}).check_stack(1, act=False)


def test_what_generate_cannot_run_is_refused_by_keyword():
    for values, message in [
        ({"static_decoding": True}, "static_decoding=True: not in generate()"),
        ({"compile_decoding": True}, "compile_decoding=True: generate() compiles"),
        ({"draft_levels": "auto"}, "draft_levels='auto': generate() takes a number"),
    ]:
        with pytest.raises(ConfigError) as refused:
            decoding_options(values)
        assert str(refused.value).startswith(message)


def test_compiling_without_drafts_is_static_decoding():
    assert DecodingOptions(compile_decoding=True).static
    assert not DecodingOptions(compile_decoding=True, draft_levels=2).static
    assert DecodingOptions().asked is None
    assert DecodingOptions(static_decoding=True, compile_decoding=True).asked == "compile_decoding"
