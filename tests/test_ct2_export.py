"""``recurnmt-export-ct2``: every family whose evaluation is a standard Transformer level by
level decodes in CTranslate2 as in fairseq's generator (greedy, token for token); the others
are refused naming the part; plain sharing is stored once. The trained models on real text,
through fairseq-generate, are in ``tests/test_ct2_export_e2e.py``."""

from __future__ import annotations

import pytest
import torch
from fairseq.sequence_generator import SequenceGenerator

from recurnmt.nmt import ct2_export
from tests.nmt_helpers import DICT, build

ctranslate2 = pytest.importorskip("ctranslate2")  # the [deploy] extra: in the locked .venv

SIZES = [
    "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
    "--encoder-ffn-embed-dim", "48", "--decoder-ffn-embed-dim", "48",
    "--encoder-layers", "3", "--decoder-layers", "3",
    "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
]  # fmt: skip
PRE_LN = ["--encoder-normalize-before", "--decoder-normalize-before"]


class _Task:
    source_dictionary = target_dictionary = DICT


def _trained(model):
    """Every weight a value of its own (signals, LoRAs, norms and biases too), as training
    gives them, so that a part left out shows in the outputs."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            is_gain = "norm" in name and name.endswith("weight")
            p.normal_(mean=1.0 if is_gain else 0.0, std=0.3 if is_gain else 0.25)
    return model.eval()


def _sources(n: int = 6, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(DICT.nspecial, len(DICT), (int(k),), generator=gen)
            for k in torch.randint(3, 10, (n,), generator=gen)]  # fmt: skip


def _fairseq_greedy(model, sources, max_len: int) -> list[list[str]]:
    generator = SequenceGenerator([model], DICT, beam_size=1, max_len_a=0, max_len_b=max_len)
    out = []
    for src in sources:
        tokens = torch.cat([src, torch.tensor([DICT.eos()])])[None]
        sample = {
            "net_input": {"src_tokens": tokens, "src_lengths": torch.tensor([tokens.numel()])}
        }
        with torch.no_grad():
            hypo = generator.generate([model], sample)[0][0]["tokens"]
        out.append([DICT[t] for t in hypo.tolist() if t != DICT.eos()])
    return out


def _ct2_greedy(path, sources, max_len: int, **kwargs) -> list[list[str]]:
    translator = ctranslate2.Translator(str(path), intra_threads=1, **kwargs)
    batch = [[DICT[t] for t in src.tolist()] for src in sources]
    results = translator.translate_batch(batch, beam_size=1, max_decoding_length=max_len)
    return [r.hypotheses[0] for r in results]


def _export(model, path):
    return ct2_export.write(model, _Task, path)


EXACT = {
    "transformer": [],  # fairseq's own, post-LN, through CTranslate2's fairseq functions
    "transformer-pre": ["--arch", "transformer", *PRE_LN, "--share-all-embeddings"],
    "recurrent_transformer": ["--encoder-unique-layers", "1", "--decoder-unique-layers", "1"],
    "ringformer": ["--level-signal-rank", "4"],
    "ringformer-before": ["--arch", "ringformer", "--attn-signal", "before"],
    "ringformer-inter": ["--arch", "ringformer", "--ffn-signal", "inter"],
    "relaxed_transformer": ["--encoder-unique-layers", "1", "--decoder-unique-layers", "2"],
    "recurrent_transformer-post": [
        "--arch",
        "recurrent_transformer",
        "--activation-fn",
        "gelu",
        "--sharing-scheme",
        "sequence",
    ],  # fmt: skip
    "owf": [*PRE_LN],
}


@pytest.mark.parametrize("case", EXACT)
def test_ctranslate2_decodes_greedily_as_fairseqs_generator(tmp_path, case):
    flags = list(EXACT[case])
    arch = flags.pop(flags.index("--arch") + 1) if "--arch" in flags else case
    if "--arch" in flags:
        flags.remove("--arch")
    model = _trained(build(arch, *SIZES, *flags)[0])
    sources = _sources()
    path = _export(model, tmp_path / "ct2")
    want = _fairseq_greedy(model, sources, max_len=12)
    got = _ct2_greedy(path, sources, max_len=12)
    assert got == want


REFUSED = {
    "universal_transformer": "positions added at every level",
    "universal_transformer_act": "halting per token (ACT)",
    "sret": "SReT",
}
UNIQUE = ["--encoder-unique-layers", "1", "--decoder-unique-layers", "1"]


@pytest.mark.parametrize("arch", REFUSED)
def test_what_ctranslate2_cannot_hold_is_refused_naming_the_part(arch):
    model = build(arch, *SIZES, *(UNIQUE if arch == "sret" else []))[0].eval()
    with pytest.raises(ValueError, match="CTranslate2 has no place for") as err:
        ct2_export.model_spec(model, _Task)
    assert REFUSED[arch] in str(err.value)


def test_levels_that_share_a_block_are_stored_once(tmp_path):
    shared = _trained(build("recurrent_transformer", *SIZES, "--encoder-unique-layers", "1",
                            "--decoder-unique-layers", "1")[0])  # fmt: skip
    unshared = _trained(build("recurrent_transformer", *SIZES)[0])
    sizes = {}
    for name, model in (("shared", shared), ("unshared", unshared)):
        sizes[name] = (_export(model, tmp_path / name) / "model.bin").stat().st_size
        params = sum(p.numel() for p in model.parameters()) * 4  # unique, float32
        positions = model.encoder.embed.embed_positions.weights.numel() * 4  # a table, stored once
        if name == "shared":
            assert sizes[name] <= 1.2 * params + positions
    assert sizes["shared"] < 0.75 * sizes["unshared"]


def test_the_command_keeps_an_existing_directory(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("RECURNMT_TRACEBACK", raising=False)
    (tmp_path / "out").mkdir()
    assert ct2_export.cli([str(tmp_path / "model.pt"), str(tmp_path / "out")]) == 2
    assert "out exists; pass --force" in capsys.readouterr().err
