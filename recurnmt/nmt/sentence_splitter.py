"""A rule-based sentence splitter in MiniSBD's model format, for Argos Translate packages offline.

Argos Translate 1.11 splits a paragraph into sentences before it translates them. With its
default settings it runs MiniSBD (``argostranslate/sbd.py``), whose model for the source language
is downloaded on first use unless the package carries one: an ``.onnx`` file in the package's
``minisbd/`` folder. MiniSBD (``minisbd/inference.py``, ``minisbd/modules/``) runs that file as
an ONNX graph from two inputs to one output:

* ``units``: int64 ``B x T``, the ids of the paragraph's characters in the vocabulary stored in
  the file's metadata (``<PAD>`` is 0, ``<UNK>`` 1);
* ``features``: float ``B x T x F``, per-character features (none here: ``F = 0``);
* out: ``B x T x C`` scores; the arg-max per character is 0 (inside a token), 1 (the token ends
  here) or 2 (the sentence ends here).

This module writes such a file without a learned model: a character ends its sentence when it is
one of :data:`SENTENCE_END` and the next is a space or the end of the paragraph, and ends its
token when the next is a space. So ``Klicken Sie auf OK. Dann ...`` splits after ``OK.``, and an
abbreviation followed by a space (``z. B.``) splits too: where that matters, MiniSBD's learned
model of the language (``de.onnx`` of MiniSBD's releases) can be given to ``recurnmt-export-argos
--splitter`` instead.

The graph (ONNX opset 13, one lookup table per rule, no learned weight)::

    next   = Slice(Pad(units, end + 1), 1:)          # B x T: the following character, <PAD> last
    space  = Gather(IS_SPACE_OR_PAD, next)           # B x T: 1 where a token ends
    stop   = Gather(IS_SENTENCE_END, units) * space  # B x T: 1 where a sentence ends
    scores = Gather(EYE_3, space + stop)             # B x T x 3

The file is written as ONNX's protobuf messages directly (``onnx.proto``: ModelProto, GraphProto,
NodeProto, TensorProto, ValueInfoProto), so writing it needs neither the ``onnx`` package nor
onnxruntime; the metadata holds what MiniSBD reads (``config``, ``vocab``, ``lexicon``).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

SENTENCE_END = ".!?\u2026"  # . ! ? and the ellipsis
SPACE = " "  # MiniSBD turns every whitespace character into a space before the lookup
UNITS = ["<PAD>", "<UNK>", SPACE, *SENTENCE_END]  # the vocabulary: every other character is <UNK>
OPSET = 13
IR_VERSION = 7  # the IR of opset 13 (ONNX 1.8), which every onnxruntime MiniSBD takes reads

# onnx.proto's TensorProto.DataType
FLOAT, INT64 = 1, 7


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, value: bytes | str | int) -> bytes:
    """One protobuf field: a varint for an int, else length-delimited bytes."""
    if isinstance(value, int):
        return _varint(number << 3) + _varint(value)
    data = value.encode("utf-8") if isinstance(value, str) else value
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def _tensor(name: str, dims: list[int], data_type: int, values: list[float] | list[int]) -> bytes:
    fmt = {FLOAT: "<f", INT64: "<q"}[data_type]
    raw = b"".join(struct.pack(fmt, v) for v in values)
    dims_fields = b"".join(_field(1, d) for d in dims)
    return dims_fields + _field(2, data_type) + _field(8, name) + _field(9, raw)


def _value_info(name: str, data_type: int, dims: list[str]) -> bytes:
    shape = b"".join(_field(1, _field(2, d)) for d in dims)  # Dimension.dim_param
    tensor_type = _field(1, data_type) + _field(2, shape)
    return _field(1, name) + _field(2, _field(1, tensor_type))


def _node(op_type: str, inputs: list[str], outputs: list[str]) -> bytes:
    fields = [_field(1, i) for i in inputs] + [_field(2, o) for o in outputs]
    return b"".join(fields) + _field(3, outputs[0]) + _field(4, op_type)


def graph_bytes() -> bytes:
    """The serialized GraphProto of the splitter (module docstring)."""
    ids = {unit: i for i, unit in enumerate(UNITS)}
    space_or_pad = [1 if unit in ("<PAD>", SPACE) else 0 for unit in UNITS]
    sentence_end = [1 if unit in SENTENCE_END else 0 for unit in UNITS]
    initializers = [
        _tensor("pads", [4], INT64, [0, 0, 0, 1]),  # one <PAD> (id 0) after the last character
        _tensor("one", [1], INT64, [1]),
        _tensor("to_end", [1], INT64, [2**62]),
        _tensor("time_axis", [1], INT64, [1]),
        _tensor("is_space_or_pad", [len(UNITS)], INT64, space_or_pad),
        _tensor("is_sentence_end", [len(UNITS)], INT64, sentence_end),
        _tensor("eye", [3, 3], FLOAT, [1.0 if r == c else 0.0 for r in range(3) for c in range(3)]),
    ]
    assert ids["<PAD>"] == 0  # the padding value of Pad
    nodes = [
        _node("Pad", ["units", "pads"], ["padded"]),
        _node("Slice", ["padded", "one", "to_end", "time_axis"], ["next"]),
        _node("Gather", ["is_space_or_pad", "next"], ["token_end"]),
        _node("Gather", ["is_sentence_end", "units"], ["stop_char"]),
        _node("Mul", ["stop_char", "token_end"], ["sentence_end"]),
        _node("Add", ["token_end", "sentence_end"], ["label"]),
        _node("Gather", ["eye", "label"], ["scores"]),
    ]
    return b"".join(
        [
            *(_field(1, n) for n in nodes),
            _field(2, "recurnmt_rule_sbd"),
            *(_field(5, t) for t in initializers),
            _field(11, _value_info("units", INT64, ["batch", "time"])),
            _field(11, _value_info("features", FLOAT, ["batch", "time", "features"])),
            _field(12, _value_info("scores", FLOAT, ["batch", "time", "classes"])),
        ]
    )


def metadata(lang: str) -> dict[str, str]:
    """What MiniSBD reads from the file's metadata: the tokenizer's settings, the vocabulary
    (stanza's ``Vocab.state_dict``), no lexicon."""
    config = {"feat_funcs": [], "use_dictionary": False, "num_dict_feat": 0, "max_seqlen": 1000}
    vocab = {
        "lang": lang, "idx": 0, "cutoff": 0, "lower": False,
        "_unit2id": {unit: i for i, unit in enumerate(UNITS)}, "_id2unit": UNITS,
    }  # fmt: skip
    return {
        "lang_code": lang,
        "config": json.dumps(config),
        "vocab": json.dumps(vocab),
        "lexicon": "null",
    }


def model_bytes(lang: str) -> bytes:
    """The serialized ModelProto of the splitter for language ``lang``."""
    opset = _field(1, "") + _field(2, OPSET)
    props = [_field(1, k) + _field(2, v) for k, v in metadata(lang).items()]
    return b"".join(
        [
            _field(1, IR_VERSION),
            _field(2, "recurnmt"),
            _field(7, graph_bytes()),
            _field(8, opset),
            *(_field(14, p) for p in props),
        ]
    )


def write(path: Path, lang: str) -> Path:
    """Writes the splitter for ``lang`` to ``path`` (an ``.onnx`` file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model_bytes(lang))
    return path
