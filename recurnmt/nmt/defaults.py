"""Defaults of the translation architectures: one table, filled in one pass.

An architecture is a family (how levels share weights) at a size (widths and depth):
``ringformer_wmt_en_de`` is the ``ringformer`` family at the ``wmt_en_de`` size, and a bare
family name (``ringformer``) means the ``wmt_en_de`` size. Sizes are fairseq's standard
transformer sizes; RingFormer A.1 uses ``wmt_en_de`` and ``wmt_en_de_big``.

A setting takes the first value given by, in order:

1. the command line (or the arguments saved in a checkpoint);
2. :data:`FAMILY_SIZE`, a family's exceptions at one size (SReT's depth at ``tiny``);
3. :data:`FAMILY_FLAGS`, what makes the family (RingFormer's shared block and level
   signals): :data:`recurnmt.modules.families.FAMILIES` as flag defaults, and
   :data:`FAMILY_MODEL`;
4. :data:`SIZES`;
5. :data:`BASE`, every recurnmt option: a vanilla Transformer built from our blocks (derived
   from the options' declarations, :mod:`recurnmt.nmt.flags`);
6. fairseq's transformer ``base_architecture``, for fairseq's own options.

:func:`fill_defaults` fills only what is unset, so a second run changes nothing: fairseq runs
the architecture function when it parses the command line and again when it builds the
model (also from a checkpoint's saved arguments, where options added since are unset).

Options that changed what an existing architecture builds (:data:`LEGACY`: the RingFormer
authors' choices of issue 29) take, in the saved arguments of a checkpoint trained before they
existed, the value that checkpoint was trained with (see :func:`_saved_by_older_recurnmt`),
so that it still loads and computes what it did.
"""

from __future__ import annotations

from typing import Any

from fairseq.models.transformer.transformer_legacy import base_architecture

from recurnmt.modules import ConfigError
from recurnmt.modules.families import FAMILIES
from recurnmt.nmt.flags import flag_values, recurnmt_defaults
from recurnmt.nmt.registry import RECURRENT_CRITERION

Defaults = dict[str, Any]

# every recurnmt option: a stack option's field default, as its flag spells it, and the model
# flags' (recurnmt.nmt.flags); a vanilla Transformer built from our blocks
BASE: Defaults = recurnmt_defaults()

# what a model saved before these options existed was built with (issue 29)
LEGACY: Defaults = {
    "block_bias": "on",
    "level_signal_down_init": "kaiming",  # no effect on a loaded model, recorded all the same
    "scale_embedding": "on",
}


def _size(embed: int, ffn: int, heads: int, levels: int = 6, **extra: Any) -> Defaults:
    sides = dict(embed_dim=embed, ffn_embed_dim=ffn, attention_heads=heads, layers=levels)
    return {f"{side}_{k}": v for side in ("encoder", "decoder") for k, v in sides.items()} | extra


SIZES: dict[str, Defaults] = {
    "tiny": _size(64, 128, 4, levels=3),
    "iwslt_de_en": _size(512, 1024, 4),
    "wmt_en_de": _size(512, 2048, 8),
    "wmt_en_de_big": _size(1024, 4096, 16, dropout=0.3),
}
DEFAULT_SIZE = "wmt_en_de"  # the size of a bare family name

# what a family needs of the translation model beyond its stacks
FAMILY_MODEL: dict[str, Defaults] = {
    # SReT for translation (Table 9 setting) ties the decoder's input and output embeddings
    "sret": {"share_decoder_input_output_embed": True},
}


def family_defaults(name: str) -> Defaults:
    """The flag defaults of the family ``name`` (:data:`recurnmt.modules.families.FAMILIES`,
    both sides), and its :data:`FAMILY_MODEL` settings; a family that halts (ACT) trains with
    the recurrent criterion, which adds the ponder cost.

    Raises:
        ValueError: the family sets an option per side that one flag sets for both.
    """
    family = FAMILIES[name]
    out: Defaults = {}
    for side in ("encoder", "decoder"):
        for arg, value in flag_values(family.changes(side == "decoder"), side).items():
            if out.get(arg, value) != value:
                raise ValueError(f"family {name}: --{arg} differs between the sides")
            out[arg] = value
    if family.options.get("act"):
        out["criterion"] = RECURRENT_CRITERION
    return out | FAMILY_MODEL.get(name, {})


FAMILY_FLAGS: dict[str, Defaults] = {name: family_defaults(name) for name in FAMILIES}

# a family's settings at one size, where they differ from the family's own
FAMILY_SIZE: dict[tuple[str, str], Defaults] = {
    ("sret", "tiny"): {
        "encoder_unique_layers": 2,
        "decoder_unique_layers": 2,
        "encoder_layers": 4,
        "decoder_layers": 4,
    },
    # three levels: one block looped three times
    ("relaxed_transformer", "tiny"): {"encoder_unique_layers": 1, "decoder_unique_layers": 1},
}

# every architecture name -> (family, size)
ARCHS: dict[str, tuple[str, str]] = {
    name: (family, size)
    for family in FAMILIES
    for name, size in [(family, DEFAULT_SIZE)] + [(f"{family}_{s}", s) for s in SIZES]
}


def fill_defaults(args: Any, family: str, size: str) -> None:
    """Gives every unset setting of ``args`` its default for ``family`` at ``size``.

    Args:
        args: fairseq's arguments (an ``argparse.Namespace`` or an OmegaConf config);
            settings already given (not None) are kept.
        family: a key of :data:`FAMILY_FLAGS`.
        size: a key of :data:`SIZES`.
    """
    if _saved_by_older_recurnmt(args):
        for name, value in LEGACY.items():
            if name not in args:
                setattr(args, name, value)
    layers = (FAMILY_SIZE.get((family, size), {}), FAMILY_FLAGS[family], SIZES[size], BASE)
    # the A.1 layout unties the head, so a family's tied head (SReT) does not apply to it
    untied = bool(getattr(args, "share_encoder_decoder_embeddings", False))
    for defaults in layers:
        for name, value in defaults.items():
            if untied and name == "share_decoder_input_output_embed":
                continue
            if getattr(args, name, None) is None:
                setattr(args, name, value)
    base_architecture(args)


def _saved_by_older_recurnmt(args: Any) -> bool:
    """``args`` are the saved configuration of a model trained before some :data:`LEGACY`
    option existed.

    fairseq names the model of every configuration it builds or saves (``_name``, set when
    it turns the parsed command line into its config), after the architecture has filled every
    option of the time; so a named configuration without a LEGACY key was saved without it. A
    command line being parsed has no ``_name`` yet, and fairseq leaves its unset model options
    out altogether (``argparse.SUPPRESS``), so their absence means nothing there.
    """
    return "_name" in args and any(name not in args for name in LEGACY)


def fill_arch_defaults(args: Any) -> None:
    """:func:`fill_defaults` for the architecture that ``args`` names (``--arch``).

    Raises:
        ConfigError: ``args`` names no recurnmt architecture.
    """
    arch = getattr(args, "arch", None) or getattr(args, "_name", None)
    if arch not in ARCHS:
        raise ConfigError("--arch", arch, "is not a recurnmt translation architecture")
    fill_defaults(args, *ARCHS[arch])
