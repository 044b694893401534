"""The families are declared once (recurnmt.modules.families) and every front end applies them."""

from __future__ import annotations

import pytest

from recurnmt.modules import FAMILIES, Family, StackConfig
from recurnmt.nmt import defaults
from recurnmt.nmt.registry import RECURRENT_CRITERION
from tests.nmt_helpers import build
from tests.test_vision_models import build_small

# the translation families as nmt/defaults.py wrote them, in flags, before they were derived
_UT = {
    "encoder_unique_layers": 1,
    "decoder_unique_layers": 1,
    "layer_norms": "per-block",
    "level_signal": "static",
    "positions": "every-level",
    "activation_fn": "gelu",
}
WRITTEN_IN_FLAGS = {
    "ringformer": {
        "encoder_unique_layers": 1,
        "decoder_unique_layers": 1,
        "layer_norms": "per-level",
        "level_signal": "lowrank",
        "attn_signal": "after",
        "ffn_signal": "input",
        "activation_fn": "gelu",
        "block_bias": "off",
    },
    "recurrent_transformer": {},
    "universal_transformer": _UT,
    "universal_transformer_act": _UT | {"act": "on", "criterion": RECURRENT_CRITERION},
    "owf": {
        "encoder_ffn_sharing": "shared",
        "decoder_ffn_sharing": "none",
        "level_signal": "none",
        "activation_fn": "gelu",
    },
    "sret": {
        "encoder_unique_layers": 6,
        "decoder_unique_layers": 6,
        "encoder_layers": 12,
        "decoder_layers": 12,
        "sharing_scheme": "sequence",
        "nll_ratio": 1.0,
        "lrc": "both",
        "share_decoder_input_output_embed": True,
    },
    "relaxed_transformer": {
        "encoder_unique_layers": 3,
        "decoder_unique_layers": 3,
        "sharing_scheme": "cycle",
        "layer_norms": "per-level",
        "level_lora_rank": "16",
    },
}


def test_translation_families_are_the_modules_families_in_flags():
    assert list(defaults.FAMILY_FLAGS) == list(FAMILIES)
    assert defaults.FAMILY_FLAGS == WRITTEN_IN_FLAGS


def test_a_family_names_options_only():
    with pytest.raises(ValueError, match="no stack options"):
        Family({"num_blocks": 2})


def test_a_decoder_gets_the_familys_decoder_changes():
    encoder = FAMILIES["owf"].apply(StackConfig.from_options(embed_dim=64, num_heads=4))
    decoder = FAMILIES["owf"].apply(
        StackConfig.from_options(embed_dim=64, num_heads=4, cross_attention=True, causal=True)
    )
    assert (encoder.block.ffn_sharing, decoder.block.ffn_sharing) == ("shared", "none")


@pytest.mark.parametrize(
    ("arch", "vit", "family"),
    [
        ("ringformer_tiny", "ringformer_vit_mini_patch4", "ringformer"),
        ("universal_transformer_tiny", "uit_mini_patch4", "universal_transformer"),
        ("owf_tiny", "owf_vit_mini_patch4", "owf"),
        ("relaxed_transformer_tiny", "relaxed_vit_mini_patch4", "relaxed_transformer"),
    ],
)
def test_translation_and_image_stacks_of_a_family_agree_on_its_options(arch, vit, family):
    """What the family sets is the same in both front ends; the ViT's own deviations (the
    RingFormer authors' image code keeps its biases; a mini model's own rank and blocks) are
    written next to the model, and nothing else differs."""
    own = {"ringformer": {"bias", "signal.rank"}, "relaxed_transformer": {"lora_rank"}}
    nmt = build(arch)[0].encoder.stack_cfg.options()
    image = build_small(vit).stack_cfg.options()
    changes = FAMILIES[family].changes()
    for name in set(changes) - own.get(family, set()) - {"num_unique"}:
        assert nmt[name] == image[name] == changes[name], name
