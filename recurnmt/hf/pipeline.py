"""``pipeline("translation")`` for sequence-to-sequence models under transformers 5.

transformers 5 removed its ``translation`` pipeline task (it now points users to chat models
with ``text-generation``), so ``pipeline("translation", model=OUT_DIR)`` stops with a
``KeyError`` before it looks at the model. :func:`register_translation_task` brings the task
name back, served by :class:`TranslationPipeline` (text in, ``generate()`` with the model's own
generation settings, ``{"translation_text": ...}`` out, as transformers 4 answered). It only
acts when the task is missing, and any ``AutoModelForSeq2SeqLM`` can use it.
"""

from __future__ import annotations

from typing import Any

from transformers import AutoModelForSeq2SeqLM, Pipeline
from transformers.pipelines import PIPELINE_REGISTRY

TASK = "translation"


class TranslationPipeline(Pipeline):
    """Translates text (a string or a list of strings) with a sequence-to-sequence model."""

    _pipeline_calls_generate = True
    _load_processor = False
    _load_image_processor = False
    _load_feature_extractor = False
    _load_tokenizer = True

    def _sanitize_parameters(self, **generate_kwargs: Any) -> tuple[dict, dict, dict]:
        return {}, generate_kwargs, {}

    def preprocess(self, text: str) -> dict[str, Any]:
        return self.tokenizer(text, return_tensors="pt")

    def _forward(self, model_inputs: dict[str, Any], **generate_kwargs: Any) -> dict[str, Any]:
        kwargs = self._prepare_generate_kwargs(generate_kwargs)
        return {"output_ids": self.model.generate(**model_inputs, **kwargs)}

    def postprocess(self, model_outputs: dict[str, Any]) -> list[dict[str, str]]:
        return [
            {"translation_text": self.tokenizer.decode(ids, skip_special_tokens=True)}
            for ids in model_outputs["output_ids"]
        ]


def register_translation_task() -> None:
    """Registers :class:`TranslationPipeline` as ``translation`` where transformers has none."""
    from transformers import pipelines

    removed = getattr(pipelines, "REMOVED_TASKS", {})
    if TASK in PIPELINE_REGISTRY.get_supported_tasks() and TASK not in removed:
        return  # transformers serves the task itself
    removed.pop(TASK, None)  # the name is served again, below
    PIPELINE_REGISTRY.register_pipeline(
        TASK, pipeline_class=TranslationPipeline, pt_model=AutoModelForSeq2SeqLM
    )
