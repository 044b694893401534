"""``python -m recurnmt.export CHECKPOINT OUT_DIR``: a fairseq-trained recurnmt model as a
Hugging Face ``transformers`` model directory.

Written to ``OUT_DIR``: ``config.json`` (:class:`~recurnmt.hf.RecurnmtConfig`: both stacks'
``StackConfig`` and fairseq's front-end settings), ``model.safetensors`` (every shared tensor
once), ``generation_config.json`` (fairseq-generate's beam search: ``--beam``, ``--lenpen``,
``--max-len-b``, no ``<pad>``, at least one token) and the tokenizer (the data directory's
sentencepiece model or BiBERT word-piece vocabulary, with the fairseq dictionary). Then::

    import recurnmt.hf  # noqa: F401  (registers the model type with transformers' Auto classes)
    from transformers import pipeline
    print(pipeline("translation", model="OUT_DIR")("Wählen Sie eine Farbe aus."))

The directory needs recurnmt installed to load (not fairseq): the model runs recurnmt's own
blocks (``recurnmt.modules``) rather than a second copy of them written into the directory,
which would drift from the code that trained it and be code that users must trust blindly.
What the directory does hold is ``recurnmt_hf.py`` (:mod:`recurnmt.hf.remote_code`), named in
``auto_map``: a few lines that import the classes from the installed package, so that
``from_pretrained(OUT_DIR, trust_remote_code=True)`` loads it without ``import recurnmt.hf``
and, where recurnmt is missing, says to install it. Every family exports: ``ringformer``,
``universal_transformer`` (+ ``_act``), ``recurrent_transformer``, ``owf``, ``sret``,
``relaxed_transformer`` (and ``--level-lora-rank`` on any of them) and any sharing flags.

Beam search agrees with ``fairseq-generate --beam B --lenpen L``: transformers divides a
finished hypothesis' log-probability by ``(generated tokens incl. </s>) ** length_penalty``,
which is fairseq's ``(step + 1) ** lenpen``, so ``length_penalty = lenpen``; fairseq stops a
sentence once B hypotheses are finished (``early_stopping=True``), never emits ``<pad>``
(``suppress_tokens``), bans ``</s>`` at the first step (``min_new_tokens=1``) and allows only
``</s>`` after ``--max-len-b`` tokens (``recurnmt.hf.generation.EndAtMaxLength``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from recurnmt.cli import entry_point

PROG = "python -m recurnmt.export"
# the remote-code file of an exported directory and the classes its auto_map names
REMOTE_CODE = "recurnmt_hf.py"
AUTO_MAP = {
    "config.json": {
        "AutoConfig": "recurnmt_hf.RecurnmtConfig",
        "AutoModel": "recurnmt_hf.RecurnmtModel",
        "AutoModelForSeq2SeqLM": "recurnmt_hf.RecurnmtForConditionalGeneration",
    },
    "tokenizer_config.json": {"AutoTokenizer": ["recurnmt_hf.RecurnmtTokenizer", None]},
}
# fairseq state-dict entries that hold no weights
_SKIPPED = ("._float_tensor", ".version")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Export a fairseq-trained recurnmt translation model to transformers.",
    )
    parser.add_argument("checkpoint", type=Path, help="a fairseq checkpoint of a recurnmt arch")
    parser.add_argument("out_dir", type=Path, help="the transformers model directory to write")
    parser.add_argument(
        "--data",
        type=Path,
        help="the binarized data directory (dictionary and tokenizer; default: the "
        "checkpoint's --data)",
    )
    parser.add_argument("--beam", type=int, default=4, help="generate()'s default num_beams")
    parser.add_argument("--lenpen", type=float, default=1.0, help="its length_penalty")
    parser.add_argument("--max-len-b", type=int, default=200, help="its max_new_tokens")
    parser.add_argument("--force", action="store_true", help="replace a non-empty OUT_DIR")
    return parser.parse_args(argv)


def read_checkpoint(path: Path) -> tuple[Any, str]:
    """fairseq's saved configuration of ``path`` and its architecture.

    Raises:
        FileNotFoundError: no such file.
        CheckpointError: not a fairseq checkpoint (truncated, a text file, an image model's).
        ValueError: not a recurnmt translation model (named).
    """
    from fairseq import checkpoint_utils

    import recurnmt.nmt  # noqa: F401  (registers the architectures; weights-only loading)
    from recurnmt.modules import FAMILIES
    from recurnmt.nmt.defaults import ARCHS

    # (which checks the file first: recurnmt.nmt.checkpoint_safety)
    state = checkpoint_utils.load_checkpoint_to_cpu(str(path))
    cfg = state.get("cfg") if isinstance(state, dict) else None
    if cfg is None or "model" not in state:
        raise ValueError(f"{path} is not a fairseq checkpoint (no saved configuration)")
    arch = getattr(cfg.model, "arch", None) or getattr(cfg.model, "_name", None)
    if arch not in ARCHS:
        families = ", ".join(f"{name}_*" for name in FAMILIES)
        raise ValueError(
            f"{path} holds a {arch!r} model, not a recurnmt translation model (recurnmt "
            f"architectures: {families})"
        )
    return cfg, arch


def elastic_depth(args: Any) -> dict[str, int | None]:
    """The model's elastic depth (:func:`recurnmt.flags.levels_flag`) under the names fairseq
    and the exported config share: ``{"encoder_levels": ..., "decoder_levels": ...}``."""
    from recurnmt.flags import levels_flag

    dests = (levels_flag(side).dest for side in ("encoder", "decoder"))
    return {dest: getattr(args, dest, None) for dest in dests}


def hf_config(model: Any, args: Any, arch: str) -> Any:
    """The :class:`~recurnmt.hf.RecurnmtConfig` of a fairseq ``RecurrentTransformerModel``.

    Raises:
        ValueError: a setting the exported model cannot represent (named).
    """
    from recurnmt.hf.configuration import RecurnmtConfig, stack_config_to_dict

    src, tgt = model.encoder.dictionary, model.decoder.dictionary
    if src != tgt:
        raise ValueError(
            "export needs one joined dictionary (fairseq-preprocess --joined-dictionary)"
        )
    tokens = model.encoder.embed.tokens  # the token front end, written as it is
    if model.decoder.embed.tokens != tokens:  # the exported config holds one for both sides
        raise ValueError(
            "the encoder's and decoder's token front ends must agree to export "
            f"(--encoder-learned-pos, --decoder-learned-pos): {tokens} and "
            f"{model.decoder.embed.tokens}"
        )
    head = model.decoder.output_projection
    return RecurnmtConfig(
        vocab_size=len(tgt),
        d_model=model.encoder.stack_cfg.embed_dim,
        encoder_stack=stack_config_to_dict(model.encoder.stack_cfg),
        decoder_stack=stack_config_to_dict(model.decoder.stack_cfg),
        **elastic_depth(args),
        max_source_positions=model.encoder.max_source_positions,
        max_target_positions=model.decoder.max_target_positions,
        **tokens.to_dict(),
        share_input_embeddings=model.encoder.embed_tokens is model.decoder.embed_tokens,
        tie_output_projection=head is None,
        output_projection_bias=head is not None and head.bias is not None,
        fairseq_arch=arch,
        bos_token_id=tgt.bos(),
        pad_token_id=tgt.pad(),
        eos_token_id=tgt.eos(),
        unk_token_id=tgt.unk(),
        decoder_start_token_id=tgt.eos(),
    )


def hf_state_dict(model: Any) -> dict[str, Any]:
    """fairseq's weights under the exported model's names: the same below the base model
    (``model.``), but the head's."""
    mapped = {}
    for name, tensor in model.state_dict().items():
        if name.endswith(_SKIPPED):
            continue
        if name.startswith("decoder.output_projection."):
            name = "lm_head." + name.removeprefix("decoder.output_projection.")
        else:
            name = "model." + name
        mapped[name] = tensor
    if model.decoder.output_projection is None:  # tied: the head is the decoder's embedding
        mapped["lm_head.weight"] = mapped["model.decoder.embed.embed_tokens.weight"]
    return mapped


def convert(model: Any, args: Any, arch: str) -> Any:
    """A :class:`~recurnmt.hf.RecurnmtForConditionalGeneration` with ``model``'s weights."""
    from recurnmt.hf.modeling import RecurnmtForConditionalGeneration

    hf = RecurnmtForConditionalGeneration(hf_config(model, args, arch))
    hf.load_state_dict(hf_state_dict(model), strict=True)
    return hf.eval()


def generation_config(hf: Any, beam: int, lenpen: float, max_len_b: int) -> Any:
    """transformers' generation settings that reproduce fairseq-generate's beam search."""
    from transformers import GenerationConfig

    cfg = hf.config
    return GenerationConfig(
        num_beams=beam,
        length_penalty=lenpen,
        early_stopping=True,
        # fairseq decodes max_len_b tokens, then only </s> (recurnmt.hf.generation)
        max_new_tokens=max_len_b + 1,
        min_new_tokens=1,
        suppress_tokens=[cfg.pad_token_id],
        decoder_start_token_id=cfg.decoder_start_token_id,
        bos_token_id=cfg.bos_token_id,
        eos_token_id=cfg.eos_token_id,
        pad_token_id=cfg.pad_token_id,
    )


def build_tokenizer(data: Path, dictionary: Any, work: Path) -> Any:
    """The exported tokenizer of a data directory prepared by ``data_prep``.

    Raises:
        ValueError: the directory has neither ``spm.model`` nor ``tokenizer/vocab.txt``.
    """
    from recurnmt.hf.tokenization import RecurnmtTokenizer

    vocab = work / "fairseq_dict.txt"
    vocab.write_text("".join(f"{s}\n" for s in dictionary.symbols), encoding="utf-8")
    if (data / "spm.model").is_file():
        return RecurnmtTokenizer(str(vocab), spm_file=str(data / "spm.model"))
    wordpiece = data / "tokenizer" / "vocab.txt"
    if wordpiece.is_file():
        from data_prep.wordpiece import load_wordpiece_tokenizer

        lower = bool(getattr(load_wordpiece_tokenizer(data / "tokenizer"), "do_lower_case", False))
        return RecurnmtTokenizer(str(vocab), wordpiece_file=str(wordpiece), do_lower_case=lower)
    raise ValueError(
        f"{data} has no spm.model or tokenizer/vocab.txt: only sentencepiece and word-piece "
        "(--tokenizer bibert) data directories give a tokenizer to export"
    )


def export(
    checkpoint: Path,
    out_dir: Path,
    data: Path | None = None,
    beam: int = 4,
    lenpen: float = 1.0,
    max_len_b: int = 200,
    force: bool = False,
) -> Path:
    """Writes the transformers model directory ``out_dir`` (see the module docstring).

    Raises:
        FileNotFoundError: the checkpoint or the data directory is missing.
        FileExistsError: ``out_dir`` holds files and ``force`` is off.
        ValueError: not a recurnmt model, or a setting that cannot be exported (named).
    """
    import tempfile

    from fairseq import checkpoint_utils

    cfg, arch = read_checkpoint(checkpoint)
    data = Path(data if data is not None else str(cfg.task.data).split(":")[0])
    lang = getattr(cfg.task, "target_lang", None)  # None: fairseq infers it from the files
    dictionaries = [data / f"dict.{lang}.txt"] if lang else list(data.glob("dict.*.txt"))
    if not any(d.is_file() for d in dictionaries):
        raise FileNotFoundError(
            f"data directory {data} (its dictionary) not found; pass --data DIR"
        )
    if out_dir.exists() and any(out_dir.iterdir()) and not force:
        raise FileExistsError(f"{out_dir} is not empty; pass --force to replace its files")
    models, saved = checkpoint_utils.load_model_ensemble([str(checkpoint)], {"data": str(data)})
    model = models[0].eval()
    hf = convert(model, saved.model, arch)
    hf.generation_config = generation_config(hf, beam, lenpen, max_len_b)
    out_dir.mkdir(parents=True, exist_ok=True)
    hf.save_pretrained(out_dir)
    with tempfile.TemporaryDirectory() as work:
        tokenizer = build_tokenizer(data, model.decoder.dictionary, Path(work))
        tokenizer.save_pretrained(out_dir)
    add_remote_code(out_dir)
    return out_dir


def add_remote_code(out_dir: Path) -> None:
    """Writes ``recurnmt_hf.py`` into a saved model directory and names its classes in the
    ``auto_map`` of ``config.json`` and ``tokenizer_config.json`` (those present)."""
    import json
    from importlib import resources

    source = resources.files("recurnmt.hf").joinpath("remote_code.py").read_text("utf-8")
    (out_dir / REMOTE_CODE).write_text(source, encoding="utf-8")
    for name, auto_map in AUTO_MAP.items():
        path = out_dir / name
        if path.is_file():
            values = json.loads(path.read_text(encoding="utf-8"))
            values["auto_map"] = auto_map
            path.write_text(json.dumps(values, indent=2, sort_keys=True) + "\n", "utf-8")


def main(argv: list[str] | None = None) -> Path:
    """Exports a checkpoint; returns the output directory."""
    args = parse_args(argv)
    out = export(
        args.checkpoint,
        args.out_dir,
        args.data,
        beam=args.beam,
        lenpen=args.lenpen,
        max_len_b=args.max_len_b,
        force=args.force,
    )
    print(
        f"wrote {out}; load it after `import recurnmt.hf` (or with trust_remote_code=True)",
        file=sys.stderr,
    )
    return out


cli = entry_point(main, PROG)

if __name__ == "__main__":
    sys.exit(cli())
