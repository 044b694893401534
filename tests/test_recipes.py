"""The paper recipes of configs/nmt: every one parses, expands and builds the intended model.

Models are built on the meta device (no memory, no initialisation time) from the very
arguments the recipe's fairseq-train command would pass. One recipe runs for real for two
updates (``e2e``), through averaging, fairseq-generate, scoring and the results table.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from fairseq import tasks
from fairseq.models import ARCH_MODEL_REGISTRY
from fairseq.models.transformer import TransformerModel

from recurnmt.experiments import recipe as recipes
from recurnmt.experiments import results
from recurnmt.experiments.launch import LaunchPlan
from recurnmt.experiments.recipe import RecipeError, load_recipe, train_argv, validate
from recurnmt.nmt.build import toy_dictionary
from recurnmt.nmt.model import RecurrentTransformerModel
from recurnmt.parameters import parameter_report
from tests import nmt_fixtures

ROOT = Path(__file__).resolve().parent.parent
RECIPES = recipes.recipe_files()
DATASETS = ("_wmt14_bibert_base", "_wmt14_bibert_big", "_wmt14_big", "_wmt14", "_iwslt14")
# RingFormer Table 1, P* in millions: base (512/2048) and large (1024/4096)
TABLE1 = {
    "recurrent_transformer": (44.05, 176.18),
    "owf": (20.98, 83.91),
    "universal_transformer": (7.34, 29.37),
    "universal_transformer_act": (7.34, 29.37),  # + one halting unit per side
    "ringformer": (8.94, 35.71),
}
wmt14_bpe = nmt_fixtures.wmt14_bpe  # the shared fixture, found by pytest under this name
wmt14_de_en_bpe = nmt_fixtures.wmt14_de_en_bpe


def family_of_file(path: Path) -> str:
    stem = path.stem
    for suffix in DATASETS:
        if stem.endswith(suffix):
            return stem[: -len(suffix)]
    raise AssertionError(f"{path.name}: no dataset suffix")


def family_of_model(model) -> str:
    """What the built model is, read from its structure (not from its name)."""
    if not isinstance(model, RecurrentTransformerModel):
        assert isinstance(model, TransformerModel)
        return "transformer"
    stack = model.encoder.stack
    cfg, unique, levels = model.encoder.stack_cfg, stack.plan.num_unique, stack.plan.num_levels
    if cfg.halting.act:
        return "universal_transformer_act"
    if unique == 1 and cfg.signal.kind == "lowrank" and cfg.norms.per_level:
        return "ringformer"
    if unique == 1 and cfg.signal.kind == "static" and cfg.coordinates.positions_every_level:
        return "universal_transformer"
    if cfg.block.ffn_sharing == "shared" and model.decoder.stack_cfg.block.ffn_sharing == "none":
        return "owf"
    if unique < levels and cfg.residual.lrc == "both" and cfg.residual.nll_ratio > 0:
        return "sret"
    if unique == levels:
        return "recurrent_transformer"
    raise AssertionError(f"unknown family: {cfg}")


@pytest.fixture(scope="module", autouse=True)
def _warm_meta_device():
    """normal_ on the meta device imports torch's reference ops once (~1.5 s)."""
    with torch.device("meta"):
        torch.empty(2).normal_()


def build_on_meta(args):
    d = toy_dictionary(100)
    task = tasks.get_task("translation")(args, d, d)
    with torch.device("meta"):
        return task.build_model(args)


def test_every_architecture_and_dataset_has_a_recipe():
    names = {p.stem for p in RECIPES}
    for family in ["transformer", "sret", *TABLE1]:
        assert {f"{family}_iwslt14", f"{family}_wmt14"} <= names
    for family in TABLE1:
        assert f"{family}_wmt14_big" in names


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_recipe_expands_to_a_registered_arch_of_its_family(path, tmp_path):
    recipe = load_recipe(path, base_dir=tmp_path)
    argv = train_argv(recipe)
    assert argv[argv.index("--arch") + 1] == recipe.arch in ARCH_MODEL_REGISTRY
    assert argv[0] == str(tmp_path / recipe.preset.data)
    args = validate(recipe)
    model = build_on_meta(args)
    family = family_of_file(path)
    assert family_of_model(model) == family
    if family in TABLE1 and "_wmt14" in path.stem:
        want = TABLE1[family][1 if path.stem.endswith("_big") else 0]
        assert parameter_report(model).p_star / 1e6 == pytest.approx(want, rel=0.01)


@pytest.mark.parametrize("name", ["sret_wmt14", "transformer_iwslt14", "sret_iwslt14"])
def test_sret_table9_settings(name, tmp_path):
    args = validate(load_recipe(name, base_dir=tmp_path))
    assert args.optimizer == "adam" and eval(args.adam_betas) == (0.9, 0.98)
    assert args.lr == [5e-4] and args.lr_scheduler == "inverse_sqrt"
    assert args.warmup_updates == 4000 and args.clip_norm == 0.0
    assert args.dropout == 0.3 and args.weight_decay == 1e-4
    assert args.label_smoothing == 0.1 and args.max_tokens == 4096
    assert args.share_decoder_input_output_embed
    assert "label_smoothed_cross_entropy" in args.criterion


@pytest.mark.parametrize(
    ("name", "lr"),
    [("ringformer_wmt14", 7e-4), ("owf_wmt14", 7e-4), ("universal_transformer_wmt14_big", 2e-4)],
)
def test_ringformer_a1_settings(name, lr, tmp_path):
    recipe = load_recipe(name, base_dir=tmp_path)
    args = validate(recipe)
    assert args.lr == [lr] and args.lr_scheduler == "cosine"
    assert args.warmup_updates == 17000 and args.max_update == 210000
    assert args.activation_fn == "gelu" and args.dropout == 0.1 and args.clip_norm == 1.0
    assert args.max_source_positions == args.max_target_positions == 50
    # 512 sentences per update: 256 per process, on two processes as the paper
    assert args.batch_size == 256 and recipe.paper_world_size == 2
    assert train_argv(recipe, world_size=1)[-2:] == ["--update-freq", "2"]
    assert "--update-freq" not in train_argv(recipe, world_size=2)
    generate = recipes.generate_flags(recipe)
    assert "max_source_positions': 1024" in generate[generate.index("--model-overrides") + 1]


@pytest.mark.parametrize(
    ("name", "beam", "lenpen"), [("sret_iwslt14", "5", "1.0"), ("ringformer_wmt14", "4", "0.6")]
)
def test_generation_follows_the_dataset(name, beam, lenpen, tmp_path):
    flags = recipes.generate_flags(load_recipe(name, base_dir=tmp_path))
    assert flags[flags.index("--beam") + 1] == beam
    assert flags[flags.index("--lenpen") + 1] == lenpen


# --- a clear message for every mistake ---------------------------------------------------------


def write(tmp_path: Path, text: str, name: str = "mine.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text.replace("BASE", str(recipes.RECIPE_DIR / "_a1_wmt14.yaml")))
    return path


def test_unknown_top_level_key(tmp_path):
    path = write(tmp_path, "extends: BASE\narch: ringformer_tiny\nlearning_rate: 1\n")
    with pytest.raises(RecipeError, match=r"unknown key\(s\) learning_rate"):
        load_recipe(path)


def test_unknown_fairseq_option_is_named_as_the_recipe_key(tmp_path):
    path = write(tmp_path, "extends: BASE\narch: ringformer_tiny\ntrain:\n  lr_schedul: cosine\n")
    with pytest.raises(RecipeError, match=r"fairseq-train does not know train\.lr_schedul"):
        validate(load_recipe(path))
    with pytest.raises(RecipeError, match=r"generate.beem"):
        validate(load_recipe(path, ["train.lr_schedul=null", "generate.beem=3"]))
    bad_value = ["train.lr_schedul=null", "train.max_update=many"]
    with pytest.raises(RecipeError, match=r"rejected the train options: .*--max-update.*'many'"):
        validate(load_recipe(path, bad_value))


def test_other_mistakes(tmp_path):
    with pytest.raises(RecipeError, match="unknown evaluate key"):
        load_recipe("ringformer_wmt14", ["evaluate.average=3"])
    with pytest.raises(RecipeError, match="train.save_dir is set by the recipe itself"):
        load_recipe("ringformer_wmt14", ["train.save_dir=x"])
    with pytest.raises(RecipeError, match="dataset 'wmt15'"):
        load_recipe("ringformer_wmt14", ["dataset=wmt15"])
    with pytest.raises(RecipeError, match="not a registered architecture"):
        validate(load_recipe("ringformer_wmt14", ["arch=ringformer_huge"]))
    with pytest.raises(RecipeError, match="expected KEY=VALUE"):
        load_recipe("ringformer_wmt14", ["train.lr"])
    with pytest.raises(RecipeError, match="no recipe 'ringformer_wmt15'"):
        load_recipe("ringformer_wmt15")
    write(tmp_path, "extends: b.yaml\narch: x\n", "a.yaml")
    write(tmp_path, "extends: a.yaml\n", "b.yaml")
    with pytest.raises(RecipeError, match="loops back"):
        load_recipe(tmp_path / "a.yaml")


def test_missing_data_directory_says_how_to_prepare_it(tmp_path, capsys):
    argv = ["run", "ringformer_wmt14", "--device", "cpu", "--override", f"data={tmp_path}/none"]
    assert recipes.cli(argv) == 2
    err = capsys.readouterr().err
    assert f"data directory {tmp_path}/none does not exist" in err
    assert f"python -m data_prep.wmt14 --src de --tgt en --out {tmp_path}/none" in err


def test_overrides_and_placeholders(tmp_path):
    recipe = load_recipe(
        "ringformer_iwslt14",
        ["train.max_update=10", "evaluate.average_last=1", "run_dir=out/{name}", "data=d"],
        base_dir=tmp_path,
    )
    assert recipe.train["max_update"] == 10 and recipe.evaluate.average_last == 1
    assert recipe.run_dir == tmp_path / "out" / "ringformer_iwslt14"
    assert recipe.train["tensorboard_logdir"] == str(recipe.run_dir / "tensorboard")
    assert recipe.data == tmp_path / "d"


def test_dry_run_prints_every_command(tmp_path, capsys):
    plan = LaunchPlan(nproc=2, device="cpu", launcher="torchrun")
    recipe = load_recipe("transformer_wmt14", base_dir=tmp_path)
    assert recipes.run(recipe, plan, dry_run=True) == 0
    out = capsys.readouterr().out
    assert "does not exist yet" in out and "effective batch is 2x" in out
    commands = [line for line in out.splitlines() if line.startswith("$ ")]
    assert len(commands) == 4  # torchrun, average, generate, score
    assert "--nproc-per-node 2" in commands[0] and "--arch transformer_wmt_en_de" in commands[0]
    assert "recurnmt.experiments.averaging" in commands[1] and "--beam 4" in commands[2]


def test_cpu_multi_process_commands(tmp_path, capsys):
    plan = LaunchPlan(nproc=2, device="cpu")
    recipe = load_recipe("ringformer_wmt14", base_dir=tmp_path)
    assert recipes.run(recipe, plan, stages=["train"], dry_run=True) == 0
    commands = [line for line in capsys.readouterr().out.splitlines() if line.startswith("$ ")]
    assert len(commands) == 2 and "--update-freq" not in commands[0]  # 2 x 256 sentences
    for rank, command in enumerate(commands):
        assert "--cpu --distributed-backend gloo --ddp-backend legacy_ddp" in command
        assert f"--distributed-world-size 2 --distributed-rank {rank}" in command


# --- one recipe for real -----------------------------------------------------------------------


@pytest.mark.e2e
def test_ringformer_wmt14_recipe_runs_end_to_end(wmt14_de_en_bpe, tmp_path):
    """Two updates of a tiny RingFormer under the WMT14 recipe on the WMT14 fixture (De-En, as
    RingFormer Table 1), then the whole evaluation (average of the 2 update checkpoints,
    beam 4 / lenpen 0.6, detokenized sacrebleu + tokenized BLEU) and the results table."""
    overrides = {
        "data": str(wmt14_de_en_bpe),
        "run_dir": str(tmp_path / "runs" / "{name}"),
        "arch": "ringformer_tiny",
        "train.max_update": 2,
        "train.warmup_updates": 1,
        "train.batch_size": 4,  # x update-freq 2: 4 updates per epoch (29 pairs <= 50)
        "train.required_batch_size_multiple": 1,  # 7 valid sentences (see evaluation.py)
        "train.save_interval_updates": 1,
        "train.keep_interval_updates": 2,
        "evaluate.average_last": 2,
        "generate.max_len_b": 20,
    }
    cmd = [sys.executable, "-m", "recurnmt.experiments.recipe", "run", "ringformer_wmt14"]
    cmd += ["--device", "cpu"]
    for key, value in overrides.items():
        cmd += ["--override", f"{key}={value}"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]

    run = tmp_path / "runs" / "ringformer_wmt14"
    ckpts = run / "checkpoints"
    assert {"checkpoint_1_1.pt", "checkpoint_1_2.pt", "checkpoint_avg2.pt"} <= {
        p.name for p in ckpts.iterdir()
    }
    assert "--update-freq 2" in log  # the paper's 2 x 256 sentences on one process
    assert "Generate test with beam=4" in (run / "generate-test.txt").read_text()
    result = json.loads((run / "result.json").read_text())
    assert result["n_sentences"] == 8 and result["arch"] == "ringformer_tiny"
    assert result["tokenized_bleu"]["compound_split"] is False  # English target
    assert result["sacrebleu"]["signature"].startswith("nrefs:1|case:mixed")
    assert result["checkpoint"].endswith("checkpoint_avg2.pt") and result["lenpen"] == 0.6
    assert result["params"]["p_star"] > 0

    md, png = tmp_path / "results.md", tmp_path / "results.png"
    assert results.main([str(tmp_path / "runs"), "--markdown", str(md), "--png", str(png)]) == 0
    assert "| ringformer |" in md.read_text() and png.stat().st_size > 1000
