"""Stack options declared once: each is a field of a part config, with its metadata.

A stack's configuration (:class:`~recurnmt.modules.config.StackConfig`) is a few part configs
(signals, halting, slicing, ...); every field of a part is an *option*, declared with
:func:`option`: its default, its valid values, what it does, and the command-line flag that
sets it. Everything else is derived from that one declaration:

* the part validates the option's choices (:class:`Part`), and its own rules in ``check``;
* ``StackConfig.replace(num_levels=8)`` and the flat dictionaries of exported models address
  the option by its name (:attr:`Option.name`: the name the option had before the stack's
  configuration was grouped into parts, unique across the parts);
* the translation front end adds the flag, fills its default and reads it back
  (:mod:`recurnmt.nmt.flags`), and names it in errors;
* the image models take it as a keyword (:func:`option_keywords`: timm's name where it has
  one, ``depth`` for ``num_levels``; otherwise the option's name, ``signal_rank`` for
  ``signal.rank``), and the exported models' config by its name;
* families (:mod:`recurnmt.modules.families`) are written as option values.

Nothing here imports a front end: a flag or a keyword is only a name and a help text.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from recurnmt.modules.errors import ConfigError

if TYPE_CHECKING:
    from recurnmt.modules.config import StackConfig

_OPTION, _PART = "recurnmt.option", "recurnmt.part"


@dataclass(frozen=True)
class Option:
    """What a field is as an option (the metadata of :func:`option`).

    Attributes:
        help: the flag's help (``{side}`` is the stack's side).
        name: its name in errors, in ``StackConfig.replace`` and in flat dictionaries; None:
            the field's name.
        flag: recurnmt's translation flag that sets it (``{side}``: one flag per stack, as
            ``--{side}-unique-layers``; a flag naming one side, ``--encoder-attn-groups``,
            sets that side only and the other keeps the default). None: no flag of recurnmt's
            (fairseq's own flags and the settings fixed for translation are listed in
            :mod:`recurnmt.nmt.flags`).
        choices: the valid values; the part refuses others and the flag offers them.
        words: the flag's words for the values, ``{word: value}`` (``on`` / ``off``).
        parse: the flag's text -> the value, given the options read so far (a rank ``full``
            is the width); raises :class:`ConfigError` naming the option. A flag with a parser
            holds text: its default is the default value written out.
        type: argparse's ``type`` of the flag.
        metavar: argparse's ``metavar`` of the flag.
        keyword: the image models' keyword (timm's name, ``depth``, ``drop_path_rate``) where
            it is not the option's name with ``_`` for ``.``.
    """

    help: str
    name: str | None = None
    flag: str | None = None
    choices: tuple[Any, ...] | None = None
    words: Mapping[str, Any] | None = None
    parse: Callable[[Any, Mapping[str, Any]], Any] | None = None
    type: Callable[[str], Any] | None = None
    metavar: str | None = None
    keyword: str | None = None

    def to_value(self, name: str, text: Any, options: Mapping[str, Any]) -> Any:
        """The value of the flag's ``text`` (``options``: the options read so far).

        Raises:
            ConfigError: a word the flag does not know, naming the option ``name``.
        """
        if self.words is not None:
            if text not in self.words:
                raise ConfigError(name, text, f"choose one of {', '.join(self.words)}")
            return self.words[text]
        return self.parse(text, options) if self.parse is not None else text

    def to_text(self, value: Any) -> Any:
        """The flag's spelling of ``value`` (defaults, families)."""
        if self.words is not None:
            return next(word for word, v in self.words.items() if v == value)
        return str(value) if self.parse is not None else value

    def argparse_kwargs(self) -> dict[str, Any]:
        """The flag's ``add_argument`` keywords (its default is filled by the architecture)."""
        kwargs: dict[str, Any] = {"help": self.help}
        if self.words is not None:
            kwargs["choices"] = tuple(self.words)
        elif self.choices is not None:
            kwargs["choices"] = self.choices
        if self.type is not None:
            kwargs["type"] = self.type
        if self.metavar is not None:
            kwargs["metavar"] = self.metavar
        return kwargs


def option(default: Any, help: str = "", **settings: Any) -> Any:
    """A part config's field that is an option (see :class:`Option` for ``settings``; ``help``
    is the flag's, the part's docstring says what the option means)."""
    meta = {_OPTION: Option(help, **settings)}
    if isinstance(default, (list, dict, set)):
        raise TypeError("option defaults are immutable (use a tuple)")
    return field(default=default, metadata=meta)


def part(cls: type) -> Any:
    """A :class:`~recurnmt.modules.config.StackConfig` field holding the part config ``cls``."""
    return field(default_factory=cls, metadata={_PART: True})


class Part:
    """A frozen dataclass of options that belong together and are built by one builder.

    Sequences arrive as tuples (JSON gives lists). :meth:`validate` checks the choices of
    every option and then the part's own rules, :meth:`check`, which may involve other parts
    of the stack; the stack runs it when it is made.
    """

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            if isinstance(getattr(self, f.name), list):
                object.__setattr__(self, f.name, tuple(getattr(self, f.name)))

    def validate(self, stack: StackConfig) -> None:
        """Raises :class:`ConfigError` naming the option, if a setting is impossible."""
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            meta: Option = f.metadata[_OPTION]
            value = getattr(self, f.name)
            if meta.choices is not None and value not in meta.choices:
                choices = ", ".join(str(c) for c in meta.choices)
                raise ConfigError(meta.name or f.name, value, f"choose one of {choices}")
        self.check(stack)

    def check(self, stack: StackConfig) -> None:
        """The part's own rules (subclasses), given the whole stack."""


@dataclass(frozen=True)
class OptionField:
    """Where an option lives: its part's field in the stack config (None: a field of the
    stack config itself), its own field, and its metadata."""

    part: str | None
    field: str
    option: Option


@functools.cache
def option_fields(config: type) -> dict[str, OptionField]:
    """``{option name: OptionField}`` of a stack config class, in declaration order (its own
    fields that are options, then its parts' fields).

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
            found[name] = OptionField(part_name, f.name, meta)
    return found


@functools.cache
def option_keywords(config: type) -> dict[str, str]:
    """``{keyword: option name}`` of a stack config class: the keyword arguments the image
    models take for its options (:attr:`Option.keyword`, else the name with ``_`` for ``.``).

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
