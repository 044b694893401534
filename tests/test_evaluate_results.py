"""The results table and bar chart across architectures, from evaluation JSON files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from recurnmt.experiments import results
from recurnmt.experiments.results import load_results, markdown_table, split_arch

SIG = "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0"


def write(root: Path, name: str, arch: str, dataset: str, bleu: float, **extra) -> Path:
    path = root / name / "result.json"
    path.parent.mkdir(parents=True)
    record = {
        "name": name,
        "arch": arch,
        "dataset": dataset,
        "sacrebleu": {"score": bleu, "signature": extra.pop("signature", SIG)},
        "tokenized_bleu": {"score": bleu + 0.5, "compound_split": dataset == "wmt14"},
        "params": {"p_star": extra.pop("p_star", 8_940_000)},
        **extra,
    }
    path.write_text(json.dumps(record))
    return path


def test_split_arch():
    assert split_arch("ringformer_wmt_en_de_big") == ("ringformer", "wmt_en_de_big")
    assert split_arch("universal_transformer_act_iwslt_de_en") == (
        "universal_transformer_act",
        "iwslt_de_en",
    )
    assert split_arch("transformer_vaswani_wmt_en_de_big") == (
        "transformer",
        "vaswani_wmt_en_de_big",
    )
    assert split_arch("ringformer") == ("ringformer", "base")


def test_table_rows_columns_and_signatures(tmp_path):
    write(tmp_path, "ringformer_wmt14", "ringformer_wmt_en_de", "wmt14", 26.1)
    write(tmp_path, "transformer_wmt14", "transformer_wmt_en_de", "wmt14", 27.3, p_star=44_050_000)
    write(tmp_path, "sret_iwslt14", "sret_iwslt_de_en", "iwslt14", 35.2)
    table = markdown_table(load_results([tmp_path]))
    lines = table.splitlines()
    assert lines[0].startswith("| model | IWSLT14 De-En (iwslt_de_en) sacreBLEU")
    assert "WMT14 En-De (wmt_en_de) sacreBLEU" in lines[0]
    rows = [line.split(" | ")[0].strip("| ") for line in lines[2:5]]
    assert rows == ["transformer", "ringformer", "sret"]  # baselines first
    assert "| transformer |  |  |  | 27.30 | 27.80ᶜ | 44.05 |" in table
    assert "| sret | 35.20 | 35.70 | 8.94 |  |  |  |" in table
    assert f"- WMT14 En-De (wmt_en_de): `{SIG}`" in table


def test_differing_signatures_and_duplicates_are_flagged(tmp_path):
    write(tmp_path, "a", "ringformer_wmt_en_de", "wmt14", 26.1)
    write(tmp_path, "b", "owf_wmt_en_de", "wmt14", 25.0, signature=SIG.replace("13a", "intl"))
    assert "not comparable" in markdown_table(load_results([tmp_path]))
    write(tmp_path, "c", "ringformer_wmt_en_de", "wmt14", 26.5)
    with pytest.raises(ValueError, match="two results for ringformer"):
        markdown_table(load_results([tmp_path]))


def test_command_line_writes_markdown_and_png(tmp_path, capsys):
    write(tmp_path, "r", "ringformer_wmt_en_de", "wmt14", 26.1)
    write(tmp_path, "u", "universal_transformer_iwslt_de_en", "iwslt14", 33.0)
    md, png = tmp_path / "out" / "results.md", tmp_path / "out" / "results.png"
    assert results.main([str(tmp_path), "--markdown", str(md), "--png", str(png)]) == 0
    assert "| ringformer |" in md.read_text()
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (tmp_path / "empty").mkdir()
    assert results.cli([str(tmp_path / "empty")]) == 2
    assert "no result.json" in capsys.readouterr().err
    assert results.cli([str(tmp_path / "missing")]) == 2
    assert "No such file" in capsys.readouterr().err


def test_every_family_is_in_the_tables_and_benchmarks_order():
    """The results table, the NMT benchmark and the decoding profiler take their families from
    family_order(): fairseq's transformer, then recurnmt.modules.FAMILIES in their order."""
    from recurnmt.experiments.results import family_order
    from recurnmt.modules import FAMILIES

    assert family_order() == ("transformer", *FAMILIES)


def test_a_new_family_reaches_the_tools_from_its_entry_alone(monkeypatch, tmp_path):
    """Adding a family is an entry in recurnmt/modules/families.py: the results table orders
    and titles it, the comparison script accepts it and titles it, and the size flags run its
    levels as its own loop count of blocks."""
    import importlib.util
    from types import SimpleNamespace

    from recurnmt.experiments import results
    from recurnmt.experiments.experiment import size_flags
    from recurnmt.modules import FAMILIES, Family

    new = Family({"num_unique": 2, "num_levels": 6, "sharing": "sequence"}, title="Loop Three")
    monkeypatch.setitem(FAMILIES, "loop_three", new)
    assert results.family_order()[-1] == "loop_three"
    assert results.family_title("loop_three") == "Loop Three"
    assert results.family_title("transformer") == "fairseq's transformer"
    rows = [{"family": f} for f in ("loop_three", "ringformer", "transformer")]
    assert results._families(rows) == ["transformer", "ringformer", "loop_three"]
    size = SimpleNamespace(embed_dim=16, ffn_dim=32, heads=2, levels=6)
    flags = size_flags(size, "loop_three")
    assert flags[flags.index("--decoder-unique-layers") + 1] == "2"  # 3 loops of 2 blocks
    assert "--decoder-unique-layers" not in size_flags(size, "ringformer")
    sret = size_flags(size, "sret_iwslt_de_en")  # SReT's two loops, at any size suffix
    assert sret[sret.index("--encoder-unique-layers") + 1] == "3"

    spec = importlib.util.spec_from_file_location("compare_nmt", "scripts/compare_nmt.py")
    compare = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(compare)
    args = compare.build_parser().parse_args(["--archs", "loop_three"])
    assert args.archs == ["loop_three"]
    args.argv = ["--archs", "loop_three"]
    row = {"arch": "loop_three", "p_star": 1e6, "bleu": 1.0, "chrf": 2.0, "valid_ppl": None,
           "train": {}, "train_seconds": 60, "sentences_per_second": 3.0, "test_sentences": 9,
           "bleu_signature": "sig"}  # fmt: skip
    table = compare.markdown([row], args, tmp_path / "plot.png")
    assert "| Loop Three | `loop_three` |" in table
