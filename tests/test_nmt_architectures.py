"""The architecture table: every family at every size registered, defaults filled in one pass."""

from __future__ import annotations

import argparse
import pickle

import pytest
import torch
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY
from omegaconf import OmegaConf, open_dict

from recurnmt.nmt import RecurrentTransformerModel
from recurnmt.nmt.defaults import (
    ARCHS,
    BASE,
    DEFAULT_SIZE,
    FAMILIES,
    FAMILY_SIZE,
    LEGACY,
    SIZES,
    fill_arch_defaults,
    fill_defaults,
)
from recurnmt.nmt.flags import add_recurrent_args
from tests.nmt_helpers import batch, build


def test_every_family_at_every_size_is_registered():
    ours = {a for a, model in ARCH_MODEL_REGISTRY.items() if model is RecurrentTransformerModel}
    expected = set(FAMILIES) | {f"{f}_{s}" for f in FAMILIES for s in SIZES}
    assert ours == expected == set(ARCHS)
    assert len(ARCHS) == len(FAMILIES) * (len(SIZES) + 1)  # no two names collide
    assert set(FAMILY_SIZE) <= {(f, s) for f in FAMILIES for s in SIZES}
    for arch in ours:
        family, size = ARCHS[arch]
        assert arch in (family, f"{family}_{size}") and (arch != family or size == DEFAULT_SIZE)
        registered, direct = argparse.Namespace(), argparse.Namespace()
        ARCH_CONFIG_REGISTRY[arch](registered)
        fill_defaults(direct, family, size)
        assert registered == direct


def test_base_gives_every_recurnmt_option_a_default():
    parser = argparse.ArgumentParser()
    add_recurrent_args(parser)
    options = {a.dest for a in parser._actions if a.dest != "help"}
    assert options == set(BASE)
    assert all(a.default is None for a in parser._actions if a.dest != "help")


def _filled(family: str, size: str, **given) -> argparse.Namespace:
    args = argparse.Namespace(**given)
    fill_defaults(args, family, size)
    return args


def test_defaults_precedence():
    # a given value beats the family's exception at a size
    assert _filled("sret", "tiny", encoder_layers=5).encoder_layers == 5
    # the exception at a size beats the family
    assert _filled("sret", "tiny").encoder_layers == 4
    # the family beats the size and fairseq
    assert _filled("sret", "wmt_en_de").encoder_layers == 12
    assert _filled("sret", "tiny").share_decoder_input_output_embed is True
    assert _filled("ringformer", "tiny").activation_fn == "gelu"
    # the size beats fairseq's base_architecture
    assert _filled("recurrent_transformer", "wmt_en_de_big").dropout == 0.3
    assert _filled("recurrent_transformer", "wmt_en_de").dropout == 0.1
    # recurnmt's base, then fairseq's
    vanilla = _filled("recurrent_transformer", "tiny")
    assert vanilla.level_signal == "none" and vanilla.encoder_unique_layers is None
    assert vanilla.activation_fn == "relu" and vanilla.share_decoder_input_output_embed is False


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_filling_twice_changes_nothing(arch):
    once = argparse.Namespace(arch=arch, encoder_layers=12)  # a count every family can run
    fill_arch_defaults(once)
    twice = argparse.Namespace(**vars(once))
    fill_arch_defaults(twice)
    ARCH_CONFIG_REGISTRY[arch](twice)
    assert once == twice


def _saved_config(args):
    """The model config as a checkpoint stores and fairseq loads it (checkpoint_utils)."""
    cfg = convert_namespace_to_omegaconf(args)
    stored = pickle.loads(pickle.dumps(OmegaConf.to_container(cfg, resolve=True)))
    return OmegaConf.create(stored, flags={"allow_objects": True}).model


def _forget(cfg, names) -> None:
    """Removes settings from a saved config, as if it came from an older recurnmt."""
    if OmegaConf.is_config(cfg):
        with open_dict(cfg):
            for name in names:
                del cfg[name]
    else:
        for name in names:
            delattr(cfg, name)


@pytest.mark.parametrize(
    ("arch", "forgotten"),
    [
        ("ringformer_tiny", ()),
        ("sret_tiny", ()),
        ("universal_transformer_act_tiny", ()),
        # options added later are filled with the family's defaults, not the base ones
        ("ringformer_tiny", ("level_signal", "layer_norms", "mixed_depth", "lrc")),
        ("sret_tiny", ("nll_ratio", "encoder_unique_layers", "encoder_attn_groups")),
    ],
)
def test_model_rebuilds_from_a_checkpoint_config(arch, forgotten):
    model, args, task = build(arch)
    saved = _saved_config(args)
    _forget(saved, forgotten)
    rebuilt = task.build_model(saved, from_checkpoint=True)
    rebuilt.load_state_dict(model.state_dict(), strict=True)
    for name in forgotten:
        assert getattr(rebuilt.args, name) == getattr(args, name), name
    assert rebuilt.encoder.stack_cfg == model.encoder.stack_cfg
    assert rebuilt.decoder.stack_cfg == model.decoder.stack_cfg
    src, lengths, prev = batch()
    with torch.no_grad():
        torch.testing.assert_close(
            rebuilt.eval()(src, lengths, prev)[0], model.eval()(src, lengths, prev)[0]
        )


# what recurnmt built before issue 29 made RingFormer's defaults its authors' (LEGACY)
BEFORE_ISSUE_29 = ["--block-bias", "on", "--level-signal-down-init", "kaiming"]


@pytest.mark.parametrize("flags", [[], ["--share-all-embeddings"]], ids=["untied", "tied"])
def test_checkpoints_saved_before_the_authors_defaults_keep_their_model(flags):
    """A RingFormer saved with biases (every checkpoint before --block-bias existed) rebuilds
    with them from its saved configuration, loads strictly and computes the same logits."""
    model, args, task = build("ringformer_tiny", *BEFORE_ISSUE_29, *flags)
    saved = _saved_config(args)
    _forget(saved, LEGACY)  # an older recurnmt saved none of them
    rebuilt = task.build_model(saved, from_checkpoint=True)
    assert rebuilt.encoder.stack_cfg == model.encoder.stack_cfg  # biases and init included
    rebuilt.load_state_dict(model.state_dict(), strict=True)
    src, lengths, prev = batch()
    model.eval(), rebuilt.eval()
    with torch.no_grad():
        torch.testing.assert_close(rebuilt(src, lengths, prev)[0], model(src, lengths, prev)[0])
    assert (saved.block_bias, saved.scale_embedding) == ("on", "on")


def test_new_checkpoints_and_command_lines_get_the_authors_defaults():
    """A command line that gives other recurnmt options (fairseq leaves the rest out of its
    arguments) and a configuration saved now both build RingFormer without biases."""
    model, args, task = build("ringformer_tiny", "--level-signal-rank", "4")
    assert not model.encoder.stack_cfg.block.bias and args.block_bias == "off"
    rebuilt = task.build_model(_saved_config(args), from_checkpoint=True)
    assert not rebuilt.decoder.stack_cfg.block.bias
    rebuilt.load_state_dict(model.state_dict(), strict=True)
    assert _filled("ringformer", "tiny", level_signal_rank=4).block_bias == "off"
