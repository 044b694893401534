"""Let torch's weights-only unpickler read fairseq checkpoints.

Since torch 2.6, ``torch.load`` defaults to ``weights_only=True``, and fairseq's checkpoints
(which pickle an ``argparse.Namespace`` and a few small objects) fail to load. Disabling the
safe loader globally (``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1``) would let a malicious checkpoint
run code; instead we allow-list exactly the harmless classes fairseq stores.

The allow-list is process-wide, and ``torch.serialization.safe_globals`` removes what it
lists on exit even where it was allowed before: timm's ``load_checkpoint`` lists
``argparse.Namespace`` so, and after it fairseq checkpoints would fail to load. So
:func:`allow_fairseq_globals` (idempotent) runs right before every load: fairseq's own loader
(``checkpoint_utils.load_checkpoint_to_cpu``, under every ``load_model_ensemble*``) is wrapped
to call it, and recurnmt's direct ``torch.load`` calls of fairseq checkpoints call it.
"""

from __future__ import annotations

import argparse
import collections
import functools

import torch

SAFE_GLOBALS: list = [argparse.Namespace, collections.OrderedDict]


def allow_fairseq_globals() -> None:
    """Allow-lists :data:`SAFE_GLOBALS` for weights-only loading (again, if taken back)."""
    torch.serialization.add_safe_globals(SAFE_GLOBALS)


def _allow_before_fairseqs_loads() -> None:
    """Wraps fairseq's ``load_checkpoint_to_cpu`` (once) to allow-list first: its callers in
    fairseq look it up in the module at call time, so every fairseq load goes through it."""
    from fairseq import checkpoint_utils

    load = checkpoint_utils.load_checkpoint_to_cpu
    if getattr(load, "allows_fairseq_globals", False):
        return

    @functools.wraps(load)
    def load_checkpoint_to_cpu(*args, **kwargs):
        allow_fairseq_globals()
        return load(*args, **kwargs)

    load_checkpoint_to_cpu.allows_fairseq_globals = True
    checkpoint_utils.load_checkpoint_to_cpu = load_checkpoint_to_cpu


allow_fairseq_globals()
_allow_before_fairseqs_loads()
