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

The same wrapper first looks at a local file
(:func:`recurnmt.checkpoint_files.read_checkpoint_file`, its tensors mapped, not read): a
missing or truncated file, a text file or an image model's checkpoint then fails in one line
naming the file, in every command that loads through fairseq, instead of torch's traceback
(``PytorchStreamReader failed reading zip archive``) or fairseq's ``KeyError`` from the middle
of its upgrade of the state.
"""

from __future__ import annotations

import functools

from recurnmt.checkpoint_files import (
    FAIRSEQ,
    SAFE_GLOBALS,
    allow_safe_globals,
    read_checkpoint_file,
)

__all__ = ["SAFE_GLOBALS", "allow_fairseq_globals"]

allow_fairseq_globals = allow_safe_globals  # the name fairseq's callers know


def _allow_before_fairseqs_loads() -> None:
    """Wraps fairseq's ``load_checkpoint_to_cpu`` (once) to allow-list first and check the file:
    its callers in fairseq look it up in the module at call time, so every fairseq load goes
    through it."""
    from fairseq import checkpoint_utils

    load = checkpoint_utils.load_checkpoint_to_cpu
    if getattr(load, "allows_fairseq_globals", False):
        return

    @functools.wraps(load)
    def load_checkpoint_to_cpu(path, *args, **kwargs):
        allow_fairseq_globals()
        if "://" not in str(path):  # (fairseq reads remote paths too)
            read_checkpoint_file(path, FAIRSEQ, mmap=True)
        return load(path, *args, **kwargs)

    load_checkpoint_to_cpu.allows_fairseq_globals = True
    checkpoint_utils.load_checkpoint_to_cpu = load_checkpoint_to_cpu


allow_fairseq_globals()
_allow_before_fairseqs_loads()
