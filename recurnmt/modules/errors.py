"""The one error of an impossible setting, in any vocabulary.

A :class:`ConfigError` names the setting, its value and why it is impossible; the block library
raises it with option names (``num_heads``, ``signal.rank``), the front ends rename those to
their own (``--encoder-attention-heads``) with :meth:`ConfigError.renamed`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any


class ConfigError(ValueError):
    """An impossible setting: which setting, its value, and why.

    ``str(err)`` is ``"{setting}={value!r}: {reason}"``. A reason that involves other settings
    names them as ``{name}`` placeholders with their values in ``related``; they are written
    out as ``name=value``, so that :meth:`renamed` can translate every name in the message
    (a config field to a command-line flag) without matching message text.

    ``ConfigError(message)`` with a single argument is a plain message naming no setting
    (``setting`` is then None).

    Args:
        setting: the setting's name, in the vocabulary of whoever raises (a config field such
            as ``num_heads``, or a flag such as ``--encoder-layers``); or the whole message.
        value: the offending value.
        reason: why the value is impossible.
        related: other settings the reason refers to, ``{name: value}``.

    Attributes:
        setting: as given (None for a plain message).
        value: as given (None for a plain message).
        reason: the reason, with the related settings written out.
        related: as given.
    """

    def __init__(
        self,
        setting: str | None,
        value: Any = None,
        reason: str | None = None,
        related: Mapping[str, Any] | None = None,
    ) -> None:
        if reason is None:  # ConfigError(message)
            if value is not None or related:
                raise TypeError("ConfigError(setting, value, reason): the reason is missing")
            setting, reason = None, str(setting)
        super().__init__(setting, value, reason, related)
        self.setting = setting
        self.value = value
        self._template = reason
        self.related = dict(related or {})

    @property
    def reason(self) -> str:
        def name(match: re.Match[str]) -> str:
            key = match.group(1)
            return f"{key}={self.related[key]!r}" if key in self.related else match.group(0)

        return re.sub(r"\{([\w.-]+)\}", name, self._template)

    def __str__(self) -> str:
        if self.setting is None:
            return self.reason
        return f"{self.setting}={self.value!r}: {self.reason}"

    def renamed(self, names: Mapping[str, str]) -> ConfigError:
        """A copy in which every setting found in ``names`` is called by its new name.

        Args:
            names: old name -> new name; settings not in it keep their names.
        """

        def new(key: str) -> str:
            return names.get(key, key)

        template = re.sub(
            r"\{([\w.-]+)\}",
            lambda m: "{" + new(m.group(1)) + "}" if m.group(1) in self.related else m.group(0),
            self._template,
        )
        setting = None if self.setting is None else new(self.setting)
        related = {new(k): v for k, v in self.related.items()}
        return type(self)(setting, self.value, template, related)
