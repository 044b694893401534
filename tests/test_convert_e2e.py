"""``recurnmt-convert`` end to end: a fairseq ``transformer`` trained by ``fairseq-train``,
converted at full rank (also from fairseq's older checkpoint format), decodes through
``fairseq-generate`` as the teacher does; converted at
a low rank, it fine-tunes through ``fairseq-train --finetune-from-model`` and resumes exactly."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import torch

from tests import nmt_fixtures
from tests.test_cli_e2e import ENV, ROOT, generate, losses, train
from tests.test_convert import old_format

data = nmt_fixtures.data  # the shared fixture, found by pytest under this name

pytestmark = pytest.mark.e2e

SIZES = [
    "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
    "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
    "--encoder-layers", "2", "--decoder-layers", "2",
    "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
    "--encoder-normalize-before", "--decoder-normalize-before",
]  # fmt: skip


def convert(*args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "recurnmt.nmt.convert", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=ENV,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def hypotheses(log: str) -> dict[str, tuple[str, float]]:
    """fairseq-generate's hypotheses: id -> (tokens, score)."""
    found = re.findall(r"^H-(\d+)\t(\S+)\t(.*)$", log, flags=re.M)
    return {i: (tokens, float(score)) for i, score, tokens in found}


def test_converted_teacher_decodes_as_the_teacher_and_fine_tunes(data, tmp_path):
    train(data, tmp_path / "teacher", "transformer", 6, *SIZES)
    teacher = tmp_path / "teacher" / "checkpoint_last.pt"
    exact = tmp_path / "exact.pt"
    printed = convert(str(teacher), str(exact), "--unique-layers", "1", "--level-lora-rank", "full")
    assert "--level-lora-rank=full" in printed
    want, got = (hypotheses(generate(data, path)) for path in (teacher, exact))
    assert len(want) == nmt_fixtures.SIZES["test"] and want.keys() == got.keys()
    for i, (tokens, score) in want.items():
        assert got[i][0] == tokens and got[i][1] == pytest.approx(score, abs=1e-4)

    # the same teacher as fairseq's older releases were saved (args, no cfg, old names)
    old = tmp_path / "old_format.pt"
    torch.save(old_format(torch.load(teacher, weights_only=False)), old)
    convert(str(old), str(tmp_path / "from_old.pt"), "--unique-layers", "1",
            "--level-lora-rank", "full")  # fmt: skip
    from_old = hypotheses(generate(data, tmp_path / "from_old.pt"))
    assert {i: h[0] for i, h in from_old.items()} == {i: h[0] for i, h in want.items()}

    low = tmp_path / "low.pt"
    printed = convert(
        str(teacher),
        str(low),
        "--unique-layers",
        "1",
        "--level-lora-rank",
        "4",
        "--init",
        "average",
    )
    flags = re.search(r"--arch (\S+) (.*) \[the source", printed)
    arch, relaxed_flags = flags.group(1), flags.group(2).split()
    tune = [*SIZES, *relaxed_flags, "--finetune-from-model", str(low)]
    log = train(data, tmp_path / "tuned", arch, 2, *tune)
    assert f"Loaded checkpoint {low}" in log
    assert sorted(losses(log)) == [1, 2]
    assert "BLEU" in generate(data, tmp_path / "tuned" / "checkpoint_last.pt")

    # the relaxed model resumes from checkpoint_last.pt as if it had never stopped
    resumed = losses(train(data, tmp_path / "tuned", arch, 4, *tune))
    straight = losses(train(data, tmp_path / "straight", arch, 4, *tune))
    assert {u: resumed[u] for u in (3, 4)} == {u: straight[u] for u in (3, 4)}
