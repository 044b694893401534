"""recurnmt translation models in Hugging Face ``transformers``.

Importing this package registers the model type ``recurnmt`` with ``AutoConfig``,
``AutoModelForSeq2SeqLM`` and ``AutoTokenizer``, so a directory written by
``python -m recurnmt.export CHECKPOINT OUT_DIR`` loads like any hub model::

    import recurnmt.hf  # noqa: F401  (registers the model type)
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, pipeline

    model = AutoModelForSeq2SeqLM.from_pretrained(OUT_DIR)
    translate = pipeline("translation", model=OUT_DIR)

The model reuses recurnmt's blocks (:mod:`recurnmt.modules`) instead of shipping a second
implementation of them, so loading needs recurnmt installed (not fairseq). Nothing here
imports fairseq. transformers 5 dropped the ``translation`` pipeline task; importing this
package serves it again (:mod:`recurnmt.hf.pipeline`).
"""

from recurnmt.hf.environment import check_torchaudio

check_torchaudio()  # before transformers imports a torchaudio that cannot load

from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM, AutoTokenizer  # noqa: E402

from recurnmt.hf.cache import RecurnmtCache  # noqa: E402
from recurnmt.hf.configuration import MODEL_TYPE, RecurnmtConfig  # noqa: E402
from recurnmt.hf.modeling import RecurnmtForConditionalGeneration, RecurnmtModel  # noqa: E402
from recurnmt.hf.pipeline import TranslationPipeline, register_translation_task  # noqa: E402
from recurnmt.hf.tokenization import RecurnmtTokenizer  # noqa: E402

AutoConfig.register(MODEL_TYPE, RecurnmtConfig, exist_ok=True)
AutoModel.register(RecurnmtConfig, RecurnmtModel, exist_ok=True)
AutoModelForSeq2SeqLM.register(RecurnmtConfig, RecurnmtForConditionalGeneration, exist_ok=True)
AutoTokenizer.register(RecurnmtConfig, slow_tokenizer_class=RecurnmtTokenizer, exist_ok=True)
register_translation_task()  # transformers 5 dropped the task name (see recurnmt.hf.pipeline)

__all__ = [
    "MODEL_TYPE",
    "RecurnmtCache",
    "RecurnmtConfig",
    "RecurnmtForConditionalGeneration",
    "RecurnmtModel",
    "RecurnmtTokenizer",
    "TranslationPipeline",
]
