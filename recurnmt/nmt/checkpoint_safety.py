"""Let torch's weights-only unpickler read fairseq checkpoints.

Since torch 2.6, ``torch.load`` defaults to ``weights_only=True``, and fairseq's checkpoints
(which pickle an ``argparse.Namespace`` and a few small objects) fail to load. Disabling the
safe loader globally (``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1``) would let a malicious checkpoint
run code; instead we allow-list exactly the harmless classes fairseq stores.

The allow-list is process-wide, and ``torch.serialization.safe_globals`` removes what it
lists on exit even where it was allowed before: timm's ``load_checkpoint`` lists
``argparse.Namespace`` so, and after it fairseq checkpoints would fail to load. Loaders call
:func:`allow_fairseq_globals` (idempotent) right before ``torch.load``.
"""

from __future__ import annotations

import argparse
import collections

import torch

SAFE_GLOBALS: list = [argparse.Namespace, collections.OrderedDict]


def allow_fairseq_globals() -> None:
    """Allow-lists :data:`SAFE_GLOBALS` for weights-only loading (again, if taken back)."""
    torch.serialization.add_safe_globals(SAFE_GLOBALS)


allow_fairseq_globals()
