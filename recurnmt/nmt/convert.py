"""``recurnmt-convert SRC.pt OUT.pt``: a trained translation Transformer as a relaxed recursive
one (Relaxed Recursive Transformers, Bae et al. 2025).

Reads a fairseq checkpoint of fairseq's own ``transformer`` (any of its architectures: widths,
heads, depth, pre-/post-LN and the embedding layout come from the checkpoint's saved
arguments) or of recurnmt's ``recurrent_transformer`` (shared blocks are untied first), and
writes a fairseq checkpoint of a recurnmt architecture (``relaxed_transformer_*`` by default)
whose M shared blocks per side start by ``--init`` (stepwise, average or lower) and whose
levels each get a LoRA of rank ``--level-lora-rank`` and bias deltas, initialised from the
truncated SVD of (source layer - shared block) (:mod:`recurnmt.modules.relaxed_init`). Token
embeddings, position embeddings, embedding norms, the final norms and the output projection
are copied; every level's norms are the source layer's (``--layer-norms per-level``, the
relaxed family's default). At ``--level-lora-rank full`` the converted model computes the
source's logits (float rounding aside); at 0 it is plain sharing of the initialised blocks.

The output decodes with ``fairseq-generate --user-dir user_dir --path OUT.pt`` and fine-tunes
with ``fairseq-train DATA --user-dir user_dir --arch ARCH FLAGS --finetune-from-model OUT.pt``,
FLAGS the source's model flags plus those the command prints.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
from argparse import Namespace
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recurnmt.cli import entry_point
from recurnmt.modules.config import SHARING_SCHEMES
from recurnmt.modules.relaxed_init import INITS

PROG = "recurnmt-convert"
SOURCE_FAMILY = "recurrent_transformer"
# recurnmt options under which a recurrent_transformer computes what a vanilla one does
_VANILLA = {
    "level_signal": "none",
    "positions": "input",
    "act": "off",
    "lrc": "none",
    "nll_ratio": 0.0,
    "encoder_attn_groups": (),
    "encoder_ffn_sharing": "block",
    "decoder_ffn_sharing": "block",
    "level_lora_rank": "0",
    "encoder_levels": None,
    "decoder_levels": None,
}
# recurnmt options that are part of the source's function, which the relaxed model keeps
_KEPT = ("block_bias", "share_encoder_decoder_embeddings", "output_projection_bias")


@dataclass(frozen=True)
class Conversion:
    """What :func:`convert` wrote.

    Attributes:
        out: the converted checkpoint.
        arch: its architecture.
        flags: the recurnmt flags of its model beyond the source's own (for fine-tuning).
        p_star_source: the source's P* (RingFormer Table 1: no embeddings, no head).
        p_star: the converted model's P*.
    """

    out: Path
    arch: str
    flags: list[str]
    p_star_source: int
    p_star: int


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description=__doc__.split("\n\n")[0].replace("``", "")
    )
    parser.add_argument("source", type=Path, help="fairseq checkpoint of a trained transformer")
    parser.add_argument("out", type=Path, help="the converted checkpoint to write")
    parser.add_argument(
        "--arch", default="relaxed_transformer", help="recurnmt architecture of the result"
    )
    parser.add_argument("--unique-layers", type=int, metavar="M", help="M blocks, both sides")
    parser.add_argument("--encoder-unique-layers", type=int, metavar="M")
    parser.add_argument("--decoder-unique-layers", type=int, metavar="M")
    parser.add_argument("--sharing-scheme", choices=SHARING_SCHEMES, default="cycle")
    parser.add_argument(
        "--init",
        choices=INITS,
        default="stepwise",
        help="shared blocks from layers at even intervals (stepwise), the mean of the layers "
        "that share a block (average) or the first M layers (lower)",
    )
    parser.add_argument(
        "--level-lora-rank",
        metavar="R",
        help="each level's LoRA rank, or full (exactly the source); default: the arch's",
    )
    parser.add_argument("--layer-norms", choices=("per-level", "per-block"))
    parser.add_argument("--force", action="store_true", help="replace an existing OUT")
    return parser


def read_checkpoint(path: Path) -> tuple[dict[str, Any], Namespace, str]:
    """The raw checkpoint, its model arguments and the source kind (``fairseq``/``recurnmt``).

    Raises:
        FileNotFoundError: no such file.
        ValueError: not a fairseq checkpoint, or not a model this command converts (named).
    """
    import torch
    from fairseq.models import ARCH_MODEL_REGISTRY
    from fairseq.models.transformer import TransformerModel

    import recurnmt.nmt  # noqa: F401  (architectures)
    from recurnmt.nmt.checkpoint_safety import allow_fairseq_globals
    from recurnmt.nmt.defaults import ARCHS

    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    allow_fairseq_globals()  # checkpoints load weights-only
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises many kinds on a file that is no checkpoint
        raise ValueError(f"{path} is not a fairseq checkpoint ({type(err).__name__})") from None
    cfg = state.get("cfg") if isinstance(state, dict) else None
    args = cfg.get("model") if isinstance(cfg, dict) else None
    if not isinstance(args, Namespace) or "model" not in state:
        raise ValueError(f"{path} is not a fairseq checkpoint of a translation model")
    arch = getattr(args, "arch", None)
    if ARCH_MODEL_REGISTRY.get(arch) is TransformerModel:
        return state, args, "fairseq"
    if ARCHS.get(arch, ("",))[0] == SOURCE_FAMILY:
        return state, args, "recurnmt"
    raise ValueError(
        f"{path} holds a {arch!r} model; {PROG} converts fairseq's transformer (transformer, "
        "transformer_wmt_en_de, ...) and recurnmt's recurrent_transformer_*"
    )


def _model_args(source: Namespace, kind: str, arch: str, options: dict[str, Any]) -> Namespace:
    """The source's arguments as recurnmt's ``arch`` with ``options`` (recurnmt options left
    out take the arch's defaults, but those that are part of the source's function)."""
    from recurnmt.nmt.defaults import BASE, fill_arch_defaults
    from recurnmt.nmt.registry import MODEL_NAME

    args = copy.deepcopy(source)
    if kind == "recurnmt":
        for name, value in _VANILLA.items():
            given = getattr(args, name, value)
            if given not in (None, "", [], ()) and str(given) != str(value):
                flag = "--" + name.replace("_", "-")
                raise ValueError(
                    f"the source has {flag}={given!r}: only a plain {SOURCE_FAMILY} (shared "
                    "blocks aside) converts"
                )
        for name in BASE:
            if name not in (*_KEPT, "scale_embedding"):
                setattr(args, name, None)
    else:  # fairseq's transformer: biases in every projection
        args.block_bias = "on"
    if hasattr(args, "_name"):  # (a fairseq name would read as a pre-issue-29 checkpoint)
        del args._name
    args.arch = arch
    for name, value in options.items():
        setattr(args, name, value)
    fill_arch_defaults(args)
    args._name = MODEL_NAME
    return args


def _build(args: Namespace, vocab: tuple[int, int], joined: bool):
    """recurnmt's model of ``args`` over dictionaries of the given sizes (source, target)."""
    from fairseq import tasks

    from recurnmt.nmt.build import toy_dictionary
    from recurnmt.nmt.model import RecurrentTransformerModel

    nspecial = toy_dictionary(0).nspecial
    src = toy_dictionary(vocab[0] - nspecial)
    tgt = src if joined else toy_dictionary(vocab[1] - nspecial)
    task = tasks.get_task("translation")(args, src, tgt)
    return RecurrentTransformerModel.build_model(args, task)


def _source_model(state: dict[str, Any], args: Namespace, kind: str):
    """The source as recurnmt's model, its weights loaded."""
    from recurnmt.nmt.fairseq_weights import from_fairseq_transformer

    weights = state["model"]
    if kind == "fairseq":
        if getattr(args, "no_decoder_final_norm", False) and args.decoder_normalize_before:
            raise ValueError("the source has --no-decoder-final-norm, which recurnmt lacks")
        tied = bool(args.share_all_embeddings or args.share_decoder_input_output_embed)
        weights = from_fairseq_transformer(
            weights, args.encoder_layers, args.decoder_layers, tied_head=tied
        )
        args = _model_args(args, kind, f"{SOURCE_FAMILY}_wmt_en_de", {})
    else:
        args = copy.deepcopy(args)
    key = "{}.embed.embed_tokens.weight"
    vocab = (weights[key.format("encoder")].size(0), weights[key.format("decoder")].size(0))
    model = _build(args, vocab, _joined(args))
    model.load_state_dict(weights, strict=True)
    return model.eval(), vocab


def _joined(args: Namespace) -> bool:
    return bool(
        getattr(args, "share_all_embeddings", False)
        or getattr(args, "share_encoder_decoder_embeddings", False)
    )


def convert(
    source: Path,
    out: Path,
    *,
    arch: str = "relaxed_transformer",
    encoder_unique_layers: int | None = None,
    decoder_unique_layers: int | None = None,
    sharing_scheme: str = "cycle",
    init: str = "stepwise",
    level_lora_rank: str | int | None = None,
    layer_norms: str | None = None,
    force: bool = False,
) -> Conversion:
    """Writes the relaxed recursive model of ``source`` to ``out`` (module docstring).

    Raises:
        FileNotFoundError: no ``source``.
        FileExistsError: ``out`` exists and ``force`` is off.
        ValueError: a source or setting that cannot be converted (``ConfigError`` names the
            flag: a rank above the width, more blocks than layers, ...).
    """

    from recurnmt.modules.relaxed_init import relax_stack
    from recurnmt.nmt.defaults import ARCHS
    from recurnmt.parameters import parameter_report

    if arch not in ARCHS:
        raise ValueError(f"--arch={arch!r} is not a recurnmt translation architecture")
    if out.exists() and not force:
        raise FileExistsError(f"{out} exists; pass --force to replace it")
    state, source_args, kind = read_checkpoint(source)
    teacher, vocab = _source_model(state, source_args, kind)
    options = {
        "encoder_unique_layers": encoder_unique_layers,
        "decoder_unique_layers": decoder_unique_layers,
        "sharing_scheme": sharing_scheme,
        "level_lora_rank": None if level_lora_rank is None else str(level_lora_rank),
        "layer_norms": layer_norms,
    }
    args = _model_args(source_args, kind, arch, options)
    model = _build(args, vocab, _joined(args))
    own = {k: v for k, v in teacher.state_dict().items() if ".stack." not in k}
    missing = [k for k in model.state_dict() if ".stack." not in k and k not in own]
    if missing:
        raise ValueError(f"the source has no {missing[0]}")
    model.load_state_dict(own, strict=False)
    for side in ("encoder", "decoder"):
        relax_stack(getattr(teacher, side).stack, getattr(model, side).stack, init)
    _save(state, args, model.state_dict(), out)
    names = ("encoder_unique_layers", "decoder_unique_layers", "sharing_scheme")
    names += ("level_lora_rank", "layer_norms")
    flags = [f"--{n.replace('_', '-')}={getattr(args, n)}" for n in names]
    return Conversion(
        out,
        arch,
        flags,
        parameter_report(teacher).p_star,
        parameter_report(model).p_star,
    )


def _save(state: dict[str, Any], args: Namespace, weights: dict, out: Path) -> None:
    """A fresh fairseq checkpoint (no optimizer state, update 0) of ``args`` and ``weights``,
    with the source's other settings (task, data), written atomically."""
    import torch

    cfg = dict(state["cfg"])
    cfg["model"] = args
    history = dict((state.get("optimizer_history") or [{}])[-1])
    history.update(lr_scheduler_state={}, num_updates=0)
    history.pop("optimizer", None)
    converted = {
        "args": None,
        "cfg": cfg,
        "model": weights,
        "criterion": state.get("criterion"),
        "optimizer_history": [history],
        "task_state": state.get("task_state", {}),
        "extra_state": {"train_iterator": {"epoch": 1, "iterations_in_epoch": 0, "version": 2}},
        "last_optimizer_state": None,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    torch.save(converted, tmp)
    os.replace(tmp, out)


def main(argv: list[str] | None = None) -> Conversion:
    """Converts a checkpoint; prints what it wrote and how to fine-tune it."""
    args = build_parser().parse_args(argv)
    both = args.unique_layers
    result = convert(
        args.source,
        args.out,
        arch=args.arch,
        encoder_unique_layers=args.encoder_unique_layers or both,
        decoder_unique_layers=args.decoder_unique_layers or both,
        sharing_scheme=args.sharing_scheme,
        init=args.init,
        level_lora_rank=args.level_lora_rank,
        layer_norms=args.layer_norms,
        force=args.force,
    )
    print(
        f"wrote {result.out}: {result.arch} ({args.init} init; P* {result.p_star:,} from the "
        f"source's {result.p_star_source:,})\nfine-tune with: fairseq-train DATA --user-dir "
        f"user_dir --arch {result.arch} {' '.join(result.flags)} [the source's model flags] "
        f"--finetune-from-model {result.out}"
    )
    return result


cli = entry_point(main, PROG)

if __name__ == "__main__":
    sys.exit(cli())
