"""Silences the warnings that fairseq's own code raises and no user can act on.

fairseq-fixed 0.12.3.1 composes its configuration through Hydra 1.0-era APIs, asks PyTorch
for pinned memory on machines without an accelerator and enters ``torch.cuda.amp.autocast``
on every step, so every ``fairseq-train`` / ``fairseq-generate`` printed about a dozen
deprecation warnings that say nothing about the user's command. Each filter below matches one
such message exactly (and its category); any other warning, and every error, still shows.
The plugin installs them when it is imported (``--user-dir user_dir``), which is before
fairseq composes its configuration and builds its data loaders.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator

# (category, regular expression matching the start of the message, where it comes from)
FAIRSEQ_NOISE: tuple[tuple[type[Warning], str, str], ...] = (
    # fairseq.dataclass.utils composes its config with Hydra's pre-1.1 API
    (UserWarning, r"hydra\.experimental\.(initialize|compose)\(\) is no longer experimental", ""),
    (UserWarning, r"\s*The version_base parameter is not specified", ""),
    (UserWarning, r"In '\w+': Usage of deprecated keyword in package header", ""),
    (UserWarning, r"\s*'\w+' is validated against ConfigStore schema with the same name", ""),
    (UserWarning, r"\s*The strict flag in the compose API is deprecated", ""),
    # fairseq's data iterators always ask for pinned memory; on a CPU-only machine it is unused
    (UserWarning, r"'pin_memory' argument is set as true but no accelerator is found", ""),
    # fairseq's MultiheadAttention (its own transformer) passes a bool padding mask with a
    # float causal mask to torch
    (UserWarning, r"Support for mismatched key_padding_mask and attn_mask is deprecated", ""),
    # fairseq's train step enters torch.cuda.amp.autocast(enabled=False) on every update
    (FutureWarning, r"`torch\.cuda\.amp\.autocast\(args\.\.\.\)` is deprecated", ""),
    # fairseq scripts a few helpers with torch.jit.script when its modules import (deprecated
    # since torch 2.14)
    (FutureWarning, r"`torch\.jit\.script` is deprecated", ""),
)


def silence_fairseq_noise() -> None:
    """Ignores exactly the warnings of :data:`FAIRSEQ_NOISE` (idempotent)."""
    for category, message, module in FAIRSEQ_NOISE:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)


# fairseq's console scripts (fairseq-train, fairseq-generate) import fairseq before they load
# the plugin, so fairseq's import-time torch.jit.script notice fires before
# silence_fairseq_noise can run. The commands recurnmt launches carry this filter in
# PYTHONWARNINGS instead (-W syntax: action:literal message prefix:category).
IMPORT_TIME_FILTER = "ignore:`torch.jit.script` is deprecated:FutureWarning"


def quiet_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` with :data:`IMPORT_TIME_FILTER` added to ``PYTHONWARNINGS`` (a user's own
    filters are kept, and win: later entries take precedence)."""
    own = env.get("PYTHONWARNINGS", "")
    if IMPORT_TIME_FILTER in own.split(","):
        return dict(env)
    return dict(env, PYTHONWARNINGS=",".join(f for f in (IMPORT_TIME_FILTER, own) if f))


@contextlib.contextmanager
def unconfigured_logging_kept() -> Iterator[None]:
    """Keeps the root logger as it is across importing fairseq.

    Two of fairseq's speech task modules call ``logging.basicConfig(level=INFO)`` when they are
    imported, so any program that imports recurnmt before configuring logging (a script, the
    launcher, a notebook) printed fairseq's import-time notes ("Please install tensorboardX")
    and then every INFO record of every library. While the root logger has no handler, a
    temporary one makes that call a no-op; a program that configured logging itself
    (fairseq-train does, before it imports the plugin) is left alone.
    """
    root = logging.getLogger()
    if root.handlers:
        yield
        return
    level, guard = root.level, logging.NullHandler()
    root.addHandler(guard)
    try:
        yield
    finally:
        root.removeHandler(guard)
        root.setLevel(level)
