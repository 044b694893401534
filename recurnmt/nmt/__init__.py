"""fairseq plugin: recurrent, weight-shared Transformer translation models.

Importing this package registers the ``recurrent_transformer`` model and its architectures
(``ringformer_wmt_en_de``, ...) with fairseq, and lets fairseq's checkpoints load under
torch's weights-only unpickler.
"""

from recurnmt.nmt import architectures, checkpoint_safety, criterion  # noqa: F401  (registration)
from recurnmt.nmt.model import RecurrentTransformerModel

__all__ = ["RecurrentTransformerModel"]
