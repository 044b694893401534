"""Helpers of the demo and of the family comparison (scripts/demo_nmt.py, compare_nmt.py)."""

from __future__ import annotations

from tests.script_modules import load_script


def _script(name: str):
    return load_script(name)


VALID = (
    "2026-11-23 17:00:00 | INFO | valid | epoch 002 | valid on 'valid' subset | loss 5.1 | "
    "nll_loss 3.9 | ppl 14.93 | wps 9000 | wpb 1500 | bsz 60 | num_updates 400\n"
)


def test_demo_samples_are_fixed_by_length_and_spread_over_the_test_set():
    demo = _script("demo_nmt")
    refs = [" ".join(["w"] * (i % 30 + 1)) for i in range(300)]
    picked = demo.pick_samples(refs)
    assert len(picked) == 5 and picked == sorted(set(picked))
    assert all(8 <= len(refs[i].split()) <= 20 for i in picked)
    assert picked[0] < 60 and picked[-1] > 240
    assert demo.pick_samples(["short"]) == []


def test_demo_reads_the_last_validation(tmp_path):
    demo = _script("demo_nmt")
    log = tmp_path / "train.log"
    log.write_text(VALID.replace("14.93", "20.5") + "other line\n" + VALID, encoding="utf-8")
    assert demo.last_valid_stats(log)["ppl"] == "14.93"


def test_compare_reads_validation_and_training_stats(tmp_path):
    compare = _script("compare_nmt")
    log = tmp_path / "train.log"
    inner = (
        '2026-11-23 17:00:00 | INFO | train_inner | {"epoch": 1, "update": 0.5, "loss": "9.1", '
        '"ppl": "300.5", "num_updates": "25"}\n'
    )
    log.write_text(inner + VALID, encoding="utf-8")
    assert compare.valid_ppl(log) == 14.93
    assert compare.train_stats(log) == {"num_updates": 25.0, "loss": 9.1, "ppl": 300.5}


def test_compare_gives_every_model_the_same_size_and_recipe():
    compare = _script("compare_nmt")
    args = compare.build_parser().parse_args([])
    size = compare.size_flags(args)
    assert size.count("--encoder-layers") == 1 and "--decoder-normalize-before" in size
    post_ln = compare.size_flags(compare.build_parser().parse_args(["--no-pre-ln"]))
    assert "--encoder-normalize-before" not in post_ln  # Table 4's own placement
    assert size[size.index("--encoder-embed-dim") + 1] == "128"
    recipe = compare.recipe_flags(args)
    assert recipe[recipe.index("--lr") + 1] == "0.001"
    assert recipe[recipe.index("--max-update") + 1] == "800"


def test_compare_splits_the_update_over_processes_and_decays_linearly_on_request():
    compare = _script("compare_nmt")
    args = compare.build_parser().parse_args(
        ["--nproc", "2", "--max-tokens", "2048", "--lr-scheduler", "polynomial_decay"]
    )
    recipe = compare.recipe_flags(args)
    assert recipe[recipe.index("--max-tokens") + 1] == "1024"  # per process: 2,048 per update
    assert recipe[recipe.index("--lr-scheduler") + 1] == "polynomial_decay"
    assert recipe[recipe.index("--total-num-update") + 1] == "800"
    assert "--total-num-update" not in compare.recipe_flags(compare.build_parser().parse_args([]))


def test_training_on_cpu_processes_goes_through_the_launcher():
    from recurnmt.experiments.launch import cpu_train_command

    assert cpu_train_command(1)[-1] == "--cpu" and "fairseq" in cpu_train_command(1)[0]
    many = cpu_train_command(2)
    assert many[1:] == ["-m", "recurnmt.experiments.launch", *"--nproc 2 --device cpu --".split()]
