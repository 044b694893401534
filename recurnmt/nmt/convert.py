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
relaxed family's default, here whatever the target's). At ``--level-lora-rank full`` the
converted model computes the source's logits (float rounding aside), or the conversion is
refused with the part of the target's levels that cannot hold the source's layers; at 0 it is
plain sharing of the initialised blocks. The command prints the largest logit difference from
the source on a few random sentences and the share of the SVD energy the LoRAs keep.

fairseq's older checkpoint format (top-level ``args``, no ``cfg``: its WMT16/WMT19 releases)
is upgraded as fairseq upgrades it (``checkpoint_utils._upgrade_state_dict``, then the model's
``upgrade_state_dict`` for renamed weights).

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
from recurnmt.flags import CONVERSION_FLAGS, add_options

PROG = "recurnmt-convert"
SOURCE_FAMILY = "recurrent_transformer"
FULL_RANK_TOLERANCE = 1e-4  # of the largest logit: float32 rounding over a deep stack
# recurnmt options that change what a recurrent_transformer computes from a vanilla one: a
# source converts with their plain values, BASE's (the shared blocks aside)
_PER_LEVEL = (
    "level_signal",
    "positions",
    "act",
    "lrc",
    "nll_ratio",
    "encoder_attn_groups",
    "encoder_ffn_sharing",
    "decoder_ffn_sharing",
    "level_lora_rank",
    "encoder_levels",
    "decoder_levels",
)
# recurnmt options that are part of the source's function, which the relaxed model keeps
_KEPT = ("block_bias", "share_encoder_decoder_embeddings", "output_projection_bias")


def _vanilla() -> dict[str, Any]:
    """The options of :data:`_PER_LEVEL` under which a recurrent_transformer computes what a
    vanilla one does: their defaults (:data:`recurnmt.nmt.defaults.BASE`, a plain stack)."""
    from recurnmt.nmt.defaults import BASE

    return {name: BASE[name] for name in _PER_LEVEL}


@dataclass(frozen=True)
class Conversion:
    """What :func:`convert` wrote.

    Attributes:
        out: the converted checkpoint.
        arch: its architecture.
        flags: the recurnmt flags of its model beyond the source's own (for fine-tuning).
        p_star_source: the source's P* (RingFormer Table 1: no embeddings, no head).
        p_star: the converted model's P*.
        max_logit_difference: the largest difference of its logits from the source's on a
            few random sentences (:func:`logit_difference`).
        energy_kept: the share of the energy of the levels' differences from their shared
            blocks that the LoRAs keep (squared singular values; 1 at full rank).
    """

    out: Path
    arch: str
    flags: list[str]
    p_star_source: int
    p_star: int
    max_logit_difference: float
    energy_kept: float


def build_parser() -> argparse.ArgumentParser:
    from recurnmt.nmt.flags import add_stack_flags

    parser = argparse.ArgumentParser(
        prog=PROG, description=__doc__.split("\n\n")[0].replace("``", "")
    )
    parser.add_argument("source", type=Path, help="fairseq checkpoint of a trained transformer")
    parser.add_argument("out", type=Path, help="the converted checkpoint to write")
    parser.add_argument(
        "--arch", default="relaxed_transformer", help="recurnmt architecture of the result"
    )
    add_options(parser, CONVERSION_FLAGS, with_defaults=True)  # as the vision converter's
    add_stack_flags(parser, ("num_unique", "norms_per_level"))  # as fairseq-train's
    parser.add_argument("--force", action="store_true", help="replace an existing OUT")
    return parser


def read_checkpoint(path: Path) -> tuple[dict[str, Any], Namespace, str]:
    """The raw checkpoint, its model arguments and the source kind (``fairseq``/``recurnmt``).

    Raises:
        FileNotFoundError: no such file.
        CheckpointError: not a fairseq checkpoint (truncated, a text file, an image model's).
        ValueError: not a model this command converts (named).
    """
    from fairseq.models import ARCH_MODEL_REGISTRY
    from fairseq.models.transformer import TransformerModel

    import recurnmt.nmt  # noqa: F401  (architectures)
    from recurnmt.checkpoint_files import FAIRSEQ, read_checkpoint_file
    from recurnmt.nmt.defaults import ARCHS

    state = read_checkpoint_file(path, FAIRSEQ)  # weights-only; one line on a bad file
    if (
        isinstance(state, dict)
        and state.get("cfg") is None
        and isinstance(state.get("args"), Namespace)
    ):
        state = _upgraded(state, path)  # fairseq's older releases: ``args``, no ``cfg``
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


def _upgraded(state: dict[str, Any], path: Path) -> dict[str, Any]:
    """A checkpoint of fairseq's older format (top-level ``args``, no ``cfg``: the WMT16 and
    WMT19 releases among them) upgraded as fairseq's own ``load_checkpoint_to_cpu`` upgrades
    it (``checkpoint_utils._upgrade_state_dict``: renamed options, missing fields, the
    ``cfg`` made from ``args``), the ``cfg`` kept as the plain dict fairseq saves."""
    from fairseq import checkpoint_utils
    from omegaconf import OmegaConf

    try:
        state = checkpoint_utils._upgrade_state_dict(state)
    except Exception as err:  # fairseq's upgrade indexes fields an odd file may lack
        raise ValueError(
            f"{path} is not a fairseq checkpoint fairseq can upgrade ({type(err).__name__}: {err})"
        ) from None
    state["cfg"] = OmegaConf.to_container(state["cfg"], resolve=True, enum_to_str=True)
    return state


def _model_args(source: Namespace, kind: str, arch: str, options: dict[str, Any]) -> Namespace:
    """The source's arguments as recurnmt's ``arch`` with ``options`` (recurnmt options left
    out take the arch's defaults, but those that are part of the source's function)."""
    from recurnmt.nmt.defaults import BASE, fill_arch_defaults
    from recurnmt.nmt.registry import MODEL_NAME

    args = copy.deepcopy(source)
    if kind == "recurnmt":
        for name, value in _vanilla().items():
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
        weights = _fairseq_upgraded_weights(weights, args)
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


def _fairseq_upgraded_weights(weights: dict[str, Any], args: Namespace) -> dict[str, Any]:
    """fairseq's transformer weights with the renames fairseq makes when it loads them
    (``upgrade_state_dict``: fused ``in_proj_weight`` split into Q, K and V, ``layer_norms.N``
    named, ``embed_out`` as ``output_projection``), made by fairseq's own model of ``args``."""
    from fairseq import tasks
    from fairseq.models import ARCH_MODEL_REGISTRY

    from recurnmt.nmt.build import toy_dictionary

    args = copy.deepcopy(args)
    nspecial = toy_dictionary(0).nspecial
    sizes = [weights[f"{side}.embed_tokens.weight"].size(0) for side in ("encoder", "decoder")]
    src = toy_dictionary(sizes[0] - nspecial)
    tgt = src if sizes[0] == sizes[1] else toy_dictionary(sizes[1] - nspecial)
    task = tasks.get_task("translation")(args, src, tgt)
    model = ARCH_MODEL_REGISTRY[args.arch].build_model(args, task)
    weights = dict(weights)
    model.upgrade_state_dict(weights)  # in place, as fairseq's load_state_dict does
    return weights


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
        "layer_norms": layer_norms or "per-level",  # every level the norms of its layer
    }
    args = _model_args(source_args, kind, arch, options)
    model = _build(args, vocab, _joined(args))
    if model.encoder.stack.halting is not None or model.decoder.stack.halting is not None:
        raise ValueError(
            f"--arch={arch}: its levels halt per token (ACT), which no trained transformer's "
            "layers do; convert to an architecture without ACT"
        )
    own = {k: v for k, v in teacher.state_dict().items() if ".stack." not in k}
    missing = [k for k in model.state_dict() if ".stack." not in k and k not in own]
    if missing:
        raise ValueError(f"the source has no {missing[0]}")
    model.load_state_dict(own, strict=False)
    kept = whole = 0.0
    for side in ("encoder", "decoder"):
        try:
            energy = relax_stack(getattr(teacher, side).stack, getattr(model, side).stack, init)
        except ValueError as err:  # a part of the target's levels no source layer holds
            raise ValueError(f"--arch={arch}: {err}") from None
        kept, whole = kept + energy[0], whole + energy[1]
    difference, scale = logit_difference(teacher, model.eval(), vocab)
    if str(args.level_lora_rank) == "full" and difference > FULL_RANK_TOLERANCE * scale:
        raise ValueError(_inexact(args, difference))
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
        difference,
        kept / whole if whole > 0 else 1.0,
    )


def logit_difference(teacher, model, vocab: tuple[int, int], seed: int = 0) -> tuple[float, float]:
    """The largest difference between two models' logits on a few random sentences (4 of
    12 tokens, teacher forcing, evaluation mode), and the teacher's largest logit."""
    import torch

    from recurnmt.nmt.build import toy_dictionary

    nspecial, eos = toy_dictionary(0).nspecial, toy_dictionary(0).eos()
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(nspecial, vocab[0], (4, 12), generator=gen)
    src[:, -1] = eos
    prev = torch.randint(nspecial, vocab[1], (4, 12), generator=gen)
    prev[:, 0] = eos
    lengths = torch.full((4,), 12)
    with torch.no_grad():
        want = teacher.eval()(src, lengths, prev)[0].float()
        got = model.eval()(src, lengths, prev)[0].float()
    return (got - want).abs().max().item(), max(1.0, want.abs().max().item())


def _inexact(args: Namespace, difference: float) -> str:
    """Why a full-rank conversion to ``args.arch`` is not the source: the per-level parts its
    levels share or add."""
    causes = []
    if args.layer_norms == "per-block":
        causes.append(
            "--layer-norms=per-block: the levels of a block share its norms where every "
            "source layer has its own (--layer-norms per-level holds them)"
        )
    added = [
        f"{name}={getattr(args, name)!r}"
        for name, plain in _vanilla().items()
        if name not in ("level_lora_rank", "encoder_levels", "decoder_levels")
        and getattr(args, name, plain) not in (None, "", [], ())
        and str(getattr(args, name)) != str(plain)
    ]
    if added:
        causes.append(
            f"its levels add or share what the source's layers lack ({', '.join(added)}), "
            "which no LoRA can undo"
        )
    return (
        f"--arch={args.arch} cannot compute the source at --level-lora-rank=full (max logit "
        f"difference {difference:.3g} on random sentences): "
        + ("; ".join(causes) if causes else "a part of its levels this command does not know")
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
        f"source's {result.p_star_source:,})\nthe LoRAs keep {result.energy_kept:.1%} of the "
        "energy of the levels' differences from their blocks; max logit difference from the "
        f"source {result.max_logit_difference:.3g} on random sentences\nfine-tune with: fairseq-train DATA --user-dir "
        f"user_dir --arch {result.arch} {' '.join(result.flags)} [the source's model flags] "
        f"--finetune-from-model {result.out}"
    )
    return result


cli = entry_point(main, PROG)

if __name__ == "__main__":
    sys.exit(cli())
