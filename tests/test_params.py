"""P* (RingFormer Table 1 / Table 4) reproduced from the built models."""

from __future__ import annotations

import pytest

from recurnmt.analysis.params import main
from recurnmt.parameters import parameter_report
from tests.nmt_helpers import build


def _p_star(arch: str, *flags: str) -> int:
    return parameter_report(build(arch, *flags)[0]).p_star


@pytest.mark.parametrize(
    ("arch", "paper"),
    [
        ("ringformer_wmt_en_de", 8.94e6),  # RingFormer Table 1, 512/2048
        ("ringformer_wmt_en_de_big", 35.71e6),  # RingFormer Table 1, 1024/4096
        ("recurrent_transformer_wmt_en_de", 44.05e6),  # vanilla, Table 1
        ("recurrent_transformer_wmt_en_de_big", 176.18e6),
        ("transformer_wmt_en_de", 44.05e6),  # fairseq's own transformer
    ],
)
def test_table1_parameter_counts(arch, paper):
    assert _p_star(arch) == pytest.approx(paper, rel=0.01)


TABLE4 = (
    "--encoder-embed-dim",
    "128",
    "--decoder-embed-dim",
    "128",
    "--encoder-ffn-embed-dim",
    "512",
    "--decoder-ffn-embed-dim",
    "512",
)


@pytest.mark.parametrize(
    ("flags", "paper"),
    [
        (("--level-signal-rank", "4"), 0.51e6),  # H/32
        ((), 0.56e6),  # H/16, the default
        (("--level-signal-rank", "16"), 0.66e6),  # H/8
        (("--level-signal", "full"), 1.25e6),  # full-rank signal
    ],
)
def test_table4_rank_variants(flags, paper):
    # Table 4 figures are rounded to two decimals, hence 2 %
    assert _p_star("ringformer_wmt_en_de", *TABLE4, *flags) == pytest.approx(paper, rel=0.02)


def test_embeddings_and_head_are_excluded():
    model, _, _ = build("ringformer_tiny")
    report = parameter_report(model)
    vocab = len(model.decoder.dictionary)
    assert report.embeddings == 2 * vocab * 64  # separate encoder and decoder embeddings
    assert report.output_projection == vocab * 64
    tied = parameter_report(build("ringformer_tiny", "--share-all-embeddings")[0])
    assert tied.embeddings == vocab * 64 and tied.output_projection == 0
    assert tied.p_star == report.p_star


def test_command_prints_table(capsys):
    main(["ringformer_tiny", "--", "--level-signal-rank", "2"])
    out = capsys.readouterr().out
    assert "ringformer_tiny" in out and "P*" in out
