"""End to end through fairseq's command line on a tiny slice of the embedded corpus.

fairseq-preprocess (via data_prep), fairseq-train --user-dir, fairseq-generate --scoring
sacrebleu, fairseq-interactive, and resuming from checkpoint_last.pt.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests import nmt_fixtures
from tests.nmt_fixtures import SIZES

data = nmt_fixtures.data  # the shared fixture, found by pytest under this name

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
ENV = {"OMP_NUM_THREADS": "1", "PATH": str(BIN), "PYTHONHASHSEED": "0"}
# PYTHONPATH: a checkout other than the installed one (a worktree) reaches the tools
ENV.update({k: os.environ[k] for k in ("CUDA_VISIBLE_DEVICES", "PYTHONPATH") if k in os.environ})


def device_flags(device: torch.device | str) -> tuple[str, ...]:
    """``--cpu`` on the CPU; nothing on CUDA (fairseq then trains on the GPU)."""
    return ("--cpu",) if torch.device(device).type == "cpu" else ()


# fairseq-fixed's torch C++ extensions: BASE layers (libbase), non-autoregressive translation
# (libnat) and alignment training (alignment_train_cpu_binding)
TORCH_EXTENSIONS = ("fairseq.libbase", "fairseq.libnat", "alignment_train_cpu_binding")
# fairseq-TOOL with the modules of sys.argv[1] (comma-separated) made unimportable
WITHOUT = """import sys
sys.modules.update(dict.fromkeys(sys.argv.pop(1).split(",")))
from fairseq_cli.{tool} import cli_main
sys.argv[0] = "fairseq-{tool}"
cli_main()
"""


def fairseq(
    tool: str,
    *args: str,
    stdin: str | None = None,
    blocked: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> str:
    command = [str(BIN / f"fairseq-{tool}")]
    if blocked:
        command = [sys.executable, "-c", WITHOUT.format(tool=tool), ",".join(blocked)]
    proc = subprocess.run(
        [*command, *args],
        cwd=ROOT,
        input=stdin,
        capture_output=True,
        text=True,
        env=ENV if env is None else {**ENV, **env},
    )
    if proc.returncode:
        raise AssertionError(
            f"fairseq-{tool} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return proc.stdout + proc.stderr


def train(
    data: Path,
    save_dir: Path,
    arch: str,
    updates: int,
    *extra: str,
    device: str = "cpu",
    blocked: tuple[str, ...] = (),
) -> str:
    return fairseq(
        "train",
        str(data),
        "--user-dir",
        "user_dir",
        "--arch",
        arch,
        *device_flags(device),
        "--optimizer",
        "adam",
        "--lr",
        "1e-3",
        "--max-tokens",
        "1024",
        "--max-update",
        str(updates),
        "--criterion",
        "recurrent_label_smoothed_cross_entropy",
        "--label-smoothing",
        "0.1",
        "--save-dir",
        str(save_dir),
        "--save-interval-updates",
        "3",
        "--no-epoch-checkpoints",
        "--log-format",
        "json",
        "--log-interval",
        "1",
        "--num-workers",
        "0",
        "--seed",
        "7",
        "--share-all-embeddings",
        "--dropout",
        "0.1",
        *extra,
        blocked=blocked,
    )


def losses(log: str) -> dict[int, str]:
    """Training loss by update number, from fairseq's JSON progress lines."""
    out = {}
    for m in re.finditer(r"train_inner \| (\{.*\})", log):
        record = json.loads(m.group(1))
        out[int(record["num_updates"])] = record["loss"]
    return out


def generate(
    data: Path,
    checkpoint: Path,
    *extra: str,
    device: str = "cpu",
    blocked: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> str:
    return fairseq(
        "generate",
        str(data),
        "--user-dir",
        "user_dir",
        "--path",
        str(checkpoint),
        "--gen-subset",
        "test",
        "--beam",
        "3",
        "--max-len-b",
        "20",
        "--batch-size",
        "16",
        "--post-process",
        "sentencepiece",
        "--scoring",
        "sacrebleu",
        *device_flags(device),
        *extra,
        blocked=blocked,
        env=env,
    )


@pytest.mark.smoke
def test_train_generate_interactive_and_resume(data, tmp_path, device):
    on = device.type
    full = train(data, tmp_path / "a", "ringformer_tiny", 9, device=on)
    reference = losses(full)
    assert sorted(reference) == list(range(1, 10))

    # the parameter count fairseq prints is P* + the (shared) embeddings
    from fairseq.data import Dictionary

    from recurnmt.nmt.build import build_model
    from recurnmt.parameters import parameter_report

    printed = int(re.search(r"num. shared model params: ([\d,]+)", full).group(1).replace(",", ""))
    model, _, _ = build_model(
        "ringformer_tiny", ["--share-all-embeddings"], Dictionary.load(str(data / "dict.de.txt"))
    )
    report = parameter_report(model)
    assert printed == report.p_star + report.embeddings + report.output_projection

    # resume: stop at 3 updates (mid-epoch), restart from checkpoint_last.pt, go on to 9
    train(data, tmp_path / "b", "ringformer_tiny", 3, device=on)
    resumed = train(data, tmp_path / "b", "ringformer_tiny", 9, device=on)
    assert "Loaded checkpoint" in resumed and "@ 3 updates" in resumed
    after = {u: float(loss) for u, loss in losses(resumed).items() if u > 3}
    want = {u: float(loss) for u, loss in reference.items() if u > 3}
    # bit-identical on the CPU; CUDA's embedding backward adds with atomics, in no fixed
    # order, so the printed (3-decimal) losses may differ in the last digit there
    assert after == (want if on == "cpu" else pytest.approx(want, abs=0.01))

    out = generate(data, tmp_path / "a" / "checkpoint_last.pt", "--print-alignment", device=on)
    assert len(re.findall(r"^A-\d+\t", out, flags=re.M)) == SIZES["test"]
    assert re.search(r"Generate test with beam=3: BLEU = [\d.]+", out)
    from recurnmt.experiments.scoring import corpus_bleu, read_hypotheses

    hyps = read_hypotheses(out.splitlines())
    refs = (data / "test.raw.en").read_text(encoding="utf-8").splitlines()
    bleu, signature = corpus_bleu(hyps, refs)
    assert len(hyps) == SIZES["test"] and "nrefs:1" in str(signature)

    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(data / "spm.model"))
    sources = (data / "test.raw.de").read_text(encoding="utf-8").splitlines()[:3]
    stdin = "".join(" ".join(sp.encode(s, out_type=str)) + "\n" for s in sources)
    inter = fairseq(
        "interactive",
        str(data),
        "--user-dir",
        "user_dir",
        *device_flags(device),
        "--beam",
        "2",
        "--path",
        str(tmp_path / "a" / "checkpoint_last.pt"),
        "--source-lang",
        "de",
        "--target-lang",
        "en",
        "--post-process",
        "sentencepiece",
        stdin=stdin,
    )
    assert len(re.findall(r"^D-\d+\t", inter, flags=re.M)) == 3


VARIANTS = [
    ("recurrent_transformer_tiny",),
    ("universal_transformer_tiny",),
    ("universal_transformer_act_tiny",),
    ("owf_tiny",),
    ("sret_tiny",),
    ("sret_tiny", "--lrc", "none"),
    ("sret_tiny", "--lrc", "identity", "--sharing-scheme", "cycle"),
    ("sret_tiny", "--mixed-depth", "on", "--encoder-attn-groups", "3,1"),
    ("relaxed_transformer_tiny", "--decoder-layers", "4", "--decoder-unique-layers", "2"),
]


@pytest.mark.smoke
def test_training_and_generation_need_none_of_fairseqs_torch_extensions(data, tmp_path):
    """recurnmt needs no torch C++ extension of fairseq-fixed's (they are compiled against the
    torch of its build, and serve other models): train and generate with them unimportable."""
    log = train(data, tmp_path, "universal_transformer_act_tiny", 2, blocked=TORCH_EXTENSIONS)
    assert sorted(losses(log)) == [1, 2]
    out = generate(data, tmp_path / "checkpoint_last.pt", blocked=TORCH_EXTENSIONS)
    assert re.search(r"Generate test with beam=3: BLEU = [\d.]+", out)


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: " ".join(v))
def test_every_variant_trains_and_generates(data, tmp_path, variant, device):
    on = device.type
    log = train(data, tmp_path, variant[0], 2, *variant[1:], device=on)
    assert sorted(losses(log)) == [1, 2]
    if variant[0] == "universal_transformer_act_tiny":
        assert '"ponder"' in log
    if "--mixed-depth" in variant:
        assert '"shallow_loss"' in log
    if variant[0] == "sret_tiny" and "none" not in variant:
        assert '"lrc_enc_b0_self_attn_' in log
    out = generate(data, tmp_path / "checkpoint_last.pt", device=on)
    assert "BLEU" in out
    depth = {"universal_transformer_tiny": 5, "sret_tiny": 2}.get(variant[0])
    if depth is not None and "cycle" not in variant:  # elastic depth of the trained model
        levels = f"'encoder_levels': {depth}, 'decoder_levels': {depth}"
        override_arg = f"{{{levels}}}"
        out = generate(
            data, tmp_path / "checkpoint_last.pt", "--model-overrides", override_arg, device=on
        )
        assert "BLEU" in out
        # fairseq applies the overrides to the saved arguments before building the model
        from fairseq import checkpoint_utils

        import recurnmt.nmt  # noqa: F401  (the plugin, and its safe checkpoint loading)

        overrides = {"encoder_levels": depth, "decoder_levels": depth}
        (model,), _ = checkpoint_utils.load_model_ensemble(
            [str(tmp_path / "checkpoint_last.pt")], arg_overrides=overrides
        )
        assert len(model.encoder.stack.run_levels) == len(model.decoder.stack.run_levels) == depth


def test_lrc_evolution_is_logged_and_plotted(data, tmp_path):
    from recurnmt.analysis.plot_lrc import plot, read_series

    log = train(
        data,
        tmp_path / "ckpt",
        "sret_tiny",
        4,
        "--lr",
        "5e-3",
        "--tensorboard-logdir",
        str(tmp_path / "tb"),
    )
    (tmp_path / "train.log").write_text(log)
    from_log = read_series(tmp_path / "train.log")
    from_tb = read_series(tmp_path / "tb")
    key = "lrc_enc_b0_self_attn_main"
    assert [step for step, _ in from_log[key]] == [1, 2, 3, 4]
    assert [step for step, _ in from_tb[key]] == [1, 2, 3, 4]
    assert from_log[key][-1][1] != 1.0  # the coefficients really train
    png = plot(from_log, tmp_path / "lrc.png")
    assert png.stat().st_size > 1000


def _refused_training(
    data: Path, save_dir: Path, *flags: str, arch: str = "ringformer_tiny"
) -> str:
    """stderr of a fairseq-train run that must stop before training."""
    proc = subprocess.run(
        [str(BIN / "fairseq-train"), str(data), "--user-dir", "user_dir",
         "--arch", arch, *flags, "--max-update", "1", "--max-tokens", "512",
         "--save-dir", str(save_dir)],
        cwd=ROOT, capture_output=True, text=True, env=ENV,
    )  # fmt: skip
    assert proc.returncode != 0
    assert not (save_dir / "checkpoint_last.pt").exists()
    return proc.stderr


def test_half_precision_training_without_cuda_stops_before_training(data, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA")
    assert "--fp16 needs CUDA" in _refused_training(data, tmp_path / "fp16", "--fp16")


def test_bf16_training_through_fairseq_stops_before_training(data, tmp_path):
    """fairseq-train's --bf16 is TPU-only: it sets --tpu, and the Trainer's device is then
    torch_xla's (an AttributeError without it), with or without --cpu. Refused up front."""
    err = _refused_training(data, tmp_path / "bf16", "--bf16", "--cpu")
    assert "--bf16 needs a TPU" in err and "fairseq/options.py" in err


# fairseq's reduced-precision training modes that work on a GPU (--bf16: a TPU, above)
CUDA_PRECISION = ["--fp16", "--amp", "--memory-efficient-fp16"]
PRECISION_ARCHS = ["ringformer_tiny", "universal_transformer_act_tiny", "sret_tiny"]


@pytest.mark.parametrize("arch", PRECISION_ARCHS)
@pytest.mark.parametrize("flag", [*CUDA_PRECISION, "--bf16"])
def test_mixed_precision_training_and_generation_on_cuda(data, tmp_path, device, flag, arch):
    """A few updates of fairseq-train in each precision mode (finite losses), then
    fairseq-generate from the checkpoint (half precision for --fp16 models)."""
    if device.type != "cuda":
        pytest.skip(
            "fairseq's --fp16, --amp and --memory-efficient-fp16 need CUDA (their CPU "
            "refusal and bf16 on CPU: the tests above and tests/test_nmt_precision.py)"
        )
    if flag == "--bf16":
        err = _refused_training(data, tmp_path / "bf16", "--bf16", arch=arch)
        assert "--bf16 needs a TPU" in err
        return
    log = train(data, tmp_path, arch, 4, flag, device="cuda")
    by_update = losses(log)
    assert by_update and all(math.isfinite(float(v)) for v in by_update.values()), by_update
    assert '"loss_scale"' in log  # fairseq scaled the loss (FP16 optimizer, or AMP's scaler)
    half = ("--fp16",) if "fp16" in flag else ()
    out = generate(data, tmp_path / "checkpoint_last.pt", *half, device="cuda")
    assert len(re.findall(r"^H-\d+\t", out, flags=re.M)) == SIZES["test"]
    assert "BLEU" in out


def test_static_decoding_through_fairseq_generate(data, tmp_path):
    """``fairseq-generate --task speculative_translation --static-decoding`` translates the test
    set as fairseq's beam search does (beam 3, batches of 16), says which path ran, and refuses
    drafts beside it naming the flag; so does ``--compile-decoding``, which also compiles the
    greedy loop of ``--draft-levels 0``. (A model this briefly trained ends every sentence at one
    step; tests/test_static_decoding.py has sentences that end at different steps.)"""
    train(data, tmp_path, "universal_transformer_tiny", 9, "--decoder-layers", "3")
    checkpoint = tmp_path / "checkpoint_last.pt"

    def hypotheses(out: str) -> dict[str, str]:
        return dict(re.findall(r"^H-(\d+)\t\S+\t(.*)$", out, flags=re.M))

    plain = generate(data, checkpoint)
    out = generate(data, checkpoint, "--task", "speculative_translation", "--static-decoding")
    assert hypotheses(out) == hypotheses(plain) and len(hypotheses(out)) == SIZES["test"]
    assert "static-shape decoding: every row kept" in out and "run eagerly" in out
    with pytest.raises(AssertionError, match="--static-decoding=True: not with --draft-levels"):
        generate(data, checkpoint, "--task", "speculative_translation", "--static-decoding",
                 "--draft-levels", "1")  # fmt: skip
    # --compile-decoding: the same search with each step compiled by torch.compile, with the
    # machine's C++ compiler on the PATH; without one (ENV's PATH holds the tools alone), eager
    # after one warning naming the flag
    compiled = ("--task", "speculative_translation", "--compile-decoding")
    out = generate(data, checkpoint, *compiled)
    assert hypotheses(out) == hypotheses(plain)
    assert "--compile-decoding: compiling a step failed" in out and "eager from now on" in out
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is not None:
        path = f"{BIN}{os.pathsep}{Path(cxx).parent}"
        out = generate(data, checkpoint, *compiled, env={"PATH": path})
        assert hypotheses(out) == hypotheses(plain)
        assert "compiled by torch.compile" in out and "failed" not in out
        # greedy: recurnmt's loop without drafts, its passes compiled
        greedy = generate(data, checkpoint, "--beam", "1")
        out = generate(data, checkpoint, *compiled, "--draft-levels", "0", "--beam", "1",
                       env={"PATH": path})  # fmt: skip
        assert hypotheses(out) == hypotheses(greedy)
        assert "draft levels 0" in out and "failed" not in out


def test_speculative_decoding_through_fairseq_generate_and_interactive(data, tmp_path):
    """``fairseq-generate --task speculative_translation --draft-levels R --draft-tokens K``
    (and ``auto``) translates the test set exactly as plain greedy decoding does, logs its
    acceptance, refuses a beam and a depth it cannot draft naming the flag; ``fairseq-interactive``
    takes the same flags. A RingFormer trained with --mixed-depth-levels random."""
    train(data, tmp_path, "ringformer_tiny", 9, "--decoder-layers", "4", "--mixed-depth", "on",
          "--mixed-depth-levels", "random")  # fmt: skip
    checkpoint = tmp_path / "checkpoint_last.pt"

    def hypotheses(out: str) -> dict[str, str]:
        return dict(re.findall(r"^H-(\d+)\t\S+\t(.*)$", out, flags=re.M))

    plain = generate(data, checkpoint, "--beam", "1")
    for levels, tokens in (("1", "3"), ("3", "6"), ("auto", "2")):
        out = generate(data, checkpoint, "--beam", "1", "--task", "speculative_translation",
                       "--draft-levels", levels, "--draft-tokens", tokens)  # fmt: skip
        assert hypotheses(out) == hypotheses(plain)
        assert len(hypotheses(out)) == SIZES["test"]
        assert re.search(r"speculation: \d+ verifications, [\d.]+ drafts accepted", out)
    with pytest.raises(AssertionError, match="--beam 3: speculative decoding decodes greedily"):
        generate(data, checkpoint, "--task", "speculative_translation", "--draft-levels", "1")
    with pytest.raises(AssertionError, match="--draft-levels=4: the draft runs 1 to 3"):
        generate(data, checkpoint, "--beam", "1", "--task", "speculative_translation",
                 "--draft-levels", "4")  # fmt: skip
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(data / "spm.model"))
    sources = (data / "test.raw.de").read_text(encoding="utf-8").splitlines()[:3]
    stdin = "".join(" ".join(sp.encode(s, out_type=str)) + "\n" for s in sources)
    outputs = [
        fairseq(
            "interactive",
            str(data),
            "--user-dir",
            "user_dir",
            "--cpu",
            "--beam",
            "1",
            "--path",
            str(checkpoint),
            "--source-lang",
            "de",
            "--target-lang",
            "en",
            *extra,
            stdin=stdin,
        )  # fmt: skip
        for extra in ((), ("--task", "speculative_translation", "--draft-levels", "2"))
    ]
    translations = [re.findall(r"^D-\d+\t\S+\t(.*)$", out, flags=re.M) for out in outputs]
    assert translations[0] == translations[1] and len(translations[0]) == 3


def test_exits_through_fairseq_generate_and_interactive(data, tmp_path):
    """``fairseq-generate --task speculative_translation --exit-test T --exit-threshold X``
    decodes the test set under beam search with rows leaving the level loop early, logs how
    many levels they ran, decodes as plain beam search where no row can exit, and refuses
    impossible settings naming the flag; ``fairseq-interactive`` takes the same flags."""
    train(data, tmp_path, "ringformer_tiny", 9, "--decoder-layers", "4", "--mixed-depth", "on",
          "--mixed-depth-levels", "random")  # fmt: skip
    checkpoint = tmp_path / "checkpoint_last.pt"

    def hypotheses(out: str) -> dict[str, str]:
        return dict(re.findall(r"^H-(\d+)\t\S+\t(.*)$", out, flags=re.M))

    task = ("--task", "speculative_translation")
    plain = generate(data, checkpoint)
    never = generate(data, checkpoint, *task, "--exit-test", "saturation", "--exit-threshold",
                     "1")  # fmt: skip
    assert hypotheses(never) == hypotheses(plain)
    out = generate(data, checkpoint, *task, "--exit-test", "margin", "--exit-threshold", "0",
                   "--min-exit-level", "2")  # fmt: skip
    assert len(hypotheses(out)) == SIZES["test"]
    assert re.search(r"exits \(margin >= 0, from level 2\): rows ran 2\.00 of 4 levels", out)
    with pytest.raises(AssertionError, match=r"--exit-threshold=1.5: the margin test's confid"):
        generate(data, checkpoint, *task, "--exit-test", "margin", "--exit-threshold", "1.5")
    with pytest.raises(AssertionError, match=r"--min-exit-level=4: rows exit after 1 to 3 of"):
        generate(data, checkpoint, *task, "--exit-test", "margin", "--min-exit-level", "4")
    with pytest.raises(AssertionError, match=r"--exit-classifier=None: the classifier test"):
        generate(data, checkpoint, *task, "--exit-test", "classifier")
    with pytest.raises(AssertionError, match=r"--print-alignment: not with --exit-test"):
        generate(data, checkpoint, *task, "--exit-test", "margin", "--print-alignment")
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(data / "spm.model"))
    sources = (data / "test.raw.de").read_text(encoding="utf-8").splitlines()[:2]
    interactive = fairseq(
        "interactive", str(data), "--user-dir", "user_dir", "--cpu", "--beam", "2", "--path",
        str(checkpoint), "--source-lang", "de", "--target-lang", "en", *task, "--exit-test",
        "saturation", "--exit-threshold", "0.5",
        stdin="".join(" ".join(sp.encode(s, out_type=str)) + "\n" for s in sources),
    )  # fmt: skip
    assert len(re.findall(r"^D-\d+\t", interactive, flags=re.M)) == 2
    assert "rows ran" in interactive
