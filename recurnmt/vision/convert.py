"""``python -m recurnmt.vision.convert SRC OUT``: a trained ViT/DeiT as a relaxed recursive one
(Relaxed Recursive Transformers, Bae et al. 2025).

The source is a checkpoint of ``recurnmt.vision.training.train`` holding a ViT-family model without
sharing (or with sharing: its blocks are untied first), or the weights of a timm
``VisionTransformer`` (ViT/DeiT: a state dict in a ``.pth``/``.pt`` file, bare or under
``model``/``state_dict``, or a ``.safetensors`` file; widths, depth, patch and image size and
classes are read from the tensors, the heads are width / 64 as in every timm ViT and DeiT
unless ``--num-heads``). The output is a checkpoint of the registered relaxed model
(``--model``, ``deit_tiny_relaxed_patch16_224`` by default) at the source's sizes, whose M
shared blocks start by ``--init`` and whose levels each get a LoRA and bias deltas from the
truncated SVD of (source layer - shared block) (:mod:`recurnmt.modules.relaxed_init`); patch
and position embeddings, the class token, norms and the head are the source's. At
``--level-lora-rank full`` it computes the source's logits. ``python -m
recurnmt.vision.training.evaluate OUT`` evaluates it and ``python -m recurnmt.vision.training.train
--finetune OUT`` fine-tunes it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import Tensor

from recurnmt.checkpoint_files import FAIRSEQ, CheckpointError, describe, kind_of
from recurnmt.cli import entry_point
from recurnmt.flags import CONVERSION_FLAGS, add_options
from recurnmt.modules import ConfigError
from recurnmt.modules.config import rank_or_full
from recurnmt.modules.relaxed_init import relax_stack
from recurnmt.vision.checkpoint import load_checkpoint, model_from_checkpoint, save_checkpoint
from recurnmt.vision.models.vit import VisionTransformer
from recurnmt.vision.registry import create_model

PROG = "python -m recurnmt.vision.convert"
TIMM_HEAD_DIM = 64  # every timm ViT / DeiT: heads = width / 64
# timm's VisionTransformer names -> recurnmt's (per block: blocks.{i}.X -> stack.blocks.{i}.Y)
_TIMM_BLOCK = {
    "norm1": "norms.0",
    "norm2": "norms.1",
    "attn.qkv": "self_attn.qkv_proj",
    "attn.proj": "self_attn.out_proj",
    "mlp.fc1": "ffn.up",
    "mlp.fc2": "ffn.down",
}
_TIMM_TOP = {
    "cls_token": "cls_token",
    "pos_embed": "pos_embed.weight",
    "patch_embed.proj.weight": "patch_embed.proj.weight",
    "patch_embed.proj.bias": "patch_embed.proj.bias",
    "norm.weight": "stack.final_norm.weight",
    "norm.bias": "stack.final_norm.bias",
    "head.weight": "head.weight",
    "head.bias": "head.bias",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path, help="recurnmt.vision checkpoint or timm weights")
    parser.add_argument("out", type=Path, help="the converted checkpoint to write")
    parser.add_argument("--model", default="deit_tiny_relaxed_patch16_224", help="relaxed model")
    add_options(parser, CONVERSION_FLAGS, with_defaults=True)  # as recurnmt-convert's
    parser.add_argument("--num-heads", type=int, help="heads of timm weights (width / 64)")
    parser.add_argument(
        "--use-ema",
        action="store_true",
        help="a timm training checkpoint's EMA weights (state_dict_ema), as timm's validate.py",
    )
    parser.add_argument("--force", action="store_true", help="replace an existing OUT")
    return parser


def _read(path: Path) -> dict[str, Any]:
    """The source's state: any checkpoint (timm's training checkpoints keep their argparse
    arguments beside the weights) or ``.safetensors`` weights."""
    return load_checkpoint(path, kind=None)


def timm_vit(weights: dict[str, Tensor], num_heads: int | None = None) -> VisionTransformer:
    """recurnmt's ViT holding the weights of a timm ``VisionTransformer`` (class token, learned
    positions, pre-LN blocks, token pooling: ViT and DeiT).

    Raises:
        ValueError: a weight recurnmt's ViT has no place for (register or distillation
            tokens, layer scale, qk-norm, ...), or not a ViT's weights.
    """
    if "blocks.0.attn.qkv.weight" not in weights or "cls_token" not in weights:
        raise ValueError("the weights are no timm VisionTransformer's (no blocks.0.attn.qkv)")
    patch = weights["patch_embed.proj.weight"]  # D x C x P x P
    dim, depth = patch.size(0), 1 + max(int(k.split(".")[1]) for k in weights if k[:7] == "blocks.")
    grid = round((weights["pos_embed"].size(1) - 1) ** 0.5)
    sizes = dict(
        embed_dim=dim,
        depth=depth,
        num_heads=num_heads or max(1, dim // TIMM_HEAD_DIM),
        ffn_dim=weights["blocks.0.mlp.fc1.weight"].size(0),
        patch_size=patch.size(-1),
        img_size=grid * patch.size(-1),
        in_chans=patch.size(1),
        num_classes=weights["head.weight"].size(0) if "head.weight" in weights else 0,
    )
    mapped = {}
    for key, value in weights.items():
        if key in _TIMM_TOP:
            mapped[_TIMM_TOP[key]] = value
            continue
        parts = key.split(".")
        name = ".".join(parts[2:-1]) if parts[0] == "blocks" else None
        if name not in _TIMM_BLOCK:
            raise ValueError(f"the weights hold {key}, which recurnmt's ViT has no place for")
        mapped[f"stack.blocks.{parts[1]}.{_TIMM_BLOCK[name]}.{parts[-1]}"] = value
    model = create_model("deit_tiny_patch16_224", **sizes)
    model.load_state_dict(mapped, strict=True)
    return model


def vit_settings(model: VisionTransformer) -> dict[str, Any]:
    """The keyword arguments that rebuild ``model``'s sizes and image front end."""
    stack, block = model.stack, model.stack.blocks[0]
    norm = model.stack.final_norm or block.norms[0]
    return dict(
        embed_dim=model.embed_dim,
        depth=stack.num_levels,
        num_heads=block.self_attn.num_heads,
        ffn_dim=block.ffn.up.out_features,
        img_size=tuple(model.img_size),
        patch_size=tuple(model.patch_embed.patch_size),
        in_chans=model.in_chans,
        num_classes=model.num_classes,
        class_token=model.cls_token is not None,
        global_pool=model.global_pool,
        pos_embed=model.pos_embed.kind,
        norm_eps=norm.eps,
    )


def timm_weights(ckpt: dict[str, Any], use_ema: bool = False) -> dict[str, Tensor]:
    """The model weights of a checkpoint as timm saves them, chosen as timm's
    ``load_state_dict`` chooses (``state_dict_ema`` or ``model_ema`` with ``use_ema``, else
    ``state_dict``, else ``model``, else the file itself) and cleaned by timm's
    ``clean_state_dict`` (the ``module.`` prefix of a DataParallel model dropped).

    Raises:
        ValueError: ``use_ema`` and the checkpoint has no EMA weights.
    """
    from timm.models import clean_state_dict

    keys = ("state_dict_ema", "model_ema") if use_ema else ("state_dict", "model")
    found = next((k for k in keys if isinstance(ckpt.get(k), dict)), None)
    if use_ema and found is None:
        raise ValueError("--use-ema: the checkpoint holds no EMA weights (state_dict_ema)")
    return clean_state_dict(ckpt[found] if found else ckpt)


def _source(
    path: Path, num_heads: int | None, use_ema: bool = False
) -> tuple[VisionTransformer, dict[str, Any]]:
    """The source model and the checkpoint's data settings (if any)."""
    ckpt = _read(path)
    if kind_of(ckpt) == FAIRSEQ:  # a translation model
        raise CheckpointError(
            f"{path} is {describe(ckpt)}, not an image model's checkpoint or timm ViT weights"
        )
    if "model_name" in ckpt:
        model = model_from_checkpoint(ckpt)
        if not isinstance(model, VisionTransformer):
            raise ValueError(f"{path} holds a {ckpt['model_name']}, not a ViT-family model")
        if model.layer_attn is not None or model.positions_every_level:
            raise ValueError(f"{path} holds a {ckpt['model_name']} with MRLA or UT positions")
        return model, ckpt.get("data", {})
    weights = timm_weights(ckpt, use_ema)
    try:
        return timm_vit(weights, num_heads), {}
    except ValueError as err:  # weights of something else than a timm ViT
        raise ValueError(f"{path}: {err}") from None


def convert(
    source: Path,
    out: Path,
    *,
    model: str = "deit_tiny_relaxed_patch16_224",
    unique_layers: int | None = None,
    sharing_scheme: str = "cycle",
    init: str = "stepwise",
    level_lora_rank: str | int | None = None,
    num_heads: int | None = None,
    use_ema: bool = False,
    force: bool = False,
) -> tuple[VisionTransformer, dict[str, Any]]:
    """Writes the relaxed model of ``source`` to ``out``; returns it and its keyword arguments.

    Raises:
        FileNotFoundError: no ``source``.
        FileExistsError: ``out`` exists and ``force`` is off.
        KeyError: an unknown ``model``.
        ValueError: a source or setting that cannot be converted (named).
    """
    if out.exists() and not force:
        raise FileExistsError(f"{out} exists; pass --force to replace it")
    teacher, data = _source(source, num_heads, use_ema)
    kwargs = {**vit_settings(teacher), "sharing": sharing_scheme}
    if unique_layers is not None:
        kwargs["unique_layers"] = unique_layers
    flags = {"unique_layers": "--unique-layers", "lora_rank": "--level-lora-rank"}  # keywords
    try:
        if level_lora_rank is not None:  # the stack option's own reading of a rank
            kwargs["lora_rank"] = rank_or_full(level_lora_rank, {"embed_dim": teacher.embed_dim})
        relaxed = create_model(model, **kwargs)
    except ConfigError as err:
        raise err.renamed(flags) from None
    if not isinstance(relaxed, VisionTransformer):
        raise ValueError(f"--model={model!r} is not a ViT-family model")
    own = {k: v for k, v in teacher.state_dict().items() if not k.startswith("stack.")}
    relaxed.load_state_dict(own, strict=False)
    try:
        kept, whole = relax_stack(teacher.stack, relaxed.stack, init)
    except ValueError as err:  # a part of the target's levels no source layer holds
        raise ValueError(f"--model={model}: {err}") from None
    difference, scale = logit_difference(teacher, relaxed)
    if kwargs.get("lora_rank") == teacher.embed_dim and difference > 1e-4 * scale:
        raise ValueError(
            f"--model={model} cannot compute the source at --level-lora-rank=full (max logit "
            f"difference {difference:.3g} on random images): a part of its levels that no "
            "LoRA reaches differs from the source's layers"
        )
    payload = {"model_name": model, "model_kwargs": kwargs, "model": relaxed.state_dict()}
    save_checkpoint(out, {**payload, "epoch": 0, **({"data": data} if data else {})})
    return Conversion(relaxed.eval(), kwargs, difference, kept / whole if whole > 0 else 1.0)


class Conversion(NamedTuple):
    """What :func:`convert` wrote: the relaxed model, its keyword arguments, the largest
    difference of its logits from the source's on a few random images, and the share of the
    energy of the levels' differences from their blocks that the LoRAs keep (squared singular
    values: 1 at full rank)."""

    model: VisionTransformer
    kwargs: dict[str, Any]
    max_logit_difference: float
    energy_kept: float


@torch.no_grad()
def logit_difference(teacher: VisionTransformer, model: VisionTransformer) -> tuple[float, float]:
    """The largest difference between two models' logits (or features, without a head) on 4
    random images in evaluation mode, and the teacher's largest logit (at least 1)."""
    gen = torch.Generator().manual_seed(0)
    images = torch.randn(4, teacher.in_chans, *teacher.img_size, generator=gen)
    want = teacher.eval()(images).float()
    got = model.eval()(images).float()
    return (got - want).abs().max().item(), max(1.0, want.abs().max().item())


def main(argv: list[str] | None = None) -> Path:
    args = build_parser().parse_args(argv)
    model, kwargs, difference, kept = convert(
        args.source,
        args.out,
        model=args.model,
        unique_layers=args.unique_layers,
        sharing_scheme=args.sharing_scheme,
        init=args.init,
        level_lora_rank=args.level_lora_rank,
        num_heads=args.num_heads,
        use_ema=args.use_ema,
        force=args.force,
    )
    from recurnmt.parameters import count_parameters

    plan, lora = model.stack.plan, model.stack.levels[0].lora
    rank = lora["qkv"].rank if lora is not None else 0
    print(
        f"wrote {args.out}: {args.model}, {plan.num_unique} blocks over {plan.num_levels} "
        f"levels ({args.init} init, LoRA rank {rank}), {count_parameters(model):,} "
        f"parameters\nthe LoRAs keep {kept:.1%} of the energy of the levels' differences from "
        f"their blocks; max logit difference from the source {difference:.3g} on random "
        f"images\nfine-tune with python -m recurnmt.vision.training.train --finetune {args.out}"
    )
    return args.out


cli = entry_point(main, PROG)

if __name__ == "__main__":
    sys.exit(cli())
