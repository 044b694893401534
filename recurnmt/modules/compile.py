"""``torch.compile`` of the level loop: its settings, and one compiled function per setting.

A :class:`~recurnmt.modules.stack.RecurrentStack` compiled with
:meth:`~recurnmt.modules.stack.RecurrentStack.set_compile` runs its full passes (training,
validation, the encoder in generation) through ``torch.compile``; the level loop is unrolled
into one graph, so levels fuse across their boundaries and the Python loop disappears.
Incremental decoding stays eager: one new position a step grows every cached key and value,
so each step would see new shapes, and a step's work is small.

The compiled function is the stack's unbound pass, made once per process and setting
(:func:`compiled`), not a wrapper module: the stack keeps its parameter names, so checkpoints
of compiled and eager runs are interchangeable, and the compiled state is never saved.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from recurnmt.modules.config import ConfigError

# torch.compile's modes (torch/__init__.py); None is its default
MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
# compiled frames of one code object kept before dynamo falls back to eager: an encoder and
# a decoder stack, each in training and evaluation, with static then dynamic shapes, and
# SReT's shallow branch, exceed torch's default of 8
RECOMPILE_LIMIT = 32


@dataclass(frozen=True)
class CompileSettings:
    """How ``torch.compile`` compiles a stack's pass.

    Attributes:
        backend: a ``torch.compile`` backend: ``inductor`` (generated kernels; needs a C++
            compiler on CPUs), ``aot_eager`` (traced forward and backward graphs run by
            eager kernels: a correctness check without code generation), ``eager``.
        mode: a ``torch.compile`` mode (None: its default); ``reduce-overhead`` adds CUDA
            graphs.
    """

    backend: str = "inductor"
    mode: str | None = None

    def __post_init__(self) -> None:
        if self.backend not in torch.compiler.list_backends(exclude_tags=()):
            raise ConfigError(
                "backend",
                self.backend,
                f"is not a torch.compile backend; choose one of "
                f"{sorted(torch.compiler.list_backends(exclude_tags=()))}",
            )
        if self.mode not in MODES:
            raise ConfigError("mode", self.mode, f"choose one of {MODES}")


def from_flags(backend: str | None, mode: str | None = None) -> CompileSettings | None:
    """The settings of the options ``compile`` (a backend) and ``compile_mode``, which both
    front ends spell alike (None: no compilation; :func:`recurnmt.flags.compile_settings`).

    Raises:
        ConfigError: an unknown backend or mode, or a mode without a backend, naming the
            option.
    """
    if not backend:
        if mode:
            raise ConfigError("compile_mode", mode, "needs a backend")
        return None
    try:
        return CompileSettings(backend=backend, mode=mode)
    except ConfigError as err:
        raise err.renamed({"backend": "compile", "mode": "compile_mode"}) from None


@functools.cache
def compiled(fn: Callable[..., Any], settings: CompileSettings) -> Callable[..., Any]:
    """``fn`` compiled with ``settings``, made once per process (dynamo's cache then holds
    one graph per stack, mode and shape, distinguished by its guards)."""
    return within_limit(fn, torch.compile(fn, backend=settings.backend, mode=settings.mode))


def within_limit(fn: Callable[..., Any], inner: Callable[..., Any]) -> Callable[..., Any]:
    """``inner`` (``fn`` compiled) called with dynamo's recompile limit at
    :data:`RECOMPILE_LIMIT` instead of torch's default."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        config = torch._dynamo.config
        # torch 2.5 names the limit cache_size_limit
        name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
        with config.patch(**{name: RECOMPILE_LIMIT}):
            return inner(*args, **kwargs)

    return run
