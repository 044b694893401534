"""Scoring reproduces sacrebleu and fairseq-score; evaluation commands follow the datasets' norms.

The fixed example is fairseq-generate output for Moses-tokenized WMT14-style German
(``--post-process subword_nmt``, no ``--tokenizer``): ``H``/``D`` lines hold tokenized
hypotheses, ``T`` lines tokenized references, out of order as fairseq prints them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sacrebleu
import torch
from fairseq.data import Dictionary
from fairseq.scoring import bleu as fairseq_bleu

from recurnmt.experiments import scoring
from recurnmt.experiments.evaluation import EvalSettings, evaluation_steps
from recurnmt.experiments.presets import PRESETS
from recurnmt.experiments.scoring import (
    compound_split,
    read_hypotheses,
    read_targets,
    score,
    tokenized_bleu,
)

HYPS_TOK = [
    "Das ist ein 3 @-@ Zimmer @-@ Haus , &quot; sagt &quot; er .",
    "Die Katze sitzt auf der Matte in der Küche .",
    "Er hat ein E @-@ Mail an die Firma geschickt .",
]
REFS_TOK = [
    "Das ist ein 3 @-@ Zimmer @-@ Haus , &quot; sagte &quot; er .",
    "Die Katze saß auf der Matte in der Küche .",
    "Er schickte eine E @-@ Mail an die Firma .",
]
# the same sentences as plain text: what Moses detokenization must give, and the raw references
HYPS_DETOK = [
    'Das ist ein 3-Zimmer-Haus, "sagt" er.',
    "Die Katze sitzt auf der Matte in der Küche.",
    "Er hat ein E-Mail an die Firma geschickt.",
]
REFS_RAW = [
    'Das ist ein 3-Zimmer-Haus, "sagte" er.',
    "Die Katze saß auf der Matte in der Küche.",
    "Er schickte eine E-Mail an die Firma.",
]
# compound splitting written out by hand (fairseq's compound_split_bleu.sh, checked with perl)
HYPS_SPLIT = [
    "Das ist ein 3 @ ##AT##-##AT## @ Zimmer @ ##AT##-##AT## @ Haus , &quot; sagt &quot; er .",
    HYPS_TOK[1],
    "Er hat ein E @ ##AT##-##AT## @ Mail an die Firma geschickt .",
]
REFS_SPLIT = [
    "Das ist ein 3 @ ##AT##-##AT## @ Zimmer @ ##AT##-##AT## @ Haus , &quot; sagte &quot; er .",
    REFS_TOK[1],
    "Er schickte eine E @ ##AT##-##AT## @ Mail an die Firma .",
]


def generate_output() -> list[str]:
    lines = ["2026-01-01 | INFO | fairseq_cli.generate | loading model"]
    for i in (2, 0, 1):  # fairseq prints in batch order
        lines += [
            f"S-{i}\tsource {i}",
            f"T-{i}\t{REFS_TOK[i]}",
            f"H-{i}\t-0.3\t{HYPS_TOK[i]}",
            f"D-{i}\t-0.3\t{HYPS_TOK[i]}",
            f"P-{i}\t-0.1 -0.2",
        ]
    return lines + ["Generate test with beam=4: BLEU4 = 1.00"]


def fairseq_score(sys_lines: list[str], ref_lines: list[str]) -> float:
    """What ``fairseq-score --sys S --ref R`` computes (fairseq_cli/score.py)."""
    d = Dictionary()
    scorer = fairseq_bleu.Scorer(fairseq_bleu.BleuConfig(pad=d.pad(), eos=d.eos(), unk=d.unk()))
    for s, r in zip(sys_lines, ref_lines, strict=True):
        scorer.add(d.encode_line(r), d.encode_line(s))
    return scorer.score()


def test_detokenized_sacrebleu_reproduces_sacrebleu():
    result, hyps = score(generate_output(), REFS_RAW, detok="moses", target_lang="de")
    assert hyps == HYPS_DETOK
    expected = sacrebleu.corpus_bleu(HYPS_DETOK, [REFS_RAW])
    assert result["sacrebleu"]["score"] == round(expected.score, 2)
    assert result["sacrebleu"]["text"] == str(expected)
    metric = sacrebleu.metrics.BLEU()
    metric.corpus_score(HYPS_DETOK, [REFS_RAW])
    signature = str(metric.get_signature())
    assert result["sacrebleu"]["signature"] == signature
    assert "tok:13a" in signature and "case:mixed" in signature
    assert result["n_sentences"] == 3 and result["tokenized_bleu"] is None


def test_lowercased_sacrebleu_says_so_in_the_signature():
    upper = [h.upper() for h in HYPS_DETOK]
    lines = [f"D-{i}\t-1\t{h}" for i, h in enumerate(upper)]
    result, _ = score(lines, REFS_RAW, lowercase=True)
    expected = sacrebleu.corpus_bleu(upper, [REFS_RAW], lowercase=True)
    assert result["sacrebleu"]["score"] == round(expected.score, 2) > 0
    assert "case:lc" in result["sacrebleu"]["signature"]


def test_compound_split_is_perls():
    assert compound_split("3-Zimmer-Haus") == "3 ##AT##-##AT## Zimmer ##AT##-##AT## Haus"
    assert compound_split("a-b-c") == "a ##AT##-##AT## b-c"  # s///g does not overlap
    assert compound_split("-x y- e-mail") == "-x y- e ##AT##-##AT## mail"
    assert [compound_split(h) for h in HYPS_TOK] == HYPS_SPLIT
    assert [compound_split(r) for r in REFS_TOK] == REFS_SPLIT


def test_tokenized_compound_split_bleu_reproduces_sacrebleu_and_fairseq_score():
    got = tokenized_bleu(HYPS_TOK, REFS_TOK, split_compounds=True)
    plain = sacrebleu.metrics.BLEU(tokenize="none", smooth_method="none")
    assert got.score == pytest.approx(plain.corpus_score(HYPS_SPLIT, [REFS_SPLIT]).score)
    assert got.score == pytest.approx(fairseq_score(HYPS_SPLIT, REFS_SPLIT), abs=1e-4)
    # without splitting, the same equality with the unsplit text, and another number
    unsplit = tokenized_bleu(HYPS_TOK, REFS_TOK)
    assert unsplit.score == pytest.approx(fairseq_score(HYPS_TOK, REFS_TOK), abs=1e-4)
    assert unsplit.score != pytest.approx(got.score)


def test_score_reads_h_and_t_lines_for_tokenized_bleu():
    result, _ = score(
        generate_output(),
        REFS_RAW,
        detok="moses",
        target_lang="de",
        with_tokenized=True,
        split_compounds=True,
    )
    tok = result["tokenized_bleu"]
    assert tok["compound_split"] is True
    assert tok["score"] == round(fairseq_score(HYPS_SPLIT, REFS_SPLIT), 2)


def test_evaluation_script_writes_the_scores(tmp_path, capsys):
    gen = tmp_path / "generate-test.txt"
    gen.write_text("\n".join(generate_output()) + "\n", encoding="utf-8")
    ref = tmp_path / "test.raw.de"
    ref.write_text("\n".join(REFS_RAW) + "\n", encoding="utf-8")
    out = tmp_path / "result.json"
    argv = [str(gen), "--reference", str(ref), "--detokenize", "moses", "--target-lang", "de"]
    argv += ["--tokenized-bleu", "--compound-split", "--json-out", str(out)]
    argv += [
        "--meta",
        "arch=ringformer_wmt_en_de",
        "--meta",
        "beam=4",
        "--hyp-out",
        str(tmp_path / "h"),
    ]
    assert scoring.main(argv) == 0
    result = json.loads(out.read_text())
    assert result["arch"] == "ringformer_wmt_en_de" and result["beam"] == 4
    assert result["sacrebleu"]["score"] == round(
        sacrebleu.corpus_bleu(HYPS_DETOK, [REFS_RAW]).score, 2
    )
    assert result["tokenized_bleu"]["score"] == round(fairseq_score(HYPS_SPLIT, REFS_SPLIT), 2)
    assert (tmp_path / "h").read_text().splitlines() == HYPS_DETOK
    printed = capsys.readouterr().out
    assert "signature: nrefs:1|case:mixed" in printed and "compound-split BLEU" in printed


def test_truncated_output_is_reported(tmp_path, capsys):
    lines = [line for line in generate_output() if not line.startswith("T-1")]
    with pytest.raises(ValueError, match="lacks sentence id 1"):
        read_targets(lines)
    with pytest.raises(ValueError, match="no D-lines"):
        read_hypotheses(["nothing here"])
    gen = tmp_path / "g.txt"
    gen.write_text("\n".join(generate_output()[:4]) + "\n", encoding="utf-8")
    ref = tmp_path / "r.txt"
    ref.write_text("\n".join(REFS_RAW) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match="fairseq-generate output"):
        scoring.main([str(gen), "--reference", str(ref)])
    assert scoring.cli([str(gen), "--reference", str(ref)]) == 2
    assert capsys.readouterr().err.startswith("python -m recurnmt.experiments.scoring: error: ")


# --- the evaluation commands of each dataset ---------------------------------------------------


def _flag(argv, flag):
    return argv[argv.index(flag) + 1]


def _prepared(tmp_path: Path, segmentation: str) -> Path:
    data = tmp_path / segmentation
    data.mkdir()
    (data / ("bpe.codes" if segmentation == "bpe" else "spm.model")).write_text("x")
    return data


def test_wmt14_evaluation_averages_beams_4_and_splits_compounds(tmp_path):
    data = _prepared(tmp_path, "bpe")
    steps = evaluation_steps(
        PRESETS["wmt14"], data, tmp_path / "ck", tmp_path / "run", EvalSettings(), meta={"a": 1}
    )
    average, generate, scoring = (list(s.argv) for s in steps)
    assert "recurnmt.experiments.averaging" in average and _flag(average, "--last") == "5"
    assert _flag(average, "--by") == "update"
    assert _flag(generate, "--path") == _flag(average, "--output")
    assert (_flag(generate, "--beam"), _flag(generate, "--lenpen")) == ("4", "0.6")
    assert _flag(generate, "--post-process") == "subword_nmt"
    assert steps[1].stdout == tmp_path / "run" / "generate-test.txt"
    assert _flag(scoring, "--detokenize") == "moses" and _flag(scoring, "--target-lang") == "de"
    assert "--tokenized-bleu" in scoring and "--compound-split" in scoring
    assert "--lowercase" not in scoring
    assert _flag(scoring, "--reference") == str(data / "test.raw.de")


def test_iwslt14_evaluation_beam_5_lowercased_without_compound_split(tmp_path):
    data = _prepared(tmp_path, "bpe")
    settings = EvalSettings(average_last=1, checkpoint="best")
    steps = evaluation_steps(PRESETS["iwslt14"], data, tmp_path / "ck", tmp_path, settings)
    assert len(steps) == 2  # no averaging
    generate, scoring = (list(s.argv) for s in steps)
    assert (_flag(generate, "--beam"), _flag(generate, "--lenpen")) == ("5", "1.0")
    assert _flag(generate, "--path") == str(tmp_path / "ck" / "checkpoint_best.pt")
    assert "--lowercase" in scoring and "--tokenized-bleu" in scoring
    assert "--compound-split" not in scoring and _flag(scoring, "--target-lang") == "en"


def test_sentencepiece_data_is_scored_without_moses(tmp_path):
    data = _prepared(tmp_path, "spm")
    steps = evaluation_steps(
        PRESETS["wmt14"], data, tmp_path, tmp_path, EvalSettings(), {"beam": 2, "lenpen": None}
    )
    generate, scoring = list(steps[1].argv), list(steps[2].argv)
    assert _flag(generate, "--post-process") == "sentencepiece"
    assert _flag(generate, "--beam") == "2" and "--lenpen" not in generate
    assert "--detokenize" not in scoring and "--tokenized-bleu" not in scoring


def test_model_report_of_a_saved_model(tmp_path):
    """P* of a checkpoint's model, as RingFormer Table 1 counts it (no fairseq-train needed)."""
    from recurnmt.nmt.build import build_model, toy_dictionary
    from recurnmt.parameters import parameter_report

    model, args, _ = build_model("ringformer_tiny", ["--share-all-embeddings"], toy_dictionary(20))
    d = toy_dictionary(20)
    for lang in ("de", "en"):
        d.save(str(tmp_path / f"dict.{lang}.txt"))
    args.data, args.source_lang, args.target_lang = str(tmp_path), "de", "en"
    history = {"criterion_name": "c", "optimizer_name": "o", "lr_scheduler_state": {}}
    state = {"args": args, "model": model.state_dict(), "extra_state": {}}
    torch.save({**state, "optimizer_history": [{**history, "num_updates": 0}]}, tmp_path / "c.pt")
    report = scoring.model_report(tmp_path / "c.pt", tmp_path)
    assert report["arch"] == "ringformer_tiny"
    assert report["params"]["p_star"] == parameter_report(model).p_star > 0
