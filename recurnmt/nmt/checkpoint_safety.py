"""Let torch's weights-only unpickler read fairseq checkpoints.

Since torch 2.6, ``torch.load`` defaults to ``weights_only=True``, and fairseq's checkpoints
(which pickle an ``argparse.Namespace`` and a few small objects) fail to load. Disabling the
safe loader globally (``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1``) would let a malicious checkpoint
run code; instead we allow-list exactly the harmless classes fairseq stores.
"""

from __future__ import annotations

import argparse
import collections

import torch

SAFE_GLOBALS: list = [argparse.Namespace, collections.OrderedDict]

torch.serialization.add_safe_globals(SAFE_GLOBALS)
