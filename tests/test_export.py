"""``recurnmt.export`` / ``recurnmt.hf``: every NMT family as a transformers model.

The exported model runs recurnmt's own stacks, so its logits are fairseq's up to float
rounding; ``save_pretrained`` stores every shared tensor once and ``from_pretrained`` (through
the Auto classes) ties them again; transformers' greedy and beam search with recurnmt's cache
give fairseq's ``SequenceGenerator`` output. Trained checkpoints and the command line are in
``tests/test_export_e2e.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from fairseq.sequence_generator import SequenceGenerator
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForSeq2SeqLM

import recurnmt.hf  # noqa: F401  (registers the model type)
from recurnmt.export import add_remote_code, convert, generation_config, read_checkpoint
from recurnmt.hf import RecurnmtCache, RecurnmtForConditionalGeneration, RecurnmtTokenizer
from recurnmt.nmt.build import arch_train_args
from tests.nmt_helpers import DICT, batch, build, train_signals

FAMILIES = {
    "ringformer_tiny": ["--share-all-embeddings"],
    "universal_transformer_tiny": [],
    "universal_transformer_act_tiny": ["--share-all-embeddings"],
    "recurrent_transformer_tiny": [],
    "owf_tiny": ["--share-all-embeddings"],
    "sret_tiny": ["--share-encoder-decoder-embeddings", "--output-projection-bias"],
    "relaxed_transformer_tiny": ["--decoder-layers", "4", "--decoder-unique-layers", "2"],
}
MAX_LEN = 10


def _exported(arch: str):
    model, args, task = build(arch, *FAMILIES[arch])
    train_signals(model)
    model.eval()
    hf = convert(model, args, arch)
    hf.generation_config = generation_config(hf, beam=4, lenpen=1.0, max_len_b=MAX_LEN)
    return model, hf, task


@pytest.mark.parametrize("arch", FAMILIES)
@pytest.mark.smoke
def test_round_trip_keeps_the_logits_and_stores_shared_tensors_once(arch, tmp_path):
    model, hf, _ = _exported(arch)
    src, lengths, prev = batch()
    with torch.no_grad():
        theirs, _ = model(src, lengths, prev)
        ours = hf(input_ids=src, decoder_input_ids=prev).logits
    assert (ours - theirs).abs().max() <= 1e-5

    hf.save_pretrained(tmp_path)
    assert type(AutoConfig.from_pretrained(tmp_path)).__name__ == "RecurnmtConfig"
    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    assert isinstance(loaded, RecurnmtForConditionalGeneration)
    with torch.no_grad():
        again = loaded(input_ids=src, decoder_input_ids=prev).logits
    assert (again - theirs).abs().max() <= 1e-5
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        stored = len(list(f.keys()))
    assert stored == len({id(p) for p in model.parameters()})  # each shared tensor once
    shared = {id(p) for p in loaded.parameters()}
    assert len(shared) == stored  # and tied again on loading


@pytest.mark.parametrize(
    "flags",
    [
        ["--output-projection-bias", "--scale-embedding", "off"],  # the authors' code
        ["--block-bias", "on", "--level-signal-down-init", "kaiming"],  # recurnmt before
    ],
    ids=["authors", "before"],
)
def test_ringformer_exports_as_its_authors_built_it_and_as_before(flags):
    """The authors' choices travel in the exported config: bias-free blocks and the signals'
    initialisation in each side's StackConfig, the unscaled embeddings in scale_embedding;
    an embedding per side and a head with a bias in the layout fields."""
    model, args, _ = build("ringformer_tiny", *flags)
    train_signals(model)
    model.eval()
    hf = convert(model, args, "ringformer_tiny")
    authors = "--scale-embedding" in flags
    assert hf.config.encoder_stack["bias"] is hf.config.decoder_stack["bias"] is not authors
    assert hf.config.encoder_stack["signal"]["down_init"] == ("normal" if authors else "kaiming")
    assert hf.config.scale_embedding is not authors
    assert not hf.config.share_input_embeddings and not hf.config.tie_output_projection
    assert hf.config.output_projection_bias is authors
    src, lengths, prev = batch()
    with torch.no_grad():
        theirs, _ = model(src, lengths, prev)
        ours = hf(input_ids=src, decoder_input_ids=prev).logits
    assert (ours - theirs).abs().max() <= 1e-5


@pytest.mark.parametrize(
    "flags",
    [
        ["--encoder-learned-pos", "--decoder-learned-pos", "--layernorm-embedding"],
        ["--no-token-positional-embeddings", "--no-scale-embedding"],
    ],
    ids=["learned+ln", "none+unscaled"],
)
def test_the_token_front_end_is_one_config_in_both_front_ends(flags):
    """The translation model's TokenConfig is the exported config's, field for field, and
    the exported front end embeds as the translation one."""
    from recurnmt.nmt.embedding import token_config

    model, args, _ = build("recurrent_transformer_tiny", *flags)
    model.eval()
    hf = convert(model, args, "recurrent_transformer_tiny")
    assert hf.config.tokens == token_config(args, "encoder") == model.encoder.embed.tokens
    assert hf.encoder.embed.embed_scale == model.encoder.embed.embed_scale
    src, lengths, prev = batch()
    with torch.no_grad():
        theirs, _ = model(src, lengths, prev)
        ours = hf(input_ids=src, decoder_input_ids=prev).logits
    assert (ours - theirs).abs().max() <= 1e-5


def test_token_front_ends_that_differ_by_side_are_refused_naming_the_flags():
    model, args, _ = build("recurrent_transformer_tiny", "--decoder-learned-pos")
    with pytest.raises(ValueError, match="token front ends must agree.*--decoder-learned-pos"):
        convert(model, args, "recurrent_transformer_tiny")


def test_a_token_config_refuses_an_unknown_kind_of_positions():
    from recurnmt.modules import ConfigError
    from recurnmt.modules.tokens import TokenConfig

    with pytest.raises(ConfigError, match="positions='rotary': sinusoidal, learned or none"):
        TokenConfig(positions="rotary")
    config = TokenConfig("learned", False, True)
    assert TokenConfig.from_dict({**config.to_dict(), "d_model": 8}) == config


def test_the_cache_decodes_step_by_step_as_the_full_pass():
    _, hf, _ = _exported("ringformer_tiny")
    src, _, prev = batch()
    with torch.no_grad():
        full = hf(input_ids=src, decoder_input_ids=prev, use_cache=False).logits
        memory = hf.get_encoder()(src)
        cache = RecurnmtCache()
        steps = []
        for t in range(prev.size(1)):
            out = hf(
                input_ids=src,
                encoder_outputs=memory,
                decoder_input_ids=prev[:, t : t + 1],
                past_key_values=cache,
            )
            steps.append(out.logits)
            cache = out.past_key_values
    assert cache.steps == prev.size(1)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)


# ACT's halting is a threshold: on random weights a 1e-7 rounding difference can flip a halt
# and so a near-tied beam; the trained checkpoints of test_export_e2e cover it
@pytest.mark.parametrize("arch", FAMILIES)
@pytest.mark.parametrize("beam", [1, 4])
def test_generate_gives_fairseqs_search(arch, beam):
    model, hf, task = _exported(arch)
    src, lengths, _ = batch(seed=1, bsz=4)
    generator = SequenceGenerator(
        [model], task.target_dictionary, beam_size=beam, max_len_b=MAX_LEN
    )
    with torch.no_grad():
        fairseq_out = generator.generate(
            [model], {"net_input": {"src_tokens": src, "src_lengths": lengths}}
        )
        ours = hf.generate(input_ids=src, attention_mask=src.ne(DICT.pad()).long(), num_beams=beam)
    for i, hyps in enumerate(fairseq_out):
        tokens = [t for t in ours[i, 1:].tolist() if t != DICT.pad()]  # after the </s> start
        assert tokens == hyps[0]["tokens"].tolist()


def test_tokenizers_follow_the_fairseq_dictionary(tmp_path):
    from data_prep.embedded import SHIPPED_DIR
    from data_prep.wordpiece import fairseq_symbols, load_wordpiece_tokenizer
    from tests.test_data_prep_wordpiece import FIXTURE

    wordpiece = load_wordpiece_tokenizer(FIXTURE)
    vocab = tmp_path / "dict.txt"
    vocab.write_text("".join(f"{s}\n" for s in fairseq_symbols(wordpiece)), encoding="utf-8")
    tok = RecurnmtTokenizer(str(vocab), wordpiece_file=str(FIXTURE / "vocab.txt"))
    text = "Wählen Sie eine Farbe aus."
    ids = tok(text)["input_ids"]
    pieces = wordpiece.tokenize(text)
    assert ids == [*wordpiece.convert_tokens_to_ids(pieces), tok.eos_token_id]  # ids >= 4 agree
    assert tok.eos_token_id == 2 and tok.decode(ids, skip_special_tokens=True) == text

    spm_dict = tmp_path / "spm_dict.txt"
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor(model_file=str(SHIPPED_DIR / "spm.model"))
    symbols = ["<s>", "<pad>", "</s>", "<unk>"] + [sp.id_to_piece(i) for i in range(1, 200)]
    spm_dict.write_text("".join(f"{s}\n" for s in symbols), encoding="utf-8")
    tok = RecurnmtTokenizer(str(spm_dict), spm_file=str(SHIPPED_DIR / "spm.model"))
    tok.save_pretrained(tmp_path / "saved")
    again = RecurnmtTokenizer.from_pretrained(tmp_path / "saved")
    ids = again("Wählen Sie")["input_ids"]
    assert ids[-1] == 2 and again.decode(ids, skip_special_tokens=True) == "Wählen Sie"
    assert again.convert_tokens_to_ids(sp.id_to_piece(5000)) == 3  # not in the dictionary
    assert again.decode([symbols.index("▁Sie"), 2], skip_special_tokens=True) == "Sie"


def test_a_checkpoint_that_is_no_recurnmt_model_is_refused(tmp_path):
    junk = tmp_path / "model.pt"
    junk.write_text("not a checkpoint")
    with pytest.raises(ValueError, match=r"model\.pt is not a fairseq checkpoint"):
        read_checkpoint(junk)
    args = arch_train_args("transformer_iwslt_de_en")  # fairseq's own model: not ours
    vanilla = tmp_path / "vanilla.pt"
    history = [{"criterion_name": "CrossEntropyCriterion", "optimizer_name": "Adam",
                "lr_scheduler_state": {"best": None}, "num_updates": 0}]  # fmt: skip
    extra = {"train_iterator": {"epoch": 1}, "val_loss": None}
    torch.save(
        {"args": args, "model": {}, "optimizer_history": history, "extra_state": extra}, vanilla
    )
    with pytest.raises(ValueError, match="'transformer_iwslt_de_en' model, not a recurnmt"):
        read_checkpoint(vanilla)
    with pytest.raises(FileNotFoundError, match="gone.pt"):
        read_checkpoint(tmp_path / "gone.pt")


def test_translation_pipeline_loads_the_directory(tmp_path):
    """transformers 5 dropped the task; importing recurnmt.hf serves it again."""
    from transformers import pipeline

    from data_prep.embedded import SHIPPED_DIR

    _, hf, _ = _exported("ringformer_tiny")
    hf.save_pretrained(tmp_path)
    vocab = tmp_path / "dict.txt"
    vocab.write_text("".join(f"{s}\n" for s in DICT.symbols), encoding="utf-8")
    tokenizer = RecurnmtTokenizer(str(vocab), spm_file=str(SHIPPED_DIR / "spm.model"))
    tokenizer.save_pretrained(tmp_path)
    translate = pipeline("translation", model=str(tmp_path))
    inputs = tokenizer("Wählen Sie", return_tensors="pt")
    expected = tokenizer.decode(hf.generate(**inputs)[0], skip_special_tokens=True)
    assert translate("Wählen Sie") == [{"translation_text": expected}]


LOAD_ELSEWHERE = """
import sys
if sys.argv[2] == "missing":
    sys.modules["recurnmt"] = None  # as in an environment without recurnmt
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer
for auto in (AutoModelForSeq2SeqLM, AutoTokenizer):
    for trust in (False, True):
        try:
            loaded = auto.from_pretrained(sys.argv[1], trust_remote_code=trust)
        except Exception as err:
            print(auto.__name__, trust, type(err).__name__, str(err).replace(chr(10), " "))
        else:
            print(auto.__name__, trust, "loaded", type(loaded).__name__)
"""


def _load_elsewhere(directory, recurnmt: str) -> dict[tuple[str, str], str]:
    """What each Auto class does with ``directory`` in a fresh process, with recurnmt
    ``missing`` or ``installed`` (but not imported): ``{(class, trust): outcome}``."""
    env = {**os.environ, "HF_MODULES_CACHE": str(directory.parent / "modules")}
    proc = subprocess.run(
        [sys.executable, "-c", LOAD_ELSEWHERE, str(directory), recurnmt],
        capture_output=True, text=True, env=env, cwd=directory.parent,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {tuple(line.split()[:2]): line.split(maxsplit=2)[2] for line in proc.stdout.splitlines()}


def test_an_exported_directory_says_what_is_missing_without_recurnmt(tmp_path):
    from data_prep.embedded import SHIPPED_DIR

    _, hf, _ = _exported("ringformer_tiny")
    out = tmp_path / "model"
    hf.save_pretrained(out)
    vocab = tmp_path / "dict.txt"
    vocab.write_text("".join(f"{s}\n" for s in DICT.symbols), encoding="utf-8")
    RecurnmtTokenizer(str(vocab), spm_file=str(SHIPPED_DIR / "spm.model")).save_pretrained(out)
    add_remote_code(out)
    config = json.loads((out / "config.json").read_text(encoding="utf-8"))
    assert (
        config["auto_map"]["AutoModelForSeq2SeqLM"]
        == "recurnmt_hf.RecurnmtForConditionalGeneration"
    )
    # the directory holds no block: its code only imports the installed package
    assert "import torch" not in (out / "recurnmt_hf.py").read_text(encoding="utf-8")

    missing = _load_elsewhere(out, "missing")
    for auto in ("AutoModelForSeq2SeqLM", "AutoTokenizer"):
        assert "trust_remote_code=True" in missing[auto, "False"]  # not "update Transformers"
        assert missing[auto, "True"].startswith("ModuleNotFoundError")
        assert "install the recurnmt package" in missing[auto, "True"]

    installed = _load_elsewhere(out, "installed")  # installed, never imported by the caller
    assert installed["AutoModelForSeq2SeqLM", "True"] == "loaded RecurnmtForConditionalGeneration"
    assert installed["AutoTokenizer", "True"] == "loaded RecurnmtTokenizer"

    # where recurnmt.hf is imported, the registered classes load it without remote code
    assert isinstance(AutoModelForSeq2SeqLM.from_pretrained(out), RecurnmtForConditionalGeneration)


def test_a_torchaudio_that_does_not_load_is_named_before_transformers_imports_it(
    tmp_path, monkeypatch
):
    from recurnmt.hf.environment import check_torchaudio

    check_torchaudio()  # this environment's torchaudio loads (or there is none)
    fake = tmp_path / "torchaudio"
    fake.mkdir()
    (fake / "__init__.py").write_text(  # what torchaudio 2.11.0 raises beside torch 2.6
        "raise OSError('_torchaudio.abi3.so: undefined symbol: aoti_torch_abi_version')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "torchaudio", raising=False)
    with pytest.raises(ImportError, match=r"torchaudio does not load with torch .*undefined sym"):
        check_torchaudio()
    with pytest.raises(ImportError, match=r"pip uninstall torchaudio, or install the torchaudio"):
        check_torchaudio()


@pytest.mark.parametrize("arch", ["ringformer_tiny", "relaxed_transformer_tiny"])
def test_generate_with_drafts_gives_the_same_output(arch):
    """``generate(draft_levels=R, draft_tokens=K)``: self-speculative greedy decoding of the
    exported model, token for token its plain ``generate()`` (and fairseq's search)."""
    _, hf, _ = _exported(arch)
    src, _, _ = batch(seed=1, bsz=4)
    mask = src.ne(DICT.pad()).long()
    with torch.no_grad():
        plain = hf.generate(input_ids=src, attention_mask=mask, num_beams=1)
        for levels, tokens in ((0, 4), (1, 2), (2, 4), (2, 1)):  # 0: the loop, no drafts
            drafted = hf.generate(
                input_ids=src, attention_mask=mask, num_beams=1, draft_levels=levels,
                draft_tokens=tokens,
            )  # fmt: skip
            width = min(plain.size(1), drafted.size(1))
            assert torch.equal(drafted[:, :width], plain[:, :width])
            assert (drafted[:, width:] == DICT.pad()).all() and (
                plain[:, width:] == DICT.pad()
            ).all()
    assert hf.last_speculation.verifications > 0
    with pytest.raises(ValueError, match="num_beams=4; greedy or do_sample"):
        hf.generate(input_ids=src, num_beams=4, draft_levels=1)
    with pytest.raises(ValueError, match="repetition_penalty=1.2 is not supported"):
        hf.generate(input_ids=src, num_beams=1, draft_levels=1, repetition_penalty=1.2)
    with pytest.raises(ValueError, match="draft_levels=9: the draft runs 1 to"):
        hf.generate(input_ids=src, num_beams=1, draft_levels=9)
