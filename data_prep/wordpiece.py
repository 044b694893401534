"""BERT-style word-piece segmentation through ``transformers``, with a one-to-one fairseq dictionary.

RingFormer sec. 4.1 tokenizes WMT14 with the 52K vocabulary of BiBERT (Xu et al. 2021), whose
authors publish the tokenizer with their model on the Hugging Face hub as
``jhu-clsp/bibert-ende`` (:data:`BIBERT`). BiBERT's own scripts segment untokenized text with
``tokenizer.tokenize`` and keep the vocabulary as it is; so does this module:

* :func:`load_wordpiece_tokenizer` loads a tokenizer by hub name or from a local directory in
  the hub's format (``vocab.txt``, optionally ``tokenizer_config.json``) through
  ``transformers.AutoTokenizer``. The BiBERT repository's ``config.json`` names a RoBERTa
  model, and ``AutoTokenizer`` then builds an empty byte-level BPE tokenizer from a directory
  that holds only ``vocab.txt`` (the authors' model card says to use ``BertTokenizer``); such
  a result is detected and the word-piece vocabulary loaded with ``BertTokenizer`` instead.
  Without the tokenizer on disk (or in the hub cache) and without network, it fails at once
  with a message that says how to provide it.
* :func:`write_fairseq_dictionary` writes a fairseq ``dict.txt`` whose entries are the
  tokenizer's vocabulary one to one: fairseq's four special symbols stand for the tokenizer's
  ``[CLS]`` (``<s>``), ``[PAD]`` (``<pad>``), ``[SEP]`` (``</s>``) and ``[UNK]`` (``<unk>``),
  every other entry follows in the tokenizer's id order, and nothing is padded, so the model's
  vocabulary has exactly the tokenizer's size (52,000 for BiBERT, RingFormer Table 1's count).
* :class:`WordPieceSegmenter` writes the pieces of a line (``##`` marks a continuation);
  fairseq decodes them with ``--bpe bert --bpe-vocab-file DATA/tokenizer/vocab.txt`` and
  :func:`detokenize_pieces` does the same in Python.

``transformers`` is imported only when a tokenizer is loaded, so ``data_prep`` stays light.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from data_prep.errors import PrepError

BIBERT = "jhu-clsp/bibert-ende"
TOKENIZER_DIR = "tokenizer"  # where a data directory keeps its tokenizer (save_pretrained)
# fairseq's special symbols (fairseq.data.Dictionary) -> the tokenizer attribute they stand for
FAIRSEQ_SPECIALS = {
    "<s>": "cls_token",
    "<pad>": "pad_token",
    "</s>": "sep_token",
    "<unk>": "unk_token",
}


def _offline() -> bool:
    value = os.environ.get("HF_HUB_OFFLINE", "") or os.environ.get("TRANSFORMERS_OFFLINE", "")
    return value.strip().lower() in {"1", "true", "yes", "on"}


def _is_wordpiece(tokenizer: Any) -> bool:
    """A word-piece model with all four special tokens in its vocabulary."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or type(backend.model).__name__ != "WordPiece":
        return False
    vocab = tokenizer.get_vocab()
    return all(getattr(tokenizer, attr, None) in vocab for attr in FAIRSEQ_SPECIALS.values())


def _load(name: str, cache_dir: Path | None, local_only: bool) -> Any:
    from transformers import AutoTokenizer, BertTokenizer

    kwargs: dict[str, Any] = {"cache_dir": cache_dir, "local_files_only": local_only}
    tokenizer = AutoTokenizer.from_pretrained(name, **kwargs)
    if not _is_wordpiece(tokenizer):  # a RoBERTa config beside a word-piece vocab.txt
        tokenizer = BertTokenizer.from_pretrained(name, **kwargs)
    return tokenizer


def load_wordpiece_tokenizer(name_or_dir: str | Path, cache_dir: Path | None = None) -> Any:
    """A BERT-style word-piece tokenizer by hub name or local directory.

    The local directory or the hub cache is tried first; the hub only when that fails and the
    hub is not switched off (``HF_HUB_OFFLINE=1``).

    Raises:
        PrepError: the tokenizer is neither on disk nor downloadable (names it and says how to
            provide it), or it is not a word-piece tokenizer with BERT's special tokens.
    """
    name = str(name_or_dir)
    local = Path(name).is_dir()
    try:
        tokenizer = _load(name, cache_dir, local_only=True)
    except (OSError, ValueError) as first:
        if local:
            raise PrepError(f"{name} holds no loadable tokenizer (a vocab.txt): {first}") from None
        how = (
            f"download it where there is network (`hf download {name}` or "
            f'`python -c "from transformers import BertTokenizer; '
            f"BertTokenizer.from_pretrained('{name}').save_pretrained('DIR')\"`) and pass "
            "--tokenizer-path DIR"
        )
        if _offline():
            raise PrepError(
                f"tokenizer {name!r} is not available locally (nor in the hub cache) and the hub "
                f"is switched off (HF_HUB_OFFLINE); {how}"
            ) from None
        try:
            tokenizer = _load(name, cache_dir, local_only=False)
        except (OSError, ValueError) as err:
            reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise PrepError(
                f"tokenizer {name!r} is not available locally and could not be downloaded "
                f"({reason}); {how}"
            ) from None
    if not _is_wordpiece(tokenizer):
        raise PrepError(
            f"tokenizer {name!r} is not a BERT-style word-piece tokenizer "
            f"(it lacks one of {', '.join(FAIRSEQ_SPECIALS.values())})"
        )
    return tokenizer


def save_tokenizer(tokenizer: Any, directory: Path) -> Path:
    """``save_pretrained`` plus the word-piece ``vocab.txt`` (id order) that fairseq's
    ``--bpe bert --bpe-vocab-file`` reads; transformers 5 saves only ``tokenizer.json``."""
    directory = Path(directory)
    tokenizer.save_pretrained(directory)
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    if [i for _, i in vocab] != list(range(len(vocab))):
        raise PrepError("the tokenizer's ids are not contiguous; it cannot be a fairseq vocabulary")
    text = "".join(f"{token}\n" for token, _ in vocab)
    (directory / "vocab.txt").write_text(text, encoding="utf-8")
    return directory


def fairseq_symbols(tokenizer: Any) -> list[str]:
    """The tokenizer's vocabulary in fairseq's order: the 4 specials, then by token id.

    Raises:
        PrepError: a vocabulary entry that fairseq cannot hold (one of its own special symbol
            names, or one with white space).
    """
    vocab = tokenizer.get_vocab()
    specials = {getattr(tokenizer, attr): symbol for symbol, attr in FAIRSEQ_SPECIALS.items()}
    symbols = list(FAIRSEQ_SPECIALS)
    for token, _ in sorted(vocab.items(), key=lambda item: item[1]):
        if token in specials:
            continue
        if token in FAIRSEQ_SPECIALS or not token or any(c.isspace() for c in token):
            raise PrepError(f"tokenizer entry {token!r} cannot be a fairseq dictionary symbol")
        symbols.append(token)
    return symbols


def write_fairseq_dictionary(tokenizer: Any, path: Path) -> Path:
    """Writes fairseq's ``dict.txt`` for ``tokenizer`` (see the module docstring)."""
    symbols = fairseq_symbols(tokenizer)[len(FAIRSEQ_SPECIALS) :]  # fairseq adds its 4 itself
    with open(path, "w", encoding="utf-8", newline="\n") as out:
        out.writelines(f"{symbol} 1\n" for symbol in symbols)
    return path


class WordPieceSegmenter:
    """Segments lines into the word pieces of a saved tokenizer directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.tokenizer = load_wordpiece_tokenizer(directory)
        self._unk = self.tokenizer.unk_token

    def encode_line(self, line: str) -> str:
        """Space-separated word pieces; the unknown piece is written as fairseq's ``<unk>``."""
        pieces = self.tokenizer.tokenize(line)
        return " ".join("<unk>" if piece == self._unk else piece for piece in pieces)


def detokenize_pieces(tokenizer: Any, line: str) -> str:
    """Text from space-separated word pieces, as fairseq's ``--bpe bert`` decodes them."""
    return tokenizer.clean_up_tokenization(tokenizer.convert_tokens_to_string(line.split()))
