"""scripts/speculative.py end to end on the tiny corpus: two tiny models trained by its own
``train`` step, measured by ``measure``, the page and its plot written."""

from __future__ import annotations

import json

import pytest
import torch

from tests import nmt_fixtures
from tests.script_modules import load_script

data = nmt_fixtures.data  # the shared fixture

pytestmark = pytest.mark.e2e


def test_train_then_measure_writes_the_page(data, tmp_path):
    script = load_script("speculative")
    common = ["--data", str(data), "--out", str(tmp_path / "runs"), "--doc", str(tmp_path / "s.md"),
              "--models", "ringformer-random", "transformer", "--embed-dim", "16", "--ffn-dim",
              "32", "--heads", "2", "--levels", "3", "--max-update", "6", "--nproc", "1"]  # fmt: skip
    assert script.main(["train", *common]) == 0
    assert script.main(["train", *common]) == 0  # resumed: nothing trained again
    measure = ["--sentences", "6", "--batch", "4", "--rounds", "1", "--draft-tokens", "2", "4"]
    assert script.main(["measure", *common, *measure]) == 0
    before = (tmp_path / "s.json").read_text()
    assert script.main(["measure", *common, *measure]) == 0  # resumed: nothing measured again
    assert (tmp_path / "s.json").read_text() == before
    results = json.loads(before)
    quality = results["quality"]["ringformer-random"]
    assert set(quality["identical"]) == {"1", "2"}
    assert all(v["same"] == v["of"] for v in quality["identical"].values())  # exact
    runs = {(r["model"], r["run"], r["setting"]) for r in results["speed"]["rows"]}
    assert ("ringformer-random", "spec R=2 K=2", "batch 1") in runs
    assert ("ringformer-random", "spec R=1 K=4", "batch 4") in runs
    assert ("ringformer-random", "spec R=1 K=2", "batch 4") not in runs
    assert ("transformer", "greedy", "batch 4") in runs and (
        "transformer",
        "beam4",
        "batch 1",
    ) in runs
    assert set(results["beam"]["ringformer-random"]) == {"1", "2"}
    costs = results["costs"]
    assert set(costs) == {"ringformer-random"}  # fairseq's transformer does not draft
    c = costs["ringformer-random"]
    batch1 = [r for r in results["speed"]["rows"] if r["model"] == "ringformer-random"
              and r["setting"] == "batch 1" and r["run"].startswith("spec")]  # fmt: skip
    fastest = max(batch1, key=lambda r: r["tokens_per_s"])["run"]
    assert fastest == f"spec R={c['R']} K={c['K']}"  # the model's fastest batch-1 setting
    plain, spec = c["plain"], c["spec"]
    assert plain["tokens"] == spec["tokens"]  # the same output
    assert plain["verifications"] == plain["emitted"]  # without drafts: one token a step
    assert spec["verifications"] < spec["draft_passes"] <= spec["verifications"] * (c["K"] + 1)
    assert 0 < spec["draft_seconds"] + spec["verify_seconds"] < spec["seconds"]
    from studies.speculative import measure as speculation

    test = speculation.TestSet(data)
    model = speculation.load(tmp_path / "runs" / "ringformer-random" / "checkpoints" /
                             "checkpoint_last.pt")[0]  # fmt: skip
    eos = test.tgt_dict.eos()
    a, b = torch.tensor([7, 8, eos]), torch.tensor([7, 9, eos])  # part at the second token
    gap = speculation._margin(model, test, 0, a, b)
    src = test.dataset[0]["source"][None]
    with torch.no_grad():
        logits = model(src, torch.tensor([src.size(1)]), torch.tensor([[eos, 7]]))[0][0, -1]
    top = logits.topk(2).values
    assert gap == pytest.approx((top[0] - top[1]).item()) and gap >= 0
    page = (tmp_path / "s.md").read_text()
    for heading in ("## Speed at batch 1", "## Identical outputs", "## Beam search",
                    "## Where the time goes at batch 1"):  # fmt: skip
        assert heading in page
    assert (tmp_path / "s.png").exists() and "![speed and acceptance against K](s.png)" in page
    assert str(tmp_path) not in (tmp_path / "s.json").read_text()  # portable paths only
    assert "CPU, 1 thread(s), float32; speed on" in page  # --device cpu, the default


def test_the_measurement_is_measured_where_asked_and_the_page_says_where(capsys):
    """``measure --device cuda --dtype fp16`` (a GPU's run of the same measurement): half
    precision only on CUDA, and the page names the device and the precision."""
    script = load_script("speculative")
    with pytest.raises(SystemExit):
        script.main(["measure", "--dtype", "fp16"])
    assert "--dtype fp16: half precision is measured on CUDA" in capsys.readouterr().err
    from studies.speculative.report import measured_on

    on_gpu = {"device": "cuda", "dtype": "fp16", "threads": "1"}
    assert measured_on(on_gpu) == "cuda, float16, timings synchronised with the device"
    assert measured_on({"threads": "1"}) == "CPU, 1 thread(s), float32"  # an older page


def test_where_the_time_goes_is_computed_from_the_loops_clocks():
    """The costs table's arithmetic on figures worked by hand: a step of 9 ms without drafts,
    draft passes of 2 ms (4 a verification), verifications of 10 ms keeping 2.5 tokens."""
    from studies.speculative.report import costs_table

    plain = {"seconds": 1.0, "tokens": 100, "verifications": 100, "emitted": 100,
             "draft_passes": 100, "draft_seconds": 0.05, "verify_seconds": 0.85}  # fmt: skip
    spec = {"seconds": 0.8, "tokens": 100, "verifications": 40, "emitted": 100,
            "draft_passes": 160, "draft_seconds": 0.32, "verify_seconds": 0.4}  # fmt: skip
    table = costs_table({"costs": {"m": {"R": 1, "K": 3, "plain": plain, "spec": spec}}})
    cells = [cell.strip() for cell in table[2].strip("|").split("|")]
    # rest 0.8 ms a token; free drafts: 10 ms a token against 4.8; a draft pass for 1.8x:
    # (2.5 x (10 / 1.8 - 0.8) - 10) / 4 ms
    assert cells == ["m", "R=1, K=3", "9.00", "2.00 (0.22)", "10.00 (1.11)", "2.50", "1.25",
                     "2.08", "0.47"]  # fmt: skip
    spec_slow = dict(spec, verify_seconds=0.7, seconds=1.1)  # verifying alone too slow
    table = costs_table({"costs": {"m": {"R": 1, "K": 3, "plain": plain, "spec": spec_slow}}})
    assert table[2].endswith("| none |")
    assert costs_table({}) == []
