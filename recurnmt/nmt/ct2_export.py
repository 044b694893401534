"""``recurnmt-export-ct2 CKPT OUT``: a trained translation model as a CTranslate2 model directory.

CTranslate2 (the engine of OpenNMT, Argos Translate and LibreTranslate) runs standard
encoder-decoder Transformers. In evaluation several recurnmt families are one, level by level:
every level runs its block's weights, with

* RingFormer's low-rank level signals folded into the level's projections (RingFormer eq. 6-7:
  ``W + S`` after a projection, ``W (I + S)`` before it, as its decoding folds them:
  :meth:`~recurnmt.modules.level_parts.LevelParts.fold_linears`), and its per-level norms
  as the layer's own;
* a relaxed level's LoRA and bias deltas merged into its linears (Relaxed Recursive
  Transformers eq. 3), the cross-attention's keys and values included;
* ``recurrent_transformer`` and Takase & Kiyono's sharing schemes as they are.

So the directory holds one standard layer per level, written through CTranslate2's own model
specs (``ctranslate2.specs.TransformerSpec``); levels whose weights are identical (plain
sharing) are stored once, as CTranslate2 aliases equal variables. fairseq's own
``transformer`` goes through CTranslate2's fairseq converter functions, from the model fairseq
loads. What a standard layer cannot hold is refused, naming the part: the Universal
Transformer's per-level position and timestep signals, ACT's halting, SReT's non-linear
projection, learned residual coefficients and sliced attention, positions added at every
level, a signal CTranslate2 has no place for.

The vocabularies are the task's dictionaries (fairseq's ``<pad>`` as CTranslate2's
``<blank>``); the source gets fairseq's end-of-sentence token and decoding starts from it, as
in fairseq. Inputs are the same SentencePiece pieces fairseq-generate reads.

``--argos NAME.argosmodel`` also writes an Argos Translate package of the directory (for Argos
Translate and LibreTranslate: :mod:`recurnmt.nmt.argos_package`): the same export, with the
corpus's sentencepiece model, the languages and an offline sentence splitter around it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from recurnmt.cli import entry_point
from recurnmt.nmt import argos_package
from recurnmt.nmt.argos_package import ArgosOptions

PROG = "recurnmt-export-ct2"
QUANTIZATIONS = ("float32", "int8", "int8_float32", "int8_float16", "float16", "bfloat16")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", type=Path, help="fairseq checkpoint (recurnmt or fairseq)")
    parser.add_argument("out", type=Path, help="the CTranslate2 model directory to write")
    parser.add_argument(
        "--data", type=Path, help="the binarized data (its dict.*.txt); default: the checkpoint's"
    )
    parser.add_argument("--quantization", choices=QUANTIZATIONS, default="float32")
    parser.add_argument("--force", action="store_true", help="replace an existing OUT")
    argos = parser.add_argument_group("Argos Translate package (docs/deploy.md)")
    argos.add_argument(
        "--argos", type=Path, metavar="NAME.argosmodel",
        help="also write an Argos Translate package of OUT (sentencepiece data only)",
    )  # fmt: skip
    argos.add_argument("--from-code", help="source language code; default: the model's task's")
    argos.add_argument("--to-code", help="target language code; default: the model's task's")
    argos.add_argument("--from-name", help="source language name (e.g. German); default: code")
    argos.add_argument("--to-name", help="target language name (e.g. English); default: code")
    argos.add_argument("--package-version", default="1.0")
    argos.add_argument(
        "--splitter", type=Path, metavar="MODEL.onnx",
        help="a MiniSBD sentence splitter model to carry; default: a rule-based one "
        "(recurnmt/nmt/sentence_splitter.py)",
    )  # fmt: skip
    return parser


def load(checkpoint: Path, data: Path | None = None):
    """The model of ``checkpoint`` (float32, evaluation mode) and its task."""
    from fairseq import checkpoint_utils

    import recurnmt.nmt  # noqa: F401  (the plugin)

    if not checkpoint.is_file():
        raise FileNotFoundError(f"checkpoint {checkpoint} does not exist")
    overrides = {"data": str(data)} if data is not None else None
    try:
        models, _cfg, task = checkpoint_utils.load_model_ensemble_and_task(
            [str(checkpoint)], arg_overrides=overrides
        )
    except FileNotFoundError as err:  # the task's dictionaries
        raise ValueError(
            f"{err}: pass --data, the binarized data the model was trained on"
        ) from None
    return models[0].float().eval(), task


def model_spec(model, task) -> Any:
    """CTranslate2's spec of ``model`` (recurnmt's or fairseq's transformer), its weights
    and vocabularies set.

    Raises:
        ValueError: a model or part that a standard Transformer layer cannot hold (named).
    """
    import torch

    with torch.no_grad():
        if hasattr(model.encoder, "stack"):  # recurnmt's (a subclass of fairseq's model)
            spec = _recurnmt_spec(model)
        else:
            spec = _fairseq_spec(model)
    spec.register_source_vocabulary(_vocabulary(task.source_dictionary))
    spec.register_target_vocabulary(_vocabulary(task.target_dictionary))
    spec.config.decoder_start_token = spec.config.eos_token  # fairseq starts from </s>
    spec.config.add_source_eos = True  # and ends every source with it
    return spec


def _vocabulary(dictionary) -> list[str]:
    return ["<blank>" if token == "<pad>" else token for token in dictionary.symbols]


def _fairseq_spec(model):
    """fairseq's transformer through CTranslate2's own fairseq converter functions."""
    from ctranslate2.converters import fairseq as ct2_fairseq

    spec = ct2_fairseq._get_model_spec(model.cfg if hasattr(model, "cfg") else model.args)
    ct2_fairseq.set_transformer_encoder(spec.encoder, model.encoder)
    ct2_fairseq.set_transformer_decoder(spec.decoder, model.decoder)
    return spec


def _refusals(model) -> list[str]:
    """The parts of a recurnmt model that no standard Transformer layer holds."""
    out = []
    for side in ("encoder", "decoder"):
        coder = getattr(model, side)
        stack = coder.stack
        if stack.halting is not None:
            out.append(f"the {side}'s halting per token (ACT)")
        if not coder.embed.add_positions:
            out.append(f"the {side}'s positions added at every level (--positions every-level)")
        for parts in stack.levels:
            if parts.level_embedding is not None:
                out.append(f"the {side}'s timestep signal at every level (--level-signal static)")
            if parts.nll is not None:
                out.append(
                    f"the {side}'s SReT non-linear projection after every level (--nll-ratio)"
                )
            if parts.slicing is not None:
                out.append(f"the {side}'s sliced group attention (SReT)")
            for name in ("attn_signal", "ffn_signal"):
                signal = getattr(parts, name)
                if signal is not None and not _low_rank(signal):
                    out.append(f"the {side}'s {type(signal).__name__} level signal")
        for block in stack.blocks:
            if block.lrc.mode != "none":
                out.append(f"the {side}'s learned residual coefficients (--lrc {block.lrc.mode})")
    return list(dict.fromkeys(out))


def _low_rank(signal) -> bool:
    from recurnmt.modules.level_signals import LowRankSignal

    return isinstance(signal, LowRankSignal)


def _recurnmt_spec(model):
    import torch.nn.functional as F
    from ctranslate2.specs import common_spec, transformer_spec

    refused = _refusals(model)
    if refused:
        raise ValueError(f"CTranslate2 has no place for {refused[0]}")
    enc, dec = model.encoder.stack, model.decoder.stack
    blocks = [*enc.blocks, *dec.blocks]
    pre_norm = {b.normalize_before for b in blocks}
    heads = {b.self_attn.num_heads for b in blocks}
    activations = {b.ffn.activation for b in blocks if b.ffn is not None} or {F.relu}
    if len(pre_norm) != 1 or len(heads) != 1 or len(activations) > 1:
        raise ValueError("CTranslate2 needs one layout, head count and activation on both sides")
    activation = {F.relu: common_spec.Activation.RELU, F.gelu: common_spec.Activation.GELU}[
        activations.pop()
    ]
    spec = transformer_spec.TransformerSpec.from_config(
        (enc.num_levels, dec.num_levels),
        heads.pop(),
        pre_norm=pre_norm.pop(),
        activation=activation,
        layernorm_embedding=model.encoder.embed.layernorm_embedding is not None,
    )
    _set_side(spec.encoder, model.encoder)
    _set_side(spec.decoder, model.decoder)
    decoder = model.decoder
    head = decoder.output_projection or decoder.embed.embed_tokens
    spec.decoder.projection.weight = _array(head.weight)
    if getattr(head, "bias", None) is not None:
        spec.decoder.projection.bias = _array(head.bias)
    return spec


def _array(tensor):
    return tensor.detach().float().cpu().contiguous().numpy()


def _set_side(spec, coder) -> None:
    from ctranslate2.converters import fairseq as ct2_fairseq

    embed = coder.embed
    ct2_fairseq.set_input_layers(spec, embed)  # tokens, positions, scale: fairseq's front end
    if embed.layernorm_embedding is not None:
        ct2_fairseq.set_layer_norm(spec.layernorm_embedding, embed.layernorm_embedding)
    stack = coder.stack
    for level, layer_spec in enumerate(spec.layer):
        _set_level(layer_spec, stack.block_of_level(level), stack.levels[level])
    if stack.final_norm is not None:
        ct2_fairseq.set_layer_norm(spec.layer_norm, stack.final_norm)


def _set_level(spec, block, parts) -> None:
    """One level as a standard layer: its block's weights with its signals and LoRA folded
    in, its norms."""
    weights = _level_linears(block, parts)
    norms = parts.norms if parts.norms is not None else block.norms
    cross = block.cross_attn is not None
    _set_norm(spec.self_attention.layer_norm, norms[0])
    _set_linear(spec.self_attention.linear[0], weights["qkv"])
    _set_linear(spec.self_attention.linear[1], weights["out"])
    if cross:
        _set_norm(spec.attention.layer_norm, norms[1])
        _set_linear(spec.attention.linear[0], weights["cross_q"])
        _set_linear(spec.attention.linear[1], weights["cross_kv"])
        _set_linear(spec.attention.linear[2], weights["cross_out"])
    if block.ffn is None:  # One Wide FFN's decoder: a zero FFN adds nothing in pre-LN
        if not block.normalize_before:
            raise ValueError(
                "CTranslate2 has no post-LN layer without a feed-forward block (One Wide FFN's "
                "decoder; pre-LN takes a zero one)"
            )
        _set_zero_ffn(spec.ffn, weights["out"][0].shape[0])
        return
    _set_norm(spec.ffn.layer_norm, norms[2 if cross else 1])
    _set_linear(spec.ffn.linear_0, weights["ffn_up"])
    _set_linear(spec.ffn.linear_1, weights["ffn_down"])


def _set_zero_ffn(spec, dim: int) -> None:
    """A feed-forward block of inner width 1 and zero weights: pre-LN, ``x + 0``."""
    import numpy as np

    spec.layer_norm.gamma, spec.layer_norm.beta = np.ones(dim, "f4"), np.zeros(dim, "f4")
    spec.linear_0.weight, spec.linear_0.bias = np.zeros((1, dim), "f4"), np.zeros(1, "f4")
    spec.linear_1.weight, spec.linear_1.bias = np.zeros((dim, 1), "f4"), np.zeros(dim, "f4")


def _level_linears(block, parts) -> dict[str, tuple]:
    """Every linear of ``block`` as ``parts``' level runs it, ``(weight, bias)``."""
    import torch

    from recurnmt.modules.level_lora import LINEARS

    folded = parts.fold_linears(block)
    out = {}
    for name, (path, _groups) in LINEARS.items():
        try:
            linear = block.get_submodule(path)
        except AttributeError:
            continue
        weight, bias = folded.get(name, (linear.weight, linear.bias))
        if name == "cross_kv" and parts.lora is not None and name in parts.lora:
            weight, bias = parts.lora[name].folded(weight, bias)  # once per sentence in torch
        out[name] = (weight, bias)
    with torch.no_grad():
        return {k: (_array(w), None if b is None else _array(b)) for k, (w, b) in out.items()}


def _set_linear(spec, weights) -> None:
    spec.weight = weights[0]
    if weights[1] is not None:
        spec.bias = weights[1]


def _set_norm(spec, norm) -> None:
    spec.gamma = _array(norm.weight)
    spec.beta = _array(norm.bias)


def export(checkpoint: Path, out: Path, *, data: Path | None = None,
           quantization: str = "float32", force: bool = False,
           argos: ArgosOptions | None = None) -> Path:  # fmt: skip
    """Writes the CTranslate2 model of ``checkpoint`` to ``out`` (module docstring), and the
    Argos Translate package ``argos`` asks for.

    Raises:
        FileNotFoundError: no ``checkpoint``.
        FileExistsError: ``out`` (or the package) exists and ``force`` is off.
        ValueError: a model CTranslate2 cannot hold (the part named), or no dictionaries; for a
            package, word-piece data or a package name that is no ``.argosmodel``.
    """
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        raise ValueError(
            "CTranslate2 is not installed: pip install 'recurnmt[deploy]' (or ctranslate2)"
        ) from None
    if out.exists() and not force:
        raise FileExistsError(f"{out} exists; pass --force to replace it")
    if argos is not None:
        argos.check()
        if argos.out.exists() and not force:
            raise FileExistsError(f"{argos.out} exists; pass --force to replace it")
    model, task = load(checkpoint, data)
    spm = None
    if argos is not None:  # refuses word pieces before anything is written
        spm = argos_package.sentencepiece_model(Path(str(task.cfg.data).split(":")[0]))
    write(model, task, out, quantization)
    if argos is not None:
        meta = argos_package.metadata(
            argos.from_code or task.cfg.source_lang,
            argos.to_code or task.cfg.target_lang,
            from_name=argos.from_name,
            to_name=argos.to_name,
            package_version=argos.package_version,
        )
        readme = (
            f"# {meta['from_name']} -> {meta['to_name']}\n\nA recurnmt model "
            f"({model.__class__.__name__}, {quantization}) exported by {PROG}.\n"
        )
        argos_package.write(argos.out, out, spm, meta, splitter=argos.splitter, readme=readme)
    return out


def write(model, task, out: Path, quantization: str = "float32") -> Path:
    """Writes the CTranslate2 model directory of ``model`` (its task's vocabularies) to
    ``out``, its weights quantized as ``quantization`` (:data:`QUANTIZATIONS`)."""
    spec = model_spec(model, task)
    spec.validate()
    spec.optimize(quantization=None if quantization == "float32" else quantization)
    out.mkdir(parents=True, exist_ok=True)
    spec.save(str(out))
    return out


def main(argv: list[str] | None = None) -> Path:
    args = build_parser().parse_args(argv)
    argos = None
    if args.argos is not None:
        argos = ArgosOptions(args.argos, args.from_code, args.to_code, args.from_name,
                             args.to_name, args.package_version, args.splitter)  # fmt: skip
    out = export(args.checkpoint, args.out, data=args.data, quantization=args.quantization,
                 force=args.force, argos=argos)  # fmt: skip
    size = (out / "model.bin").stat().st_size
    print(f"wrote {out} ({args.quantization}, model.bin {size / 2**20:.1f} MiB)")
    if argos is not None:
        size = argos.out.stat().st_size
        print(f"wrote {argos.out} (Argos Translate package, {size / 2**20:.1f} MiB)")
    return out


cli = entry_point(main, PROG)

if __name__ == "__main__":
    sys.exit(cli())
