"""fairseq plugin: recurrent, weight-shared Transformer translation models.

Importing this package registers the ``recurrent_transformer`` model and its architectures
(``ringformer_wmt_en_de``, ...) with fairseq, and lets fairseq's checkpoints load under
torch's weights-only unpickler. It also silences the deprecation warnings that fairseq's own
code raises on every run (:mod:`recurnmt.nmt.quiet`), stops fairseq's prefetch thread
before the interpreter exits, which otherwise aborts a finished run (:mod:`recurnmt.nmt.shutdown`),
and makes fairseq's commands refuse an impossible recurnmt setting or checkpoint before they
read data, in one line with exit code 2 (:mod:`recurnmt.nmt.fairseq_commands`).
"""

from recurnmt.nmt.quiet import silence_fairseq_noise, unconfigured_logging_kept
from recurnmt.nmt.shutdown import stop_prefetch_at_exit

silence_fairseq_noise()  # before fairseq composes its config (fairseq-train imports us first)
stop_prefetch_at_exit()

with unconfigured_logging_kept():  # fairseq's import configures the root logger otherwise
    from recurnmt.nmt import (  # noqa: F401
        architectures,
        checkpoint_safety,
        criterion,
        fairseq_commands,
        speculative,  # noqa: F401  (the speculative_translation task)
    )
    from recurnmt.nmt.model import RecurrentTransformerModel

fairseq_commands.install()  # fairseq's commands: checked before data, one line, exit 2

__all__ = ["RecurrentTransformerModel"]
