"""Subword segmentation: joint sentencepiece models, joint BPE (subword-nmt), and the word
pieces of a pretrained BERT-style tokenizer (:mod:`data_prep.wordpiece`).

A segmenter turns one line of (already cleaned / tokenized) text into space-separated subword
units, the input format of ``fairseq-preprocess``. Both kinds are learnt jointly on the source
and target side of the training split, so one joined fairseq dictionary covers both languages.
"""

from __future__ import annotations

import io
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from tqdm import tqdm

from data_prep.parallel import imap_ordered
from data_prep.textio import iter_lines
from data_prep.wordpiece import (
    TOKENIZER_DIR,
    WordPieceSegmenter,
    load_wordpiece_tokenizer,
    save_tokenizer,
)

SegmentationKind = Literal["spm", "bpe", "wordpiece"]


class Segmenter(Protocol):
    """Anything that maps a line of text to space-separated subword units."""

    def encode_line(self, line: str) -> str:
        """Segment one line."""
        ...


@dataclass(frozen=True)
class SegmentationSpec:
    """How to segment a corpus.

    Attributes:
        kind: ``"spm"`` (sentencepiece), ``"bpe"`` (subword-nmt, as in fairseq's recipes) or
            ``"wordpiece"`` (a pretrained tokenizer, :mod:`data_prep.wordpiece`).
        vocab_size: Sentencepiece vocabulary size, or number of BPE merge operations.
        spm_model_type: Sentencepiece algorithm (``"unigram"`` or ``"bpe"``).
        spm_normalization: Sentencepiece normalization rule (``"identity"`` keeps text exactly,
            so decoded output matches raw references character for character).
        character_coverage: Share of characters sentencepiece must cover.
        pretrained: A trained model to use as is (sentencepiece ``.model`` or BPE codes)
            instead of learning one on the training split.
        seed: Random seed for sentencepiece training.
        spm_max_sentences: Train sentencepiece on a random sample of this many lines
            (0: all lines, in order). Large corpora (WMT) need a sample to fit in memory.
        tokenizer: The pretrained word-piece tokenizer (hub name or directory), for
            ``"wordpiece"``.
    """

    kind: SegmentationKind = "spm"
    vocab_size: int = 8000
    spm_model_type: Literal["unigram", "bpe"] = "unigram"
    spm_normalization: str = "nmt_nfkc"
    character_coverage: float = 0.9999
    pretrained: Path | None = None
    seed: int = 1
    spm_max_sentences: int = 0
    tokenizer: str | None = None

    @property
    def model_file_name(self) -> str:
        """Name under which the model is stored next to the binarized data."""
        names = {"spm": "spm.model", "bpe": "bpe.codes", "wordpiece": TOKENIZER_DIR}
        return names[self.kind]


class SentencePieceSegmenter:
    """Segment lines with a sentencepiece model."""

    def __init__(self, model: Path) -> None:
        import sentencepiece as spm

        self.model = Path(model)
        self._processor = spm.SentencePieceProcessor(model_file=str(model))

    def encode_line(self, line: str) -> str:
        """Space-separated pieces of ``line``."""
        return " ".join(self._processor.encode(line, out_type=str))


class BpeSegmenter:
    """Segment lines with subword-nmt BPE codes (``@@`` continuation markers)."""

    def __init__(self, codes: Path) -> None:
        from subword_nmt.apply_bpe import BPE

        self.codes = Path(codes)
        with open(codes, encoding="utf-8") as handle:
            self._bpe = BPE(handle)

    def encode_line(self, line: str) -> str:
        """Space-separated BPE units of a whitespace-tokenized ``line``."""
        return self._bpe.process_line(line).strip()


def _lines(files: Sequence[Path]) -> Iterator[str]:
    for path in files:
        yield from iter_lines(path)


def train_sentencepiece(
    inputs: Sequence[Path], model: Path, spec: SegmentationSpec, threads: int = 1
) -> Path:
    """Learn a joint sentencepiece model on all lines of ``inputs``.

    Training uses every sentence (no sampling), a fixed seed and by default one thread, so the
    same input gives the same model.

    Args:
        inputs: Text files (plain or ``.gz``), e.g. the source and target side of train.
        model: Where to write the model; the vocabulary goes next to it as ``.vocab``.
        spec: Vocabulary size, algorithm, normalization, coverage and seed.
        threads: Trainer threads (more is faster but may change the model slightly).

    Returns:
        The model path.
    """
    import sentencepiece as spm

    spm.set_random_generator_seed(spec.seed)
    prefix = model.with_suffix("")
    spm.SentencePieceTrainer.train(
        sentence_iterator=_lines(inputs),
        model_prefix=str(prefix),
        vocab_size=spec.vocab_size,
        model_type=spec.spm_model_type,
        character_coverage=spec.character_coverage,
        normalization_rule_name=spec.spm_normalization,
        input_sentence_size=spec.spm_max_sentences,
        shuffle_input_sentence=spec.spm_max_sentences > 0,
        num_threads=threads,
        max_sentence_length=8192,
        hard_vocab_limit=False,  # tiny corpora (tests) cannot fill a large vocabulary
        bos_id=-1,
        eos_id=-1,
        unk_id=0,
        pad_id=-1,
        minloglevel=2,
    )
    built = prefix.with_suffix(".model")
    if built != model:
        built.rename(model)
    _drop_build_path(model)
    return model


def _drop_build_path(model: Path) -> None:
    """Replace the absolute output prefix that sentencepiece stores in the model by its name.

    Without this the model's bytes (and sha256) would depend on the (temporary) directory it
    was trained in.
    """
    try:
        from sentencepiece import sentencepiece_model_pb2
    except ImportError:  # protobuf missing: the model works, it is just not byte-reproducible
        return
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(model.read_bytes())
    proto.trainer_spec.model_prefix = model.stem
    model.write_bytes(proto.SerializeToString())


def learn_bpe(inputs: Sequence[Path], codes: Path, merges: int) -> Path:
    """Learn joint BPE codes (subword-nmt) on the words of all ``inputs``.

    Words are counted here while streaming the files (with a progress bar) and subword-nmt
    learns from the counts, so memory holds the vocabulary, never the corpus.

    Args:
        inputs: Tokenized text files (plain or ``.gz``).
        codes: Where to write the codes.
        merges: Number of merge operations (fairseq's IWSLT14 recipe uses 10000).

    Returns:
        The codes path.
    """
    from subword_nmt.learn_bpe import learn_bpe as _learn

    counts: Counter[str] = Counter()
    for line in tqdm(_lines(inputs), desc="count words for BPE", unit=" lines", leave=False):
        counts.update(line.split())
    vocab = io.StringIO("".join(f"{word} {n}\n" for word, n in counts.most_common()))
    with open(codes, "w", encoding="utf-8") as out:
        _learn(vocab, out, merges, min_frequency=2, verbose=False, is_dict=True)
    return codes


def load_segmenter(kind: SegmentationKind, model: Path) -> Segmenter:
    """Load a trained segmentation model of the given kind."""
    if kind == "wordpiece":
        return WordPieceSegmenter(model)
    return SentencePieceSegmenter(model) if kind == "spm" else BpeSegmenter(model)


def _encoder(kind: SegmentationKind, model: Path) -> Callable[[str], str]:
    return load_segmenter(kind, model).encode_line


def fit_segmenter(spec: SegmentationSpec, train_files: Sequence[Path], model: Path) -> Segmenter:
    """Learn (or copy a pretrained) segmentation model to ``model`` and load it.

    Args:
        spec: What to learn.
        train_files: Source- and target-side training text for joint learning.
        model: Where the model is stored (``spm.model``, ``bpe.codes`` or the ``tokenizer``
            directory of a word-piece tokenizer, saved there as it was loaded).

    Returns:
        A segmenter backed by ``model``.
    """
    if spec.kind == "wordpiece":
        if spec.tokenizer is None:
            raise ValueError("word-piece segmentation needs a tokenizer")
        save_tokenizer(load_wordpiece_tokenizer(spec.tokenizer), model)
    elif spec.pretrained is not None:
        model.write_bytes(Path(spec.pretrained).read_bytes())
    elif spec.kind == "spm":
        train_sentencepiece(train_files, model, spec)
    else:
        learn_bpe(train_files, model, spec.vocab_size)
    return load_segmenter(spec.kind, model)


def segment_file(
    kind: SegmentationKind, model: Path, src: Path, dst: Path, workers: int = 1
) -> int:
    """Segment every line of ``src`` into ``dst`` with a progress bar.

    Args:
        kind: ``"spm"`` or ``"bpe"``.
        model: The trained model.
        src: Text to segment (plain or ``.gz``).
        dst: Output file.
        workers: Processes to use (each loads the model once).

    Returns:
        The number of lines written.
    """
    count = 0
    lines = iter_lines(src)
    with open(dst, "w", encoding="utf-8", newline="\n") as out:
        encoded = imap_ordered(_encoder, (kind, model), lines, workers)
        for line in tqdm(encoded, desc=f"segment {src.name}", unit=" lines", leave=False):
            out.write(line + "\n")
            count += 1
    return count
