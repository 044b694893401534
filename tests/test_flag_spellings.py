"""Every command-line flag of today keeps its spelling, its parser and its value.

``tests/fixtures/flag_spellings.json`` was written by :func:`spellings` before the stack's
options and the other settings became one declaration system (issue 73): for each parser (the
translation model's flags, both converters, the image trainer and evaluator) every flag's
spellings, argument name and ``add_argument`` settings, and the values that a command line
setting each flag parses to (and, for translation, the stacks it builds). Rewrite it only for a
new flag: ``python -m tests.test_flag_spellings``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

FIXTURE = Path(__file__).parent / "fixtures" / "flag_spellings.json"

# one command line a flag: a value other than its default
TRANSLATION_ARGV = [
    ["--encoder-unique-layers", "1", "--decoder-unique-layers", "3"],
    ["--sharing-scheme", "sequence"],
    ["--block-bias", "off"],
    ["--encoder-ffn-sharing", "shared", "--decoder-ffn-sharing", "none"],
    ["--layer-norms", "per-level"],
    ["--level-signal", "lowrank", "--level-signal-rank", "2"],
    ["--level-signal", "lowrank", "--attn-signal", "before", "--ffn-signal", "inter"],
    ["--level-signal", "lowrank", "--level-signal-down-init", "kaiming"],
    ["--level-signal", "lowrank", "--level-signal-down-std", "0.5"],
    ["--positions", "every-level", "--coordinate-scale", "0.5"],
    ["--lrc", "both", "--nll-ratio", "2"],
    ["--encoder-attn-groups", "2,1"],
    ["--act", "on", "--act-threshold", "0.9", "--act-bias-init", "0.5"],
    ["--act", "on", "--act-rule", "paper"],
    ["--level-lora-rank", "4"],
    ["--level-lora-rank", "full"],
    ["--encoder-layers", "6", "--decoder-layers", "2"],
    ["--encoder-embed-dim", "32", "--decoder-embed-dim", "32"],
    ["--encoder-attention-heads", "2", "--decoder-attention-heads", "8"],
    ["--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "16"],
    ["--encoder-normalize-before", "--decoder-normalize-before"],
    ["--dropout", "0.2", "--attention-dropout", "0.1", "--activation-dropout", "0.3"],
    ["--activation-fn", "gelu"],
    ["--checkpoint-segment", "sqrt", "--checkpoint-activations"],
    ["--mixed-depth"],
    ["--mixed-depth", "on", "--mixed-depth-levels", "2"],
    ["--compile"],
    ["--compile", "aot_eager", "--compile-mode", "max-autotune"],
    [
        "--encoder-unique-layers",
        "1",
        "--encoder-levels",
        "2",
        "--decoder-unique-layers",
        "1",
        "--decoder-levels",
        "1",
    ],
    ["--share-encoder-decoder-embeddings", "--share-all-embeddings"],
    ["--output-projection-bias"],
    ["--scale-embedding", "off"],
]
CONVERTER_ARGV = [
    [],
    ["--unique-layers", "2", "--init", "average", "--level-lora-rank", "full"],
    ["--sharing-scheme", "cycle_rev", "--init", "lower", "--level-lora-rank", "8"],
]
NMT_CONVERTER_ARGV = [
    ["--encoder-unique-layers", "2", "--decoder-unique-layers", "1", "--layer-norms", "per-block"],
]
VISION_TRAIN_ARGV = [
    [],
    ["--compile", "--compile-mode", "reduce-overhead"],
    ["--mixed-depth", "on", "--checkpoint-segment", "2"],
]
EVALUATOR_ARGV = [["ckpt.pt"], ["ckpt.pt", "--encoder-levels", "4"], ["ckpt.pt", "--levels", "3"]]


def _plain(value: Any) -> Any:
    """``value`` as JSON writes and reads it (a function by its name)."""
    if callable(value):
        return getattr(value, "__name__", repr(value))
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def _actions(parser: argparse.ArgumentParser, dests: set[str] | None = None) -> dict[str, Any]:
    """``{dest: add_argument settings}`` of the parser's flags (``dests``: only those)."""
    out = {}
    for a in parser._actions:
        if not a.option_strings or (dests is not None and a.dest not in dests):
            continue
        out[a.dest] = _plain(
            dict(
                flags=a.option_strings,
                kind=type(a).__name__,
                default=a.default,
                choices=a.choices,
                nargs=a.nargs,
                const=a.const,
                type=a.type,
                metavar=a.metavar,
            )
        )
    return out


def _values(args: argparse.Namespace, dests: set[str]) -> dict[str, Any]:
    return {d: _plain(getattr(args, d, "<unset>")) for d in sorted(dests)}


def spellings() -> dict[str, Any]:
    """The parsers' flags and what each command line parses to."""
    from recurnmt.nmt import flags as nmt_flags
    from recurnmt.nmt.build import arch_train_args
    from recurnmt.nmt.convert import build_parser as nmt_converter
    from recurnmt.vision.convert import build_parser as vision_converter
    from recurnmt.vision.training.arguments import parse_args as vision_train
    from recurnmt.vision.training.evaluate import build_parser as vision_evaluator

    group = argparse.ArgumentParser()
    nmt_flags.add_recurrent_args(group)
    ours = {a.dest for a in group._actions if a.option_strings} - {"help"}
    fairseq = {
        f"{side}_{k}"
        for side in ("encoder", "decoder")
        for k in ("layers", "embed_dim", "attention_heads", "ffn_embed_dim", "normalize_before")
    } | {"dropout", "attention_dropout", "activation_dropout", "activation_fn"}
    translation = {}
    for argv in TRANSLATION_ARGV:
        args = arch_train_args("recurrent_transformer_tiny", argv)
        stacks = [s.to_dict() for s in nmt_flags.stack_configs(args)]
        translation[" ".join(argv)] = dict(
            args=_values(args, ours | fairseq), stacks=_plain(stacks)
        )
    out: dict[str, Any] = dict(
        translation_flags=_actions(group),
        translation=translation,
        defaults=_plain(nmt_flags.recurnmt_defaults()),
    )
    for name, build, argvs in [
        ("nmt_converter", nmt_converter, CONVERTER_ARGV + NMT_CONVERTER_ARGV),
        ("vision_converter", vision_converter, CONVERTER_ARGV),
    ]:
        parser = build()
        dests = {a.dest for a in parser._actions if a.option_strings} - {"help"}
        out[name + "_flags"] = _actions(parser)
        out[name] = {
            " ".join(a): _values(parser.parse_args(["a.pt", "b.pt", *a]), dests) for a in argvs
        }
    modes = {"compile", "compile_mode", "mixed_depth", "checkpoint_segment"}
    out["vision_train"] = {" ".join(a): _values(vision_train(a), modes) for a in VISION_TRAIN_ARGV}
    evaluator = vision_evaluator()
    out["vision_evaluator_flags"] = _actions(evaluator, {"encoder_levels"})
    out["vision_evaluator"] = {
        " ".join(a): _values(evaluator.parse_args(a), {"encoder_levels"}) for a in EVALUATOR_ARGV
    }
    return out


def test_every_flag_of_today_parses_as_before():
    want = json.loads(FIXTURE.read_text(encoding="utf-8"))
    got = json.loads(json.dumps(spellings()))
    for key in want:
        assert got[key] == want[key], key
    assert got.keys() == want.keys()


if __name__ == "__main__":
    FIXTURE.write_text(json.dumps(spellings(), indent=1, sort_keys=True) + "\n", encoding="utf-8")
    sys.exit(0)
