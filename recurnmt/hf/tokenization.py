"""The tokenizer of an exported model: data_prep's segmentation, then the fairseq dictionary.

A model trained with fairseq reads the ids of its fairseq dictionary, whose order is not the
segmentation model's (fairseq sorts a learnt dictionary by frequency and pads it). So the
exported tokenizer does what fairseq's data pipeline did: segment the text as ``data_prep``
did (a sentencepiece model, or the word pieces of a BERT-style vocabulary such as BiBERT's),
look the pieces up in the fairseq dictionary (unknown pieces become ``<unk>``) and end the
source with ``</s>``. Decoding joins the pieces back as fairseq-generate's
``--post-process sentencepiece`` / ``--bpe bert`` do.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from transformers import PreTrainedTokenizer

VOCAB_FILES_NAMES = {
    "vocab_file": "fairseq_dict.txt",
    "spm_file": "spm.model",
    "wordpiece_file": "wordpiece_vocab.txt",
}
SPM_SPACE = "\u2581"


class RecurnmtTokenizer(PreTrainedTokenizer):
    """fairseq dictionary ids of sentencepiece pieces or BERT word pieces.

    Args:
        vocab_file: the fairseq dictionary, one symbol a line in id order (specials first).
        spm_file: a sentencepiece model (data_prep's ``spm.model``).
        wordpiece_file: a BERT word-piece ``vocab.txt`` (``--tokenizer bibert`` data).
        do_lower_case: lowercase before word-piece segmentation (the tokenizer's own setting).
    """

    vocab_files_names = VOCAB_FILES_NAMES
    model_input_names = ["input_ids", "attention_mask"]

    def __init__(
        self,
        vocab_file: str,
        spm_file: str | None = None,
        wordpiece_file: str | None = None,
        do_lower_case: bool = False,
        bos_token: str = "<s>",
        pad_token: str = "<pad>",
        eos_token: str = "</s>",
        unk_token: str = "<unk>",
        **kwargs: Any,
    ) -> None:
        if (spm_file is None) == (wordpiece_file is None):
            raise ValueError("a RecurnmtTokenizer needs exactly one of spm_file, wordpiece_file")
        symbols = Path(vocab_file).read_text(encoding="utf-8").splitlines()
        self.encoder = {symbol: i for i, symbol in enumerate(symbols)}
        self.decoder = dict(enumerate(symbols))
        self.vocab_file, self.spm_file, self.wordpiece_file = vocab_file, spm_file, wordpiece_file
        self.do_lower_case = do_lower_case
        self._spm = self._wordpiece = None
        if spm_file is not None:
            import sentencepiece

            self._spm = sentencepiece.SentencePieceProcessor(model_file=str(spm_file))
        else:
            from transformers import BertTokenizer

            self._wordpiece = BertTokenizer(str(wordpiece_file), do_lower_case=do_lower_case)
        super().__init__(
            do_lower_case=do_lower_case,
            bos_token=bos_token,
            pad_token=pad_token,
            eos_token=eos_token,
            unk_token=unk_token,
            **kwargs,
        )

    @property
    def vocab_size(self) -> int:
        return len(self.encoder)

    def get_vocab(self) -> dict[str, int]:
        """The fairseq dictionary and the tokens added since (``add_tokens``), whose ids
        follow it: ``len(tokenizer)`` is the size ``resize_token_embeddings`` takes."""
        return {**self.encoder, **self.added_tokens_encoder}

    def _tokenize(self, text: str, **unused: Any) -> list[str]:
        if self._spm is not None:
            return self._spm.encode(text, out_type=str)
        pieces = self._wordpiece.tokenize(text)
        return [self.unk_token if p == self._wordpiece.unk_token else p for p in pieces]

    def _convert_token_to_id(self, token: str) -> int:
        return self.encoder.get(token, self.encoder[self.unk_token])

    def _convert_id_to_token(self, index: int) -> str:
        return self.decoder.get(index, self.unk_token)

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        """fairseq-generate's decoding of the pieces (``--post-process sentencepiece`` or
        ``--bpe bert``)."""
        if self._spm is not None:
            return "".join(tokens).replace(SPM_SPACE, " ").strip()
        text = self._wordpiece.convert_tokens_to_string(tokens)
        return self._wordpiece.clean_up_tokenization(text)

    def build_inputs_with_special_tokens(
        self, token_ids_0: list[int], token_ids_1: list[int] | None = None
    ) -> list[int]:
        """``X </s>``: fairseq's sources end in ``</s>`` and have no ``<s>``."""
        eos = [self.eos_token_id]
        return token_ids_0 + eos if token_ids_1 is None else token_ids_0 + eos + token_ids_1 + eos

    def get_special_tokens_mask(
        self,
        token_ids_0: list[int],
        token_ids_1: list[int] | None = None,
        already_has_special_tokens: bool = False,
    ) -> list[int]:
        if already_has_special_tokens:
            return super().get_special_tokens_mask(token_ids_0, token_ids_1, True)
        mask = [0] * len(token_ids_0) + [1]
        return mask if token_ids_1 is None else mask + [0] * len(token_ids_1) + [1]

    def save_vocabulary(
        self, save_directory: str, filename_prefix: str | None = None
    ) -> tuple[str, ...]:
        prefix = f"{filename_prefix}-" if filename_prefix else ""
        written = []
        for key, source in (
            ("vocab_file", self.vocab_file),
            ("spm_file", self.spm_file),
            ("wordpiece_file", self.wordpiece_file),
        ):
            if source is None:
                continue
            target = os.path.join(save_directory, prefix + VOCAB_FILES_NAMES[key])
            if os.path.abspath(source) != os.path.abspath(target):
                Path(target).write_bytes(Path(source).read_bytes())
            written.append(target)
        return tuple(written)


__all__ = ["RecurnmtTokenizer"]
