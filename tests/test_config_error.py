"""ConfigError carries the setting, its value and the reason; callers rename settings."""

from __future__ import annotations

import pickle

import pytest

from recurnmt.modules import ConfigError, SignalConfig, StackConfig
from recurnmt.modules.config import option_declarations


def test_message_is_setting_value_reason():
    err = ConfigError("num_levels", 0, "must be a positive integer")
    assert (err.setting, err.value, err.reason) == ("num_levels", 0, "must be a positive integer")
    assert str(err) == "num_levels=0: must be a positive integer"
    assert isinstance(err, ValueError)


def test_related_settings_are_written_out_and_renamed():
    err = ConfigError("num_heads", 5, "does not divide {embed_dim}", {"embed_dim": 32})
    assert str(err) == "num_heads=5: does not divide embed_dim=32"
    flags = {"num_heads": "--encoder-attention-heads", "embed_dim": "--encoder-embed-dim"}
    renamed = err.renamed(flags)
    assert str(renamed) == "--encoder-attention-heads=5: does not divide --encoder-embed-dim=32"
    assert renamed.setting == "--encoder-attention-heads"
    assert renamed.related == {"--encoder-embed-dim": 32}
    assert str(err.renamed({})) == str(err)


def test_braces_that_name_no_related_setting_stay():
    err = ConfigError("groups", (2,), "a set like {a, b} is not {embed_dim}", {"embed_dim": 8})
    assert err.reason == "a set like {a, b} is not embed_dim=8"


def test_a_plain_message_names_no_setting():
    err = ConfigError("something is wrong with {x}")
    assert err.setting is None and err.value is None
    assert str(err) == "something is wrong with {x}"
    assert str(err.renamed({"x": "--x"})) == str(err)
    with pytest.raises(TypeError):
        ConfigError("num_levels", 0)


def test_errors_survive_pickling():
    err = ConfigError("num_heads", 5, "does not divide {embed_dim}", {"embed_dim": 32})
    copy = pickle.loads(pickle.dumps(err))
    assert (copy.setting, copy.value, copy.related, str(copy)) == (
        err.setting,
        err.value,
        err.related,
        str(err),
    )
    plain = pickle.loads(pickle.dumps(ConfigError("plain")))
    assert str(plain) == "plain" and plain.setting is None


@pytest.mark.parametrize(
    ("changes", "setting"),
    [
        ({"num_heads": 5}, "num_heads"),
        ({"num_unique": 9}, "num_unique"),
        ({"signal": SignalConfig(kind="lowrank", rank=0)}, "signal.rank"),
        ({"signal": SignalConfig(attn="sideways")}, "signal.attn"),
        ({"ffn_sharing": "none", "signal": SignalConfig(kind="lowrank")}, "ffn_sharing"),
        ({"level_drop_path": (0.1,)}, "level_drop_path"),
        ({"attention_dropout": 1.0}, "attention_dropout"),
    ],
)
def test_stack_config_errors_name_config_fields(changes, setting):
    """Every name in the error is an option's name, so callers can map it to their own names."""
    fields = set(option_declarations())
    with pytest.raises(ConfigError) as err:
        StackConfig.from_options(**({"embed_dim": 32, "num_heads": 4, "num_levels": 4} | changes))
    assert err.value.setting == setting
    assert {err.value.setting, *err.value.related} <= fields
