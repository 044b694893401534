"""Settings declared once: an :class:`Option` is a setting's name, default, help, valid values
and how text becomes its value; every front end renders it in its own vocabulary.

One declaration system for every setting, a stack option or not:

* a stack option is a field of a part config (:func:`option`, :class:`Part`): the stack's
  configuration (:class:`~recurnmt.modules.config.StackConfig`) is a few parts (signals,
  halting, slicing, ...), which validate their options' choices and their own rules;
* a group of settings that is no stack part (the decoding options, say) is a frozen dataclass
  of :class:`Settings` with the same :func:`option` fields, validated when it is made;
* a lone setting (a run mode such as compilation, a converter's initialisation) is an
  :class:`Option` with its ``name``.

An option has a *neutral* name (:attr:`Option.name`: ``num_unique``, ``signal.rank``,
``compile_mode``): ``StackConfig.replace(num_levels=8)``, the flat dictionaries of exported
models and every :class:`~recurnmt.modules.errors.ConfigError` of the block library use it.
The front ends spell it: the command lines as ``--`` and the name with ``-``
(:mod:`recurnmt.flags`; translation adds ``--encoder-``/``--decoder-`` for per-side options and
keeps a table of today's spellings that do not follow the rule, :mod:`recurnmt.nmt.flags`), the
image models and ``transformers`` as keywords (:func:`option_keywords`: timm's name where it
has one). A help text names another option as ``{name}`` and the stack's side as ``{side}``
(:meth:`Option.help_in`), so that each front end writes its own spelling; the families
(:mod:`recurnmt.modules.families`) are written as option values. Nothing here imports a front
end.

A new group of settings::

    @dataclass(frozen=True)
    class DecodingOptions(Settings):
        draft_levels: int | None = option(None, "decoder levels of the draft", type=int)
        static: bool = option(False, "static-shape cache", words={"on": True, "off": False})

        def check(self) -> None:  # the group's own rules; choices are checked for it
            ...

``DecodingOptions.declarations()`` are its options (name, default, help, parser): a command
line adds them as flags (:func:`recurnmt.flags.add_options`; a fairseq task's dataclass
config, :func:`recurnmt.nmt.flags.fairseq_config`) and reads them back with
:meth:`Settings.from_texts`, renaming the errors to its flags
(:meth:`~recurnmt.modules.errors.ConfigError.renamed`); a keyword front end takes
:func:`option_keywords` and :meth:`Settings.from_options`.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from recurnmt.modules.errors import ConfigError

if TYPE_CHECKING:
    from recurnmt.modules.config import StackConfig

_OPTION, _PART = "recurnmt.option", "recurnmt.part"


@dataclass(frozen=True)
class Option:
    """One setting: what a field of :func:`option` is, or a lone setting.

    Attributes:
        help: what a user reads about it (``{side}``: the stack's side; ``{name}``: another
            option, in the reader's spelling; see :meth:`help_in`). A stack option without
            help is one that no front end offers beyond its own (fairseq's flags, the settings
            fixed for translation).
        name: its neutral name, in errors, in ``StackConfig.replace`` and in flat
            dictionaries; None: the field's name.
        default: its value when nothing sets it (a field's default, for :func:`option`).
        choices: the valid values; a group refuses others and a command line offers them.
        words: the command line's words for the values, ``{word: value}`` (``on`` / ``off``).
        parse: text -> the value, given the options read so far (a rank ``full`` is the
            width); raises :class:`ConfigError` naming the option. A command line with a parser
            holds text: its default is the default value written out (:meth:`to_text`).
        type: argparse's ``type`` of its flag.
        metavar: argparse's ``metavar`` of its flag.
        nargs: argparse's ``nargs`` (``?``: the flag alone means ``const``).
        const: the value of the flag alone.
        action: argparse's ``action`` (``store_true``: a switch).
        keyword: the image models' keyword (timm's name, ``depth``, ``drop_path_rate``) where
            it is not the option's name with ``_`` for ``.``.
    """

    help: str = ""
    name: str | None = None
    default: Any = None
    choices: tuple[Any, ...] | None = None
    words: Mapping[str, Any] | None = None
    parse: Callable[[Any, Mapping[str, Any]], Any] | None = None
    type: Callable[[str], Any] | None = None
    metavar: str | None = None
    nargs: str | None = None
    const: Any = None
    action: str | None = None
    keyword: str | None = None

    @property
    def dest(self) -> str:
        """The name as an identifier (``signal.rank`` -> ``signal_rank``): a lone option's
        argument name on every command line and keyword."""
        return (self.name or "").replace(".", "_")

    def to_value(self, name: str, text: Any, options: Mapping[str, Any]) -> Any:
        """The value of the command line's ``text`` (``options``: the options read so far).

        Raises:
            ConfigError: a word the option does not know, naming the option ``name``.
        """
        if self.words is not None:
            if text not in self.words:
                raise ConfigError(name, text, f"choose one of {', '.join(self.words)}")
            return self.words[text]
        return self.parse(text, options) if self.parse is not None else text

    def to_text(self, value: Any) -> Any:
        """The command line's spelling of ``value`` (defaults, families); None stays unset."""
        if value is None:
            return None
        if self.words is not None:
            return next(word for word, v in self.words.items() if v == value)
        return str(value) if self.parse is not None else value

    def help_in(self, names: Mapping[str, str]) -> str:
        """The help with its ``{name}`` placeholders in a reader's spelling (``names``, with
        ``side`` for ``{side}``); names not in ``names`` are written as they are."""
        return re.sub(r"\{([\w.]+)\}", lambda m: names.get(m.group(1), m.group(1)), self.help)

    def argparse_kwargs(self) -> dict[str, Any]:
        """Its flag's ``add_argument`` keywords but ``help`` and ``default`` (a front end
        renders the help and fills the default)."""
        kwargs: dict[str, Any] = {}
        if self.words is not None:
            kwargs["choices"] = tuple(self.words)
        elif self.choices is not None:
            kwargs["choices"] = self.choices
        for key in ("type", "metavar", "nargs", "const", "action"):
            if getattr(self, key) is not None:
                kwargs[key] = getattr(self, key)
        return kwargs


def option(default: Any, help: str = "", **settings: Any) -> Any:
    """A dataclass field that is an option (see :class:`Option` for ``settings``; the group's
    docstring says what the option means, ``help`` what a user reads)."""
    if isinstance(default, (list, dict, set)):
        raise TypeError("option defaults are immutable (use a tuple)")
    return field(default=default, metadata={_OPTION: Option(help, default=default, **settings)})


def part(cls: type) -> Any:
    """A :class:`~recurnmt.modules.config.StackConfig` field holding the part config ``cls``."""
    return field(default_factory=cls, metadata={_PART: True})


def _as_tuples(group: Any) -> None:
    """Sequences arrive as tuples (JSON gives lists)."""
    for f in dataclasses.fields(group):
        if isinstance(getattr(group, f.name), list):
            object.__setattr__(group, f.name, tuple(getattr(group, f.name)))


def check_choices(group: Any) -> None:
    """Refuses a value of an option of ``group`` (a dataclass of options) outside its choices.

    Raises:
        ConfigError: naming the option.
    """
    for f in dataclasses.fields(group):
        meta: Option = f.metadata[_OPTION]
        value = getattr(group, f.name)
        if meta.choices is not None and value not in meta.choices:
            choices = ", ".join(str(c) for c in meta.choices)
            raise ConfigError(meta.name or f.name, value, f"choose one of {choices}")


class Part:
    """A frozen dataclass of options that belong together and are built by one builder.

    Sequences arrive as tuples (JSON gives lists). :meth:`validate` checks the choices of
    every option and then the part's own rules, :meth:`check`, which may involve other parts
    of the stack; the stack runs it when it is made.
    """

    def __post_init__(self) -> None:
        _as_tuples(self)

    def validate(self, stack: StackConfig) -> None:
        """Raises :class:`ConfigError` naming the option, if a setting is impossible."""
        check_choices(self)
        self.check(stack)

    def check(self, stack: StackConfig) -> None:
        """The part's own rules (subclasses), given the whole stack."""


class Settings:
    """A frozen dataclass of options that is no stack part (the decoding options, say),
    validated when it is made: the choices of every option, then :meth:`check`.

    Sequences arrive as tuples (JSON gives lists).
    """

    def __post_init__(self) -> None:
        _as_tuples(self)
        check_choices(self)
        self.check()

    def check(self) -> None:
        """The group's own rules (subclasses); raise :class:`ConfigError` naming the option."""

    @classmethod
    def from_options(cls, **options: Any) -> Any:
        """The group of ``options`` by name (the others: their defaults).

        Raises:
            TypeError: a name that is no option of the group.
        """
        fields_ = option_fields(cls)
        unknown = [name for name in options if name not in fields_]
        if unknown:
            raise TypeError(f"{unknown[0]!r} is no option of {cls.__name__}")
        return cls(**{fields_[name].field: value for name, value in options.items()})

    @classmethod
    def from_texts(cls, texts: Mapping[str, Any]) -> Any:
        """The group of a command line's ``texts`` by option name (each read by its option's
        words or parser, :meth:`Option.to_value`; the others: their defaults).

        Raises:
            ConfigError: a text or setting the group refuses, naming the option.
        """
        values: dict[str, Any] = {}
        for name, where in option_fields(cls).items():
            if name in texts:
                values[name] = where.option.to_value(name, texts[name], values)
        return cls.from_options(**values)

    @classmethod
    def declarations(cls) -> tuple[Option, ...]:
        """Its options, in declaration order (their names filled in)."""
        return tuple(w.option for w in option_fields(cls).values())

    def options(self) -> dict[str, Any]:
        """``{option name: value}`` of every option."""
        return {name: getattr(self, w.field) for name, w in option_fields(type(self)).items()}


@dataclass(frozen=True)
class OptionField:
    """Where an option lives: its part's field in the stack config (None: a field of the
    config itself, as every field of a :class:`Settings` group), its own field, and its
    declaration (its name filled in)."""

    part: str | None
    field: str
    option: Option


@functools.cache
def option_fields(config: type) -> dict[str, OptionField]:
    """``{option name: OptionField}`` of a stack config or :class:`Settings` class, in
    declaration order (its own fields that are options, then its parts' fields).

    Raises:
        ValueError: two options share a name.
    """
    found: dict[str, OptionField] = {}
    for top in dataclasses.fields(config):
        if top.metadata.get(_PART):
            inner = [(top.name, f) for f in dataclasses.fields(top.default_factory)]
        else:
            inner = [(None, top)]
        for part_name, f in inner:
            meta: Option = f.metadata[_OPTION]
            name = meta.name or f.name
            if name in found:
                raise ValueError(f"two stack options are called {name!r}")
            found[name] = OptionField(part_name, f.name, dataclasses.replace(meta, name=name))
    return found


@functools.cache
def option_keywords(config: type) -> dict[str, str]:
    """``{keyword: option name}`` of a stack config or :class:`Settings` class: the keyword
    arguments the image models (and ``transformers``) take for its options (:attr:`Option.keyword`, else the name with ``_`` for ``.``).

    Raises:
        ValueError: two options share a keyword.
    """
    found: dict[str, str] = {}
    for name, where in option_fields(config).items():
        keyword = where.option.keyword or name.replace(".", "_")
        if keyword in found:
            raise ValueError(f"two stack options have the keyword {keyword!r}")
        found[keyword] = name
    return found
