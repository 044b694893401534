"""Self-speculative decoding (recurnmt/modules/decoding/speculative.py, recurnmt/nmt/speculative.py):
greedy output equals fairseq's own beam-1 search token for token, samples follow the plain
sampler's distribution, bad settings fail at once naming their flag, and a verification asks
the host for nothing per level."""

from __future__ import annotations

import itertools
import time

import pytest
import torch
from fairseq.sequence_generator import SequenceGenerator

from recurnmt.analysis.dispatch import SimulatedDevice, count_dispatch
from recurnmt.modules.decoding.kv_cache import KVCache
from recurnmt.modules.decoding.rules import TokenRule
from recurnmt.nmt.architectures import FAMILIES
from recurnmt.nmt.speculative import SpeculativeSequenceGenerator
from tests.nmt_helpers import DICT, batch, build, train_signals

DRAFTING = [f for f in FAMILIES if f != "universal_transformer_act"]  # ACT is refused


def _model(arch: str, *extra: str, levels: int = 4, seed: int = 0):
    torch.manual_seed(seed)
    model, _, _ = build(arch, "--decoder-layers", str(levels), *extra)
    train_signals(model)
    return model.eval()


def _eos_likelier(model, factor: float = 3.0) -> None:
    """Scales eos's output embedding: sentences of random models then end, at various steps."""
    decoder = model.decoder
    out = decoder.output_projection
    weight = decoder.embed_tokens.weight if out is None else out.weight
    with torch.no_grad():
        weight[DICT.eos()] *= factor


def _quiet_deep_levels(model, draft_levels: int, scale: float) -> None:
    """Scales the residual branches of the levels after the draft's (unique blocks: a
    recurrent_transformer), so that the full model agrees with the draft (scale 0) or mostly
    does (a small scale): every acceptance path is taken."""
    stack = model.decoder.stack
    with torch.no_grad():
        for i in range(draft_levels, stack.num_levels):
            block = stack.block_of_level(i)
            for linear in (block.self_attn.out_proj, block.cross_attn.out_proj, block.ffn.down):
                linear.weight.mul_(scale)
                linear.bias.mul_(scale)


def _sample(bsz: int = 5, seed: int = 1):
    src, lengths, _ = batch(seed=seed, bsz=bsz)
    return {"net_input": {"src_tokens": src, "src_lengths": lengths}}


def _hypos(generator, model, sample):
    return [(h[0]["tokens"], h[0]["positional_scores"], h[0]["score"]) for h in
            generator.generate([model], sample)]  # fmt: skip


def _assert_same(got, want):
    assert len(got) == len(want)
    for (tokens, scores, score), (want_tokens, want_scores, want_score) in zip(
        got, want, strict=True
    ):
        assert tokens.tolist() == want_tokens.tolist()
        torch.testing.assert_close(scores, want_scores, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(score, want_score, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("family", DRAFTING)
def test_greedy_equals_fairseqs_beam_one_for_every_family(family):
    model = _model(f"{family}_tiny")
    sample = _sample()
    want = _hypos(SequenceGenerator([model], DICT, beam_size=1, max_len_b=12), model, sample)
    for levels, tokens in [(0, 4), *itertools.product((1, 2, 3), (1, 4))]:  # 0: no draft
        spec = SpeculativeSequenceGenerator(
            [model], DICT, beam_size=1, max_len_b=12, draft_levels=levels, draft_tokens=tokens
        )
        _assert_same(_hypos(spec, model, sample), want)


@pytest.mark.parametrize("scale", [0.0, 0.05, 0.3], ids=["agrees", "mostly", "often not"])
@pytest.mark.parametrize("tokens", [1, 3, 8])
def test_greedy_is_exact_through_every_acceptance(scale, tokens):
    """A draft the full model agrees with (every draft accepted, the bonus token taken), one it
    mostly agrees with (rows accepting different numbers, the batch advancing by the least)
    and one it often does not: the output is fairseq's beam-1 search's, with its scores, and
    the options that change the log-probabilities (min length, unk penalty, temperature,
    length penalty) are honoured."""
    model = _model("recurrent_transformer_tiny")
    _quiet_deep_levels(model, 1, scale)
    _eos_likelier(model)
    sample = _sample(bsz=6, seed=3)
    options = dict(beam_size=1, max_len_b=14, min_len=3, unk_penalty=0.5, temperature=0.7,
                   len_penalty=1.3)  # fmt: skip
    want = _hypos(SequenceGenerator([model], DICT, **options), model, sample)
    plain = SpeculativeSequenceGenerator([model], DICT, draft_levels=0, **options)
    _assert_same(_hypos(plain, model, sample), want)  # the loop without drafts
    assert plain.stats.drafted == 0 and plain.stats.tokens_per_verification == 1
    spec = SpeculativeSequenceGenerator(
        [model], DICT, draft_levels=1, draft_tokens=tokens, **options
    )
    _assert_same(_hypos(spec, model, sample), want)
    stats = spec.stats
    assert stats.verifications > 0
    if scale == 0.0:  # all accepted: k + 1 tokens a verification, but where sentences end
        assert stats.mean_accepted > 0.6 * tokens
    lengths = {len(t) for t, _, _ in want}
    assert len(lengths) > 1  # rows finished at different steps


def test_a_long_max_length_is_forced_to_end():
    model = _model("ringformer_tiny")
    for max_len_b in (1, 2, 5):
        options = dict(beam_size=1, max_len_a=0, max_len_b=max_len_b)
        want = _hypos(SequenceGenerator([model], DICT, **options), model, _sample())
        spec = SpeculativeSequenceGenerator([model], DICT, draft_levels=2, draft_tokens=4,
                                            **options)  # fmt: skip
        got = _hypos(spec, model, _sample())
        _assert_same(got, want)
        assert max(len(t) for t, _, _ in got) <= max_len_b + 1


def test_draft_levels_auto_picks_the_fastest_and_decodes_the_same(monkeypatch):
    """``--draft-levels auto`` times every depth on the first batch, decoding without drafts
    among them, and keeps the fastest; no draft when it is the fastest (then nothing
    speculates)."""
    model = _model("universal_transformer_tiny")
    want = _hypos(SequenceGenerator([model], DICT, beam_size=1, max_len_b=10), model, _sample())
    spec = SpeculativeSequenceGenerator(
        [model], DICT, beam_size=1, max_len_b=10, draft_levels="auto", draft_tokens=3
    )
    _assert_same(_hypos(spec, model, _sample()), want)
    assert 0 <= spec.draft_levels < 4 and not spec.auto
    import recurnmt.nmt.speculative as nmt_speculative

    slow = nmt_speculative.SpeculativeSequenceGenerator._speculate

    def slower(self, *args):
        if args[-1]:  # every run with drafts slower than the one without
            time.sleep(0.2)
        return slow(self, *args)

    monkeypatch.setattr(nmt_speculative.SpeculativeSequenceGenerator, "_speculate", slower)
    spec = SpeculativeSequenceGenerator(
        [model], DICT, beam_size=1, max_len_b=10, draft_levels="auto", draft_tokens=3
    )
    _assert_same(_hypos(spec, model, _sample()), want)
    assert spec.draft_levels == 0
    _assert_same(_hypos(spec, model, _sample()), want)  # later batches: no draft
    assert spec.stats.drafted == 0


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"draft_levels": 4}, "--draft-levels=4: the draft runs 1 to 3 of the 4 levels"),
        ({"draft_levels": -1}, "--draft-levels=-1: the draft runs 1 to 3 of the 4 levels"),
        ({"draft_levels": "two"}, "--draft-levels='two': a number of levels, or auto"),
        ({"draft_levels": 1, "draft_tokens": 0}, "--draft-tokens=0: at least 1"),
        ({"draft_levels": 1, "beam_size": 4}, "--beam 4: speculative decoding decodes"),
        ({"draft_levels": 1, "no_repeat_ngram_size": 2}, "--no-repeat-ngram-size"),
    ],
)
def test_bad_settings_fail_at_once_naming_the_flag(kwargs, message):
    model = _model("ringformer_tiny")
    options = {"beam_size": 1, **kwargs}
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        SpeculativeSequenceGenerator([model], DICT, **options)


def test_models_that_cannot_draft_are_refused():
    act = _model("universal_transformer_act_tiny")
    with pytest.raises(ValueError, match="--draft-levels=1: ACT's halting mixes"):
        SpeculativeSequenceGenerator([act], DICT, beam_size=1, draft_levels=1)
    fairseq_model, _, _ = build("transformer", "--decoder-layers", "2")
    with pytest.raises(ValueError, match="this model's decoder is a TransformerDecoder"):
        SpeculativeSequenceGenerator([fairseq_model], DICT, beam_size=1, draft_levels=1)
    with pytest.raises(ValueError, match="--path: speculative decoding runs one model, not 2"):
        SpeculativeSequenceGenerator([act, act], DICT, beam_size=1, draft_levels=1)


def test_a_cache_truncates_to_what_was_accepted():
    cache = KVCache()
    kv = torch.randn(2, 3, 2, 5, 4)
    cache.append_pair(kv)
    cache.truncate(2)
    torch.testing.assert_close(cache.keys, kv[0, :, :, :2])
    more = torch.randn(2, 3, 2, 1, 4)
    keys, values = cache.append_pair(more)
    torch.testing.assert_close(values[:, :, 2], more[1, :, :, 0])
    with pytest.raises(ValueError, match="cannot truncate a cache of 3 positions to 4"):
        cache.truncate(4)


# ---- sampling ------------------------------------------------------------------------------


def _distributions(model, src, lengths, rule: TokenRule, steps: int = 2) -> list[torch.Tensor]:
    """The exact distributions of the first ``steps`` tokens of the full model's sampler,
    marginalised over the earlier ones (every prefix enumerated)."""
    eos, vocab = DICT.eos(), len(DICT)
    with torch.no_grad():
        enc = model.encoder(src, lengths)
        first = model.decoder(torch.tensor([[eos]]), enc)[0][:, -1:]
        p1 = rule.probs(rule.lprobs(first, 0))[0, 0]
        prefixes = torch.stack([torch.full((vocab,), eos), torch.arange(vocab)], 1)
        enc2 = model.encoder.reorder_encoder_out(enc, torch.zeros(vocab, dtype=torch.long))
        second = model.decoder(prefixes, enc2)[0][:, -1:]
        p2 = rule.probs(rule.lprobs(second, 1))[:, 0]  # V (first token) x V
    return [p1, p1 @ p2]


@pytest.mark.parametrize(
    "topk,topp", [(0, 0.0), (8, 0.0), (0, 0.7)], ids=["full", "top-8", "top-0.7"]
)
def test_sampling_is_distributed_as_the_full_models(topk, topp, levels=1):
    """Speculative rejection sampling: the first two tokens of 6,000 speculative samples
    (drafts from 1 of 4 levels, 3 at a time) against the full model's exact distributions, in
    total variation; a rule that accepted every draft would be far off (checked here too)."""
    torch.manual_seed(0)
    model = _model("ringformer_tiny", levels=4)
    src, lengths, _ = batch(seed=2, bsz=1)
    rule = TokenRule(sampling=True, temperature=1.3, topk=topk, topp=topp)
    exact = _distributions(model, src, lengths, rule)
    n = 6000
    sample = {"net_input": {"src_tokens": src.expand(n, -1), "src_lengths": lengths.expand(n)}}
    generator = SpeculativeSequenceGenerator(
        [model], DICT, beam_size=1, max_len_b=3, min_len=3, draft_levels=levels, draft_tokens=3,
        temperature=1.3, search_strategy=_sampling(topk, topp),
    )  # fmt: skip
    hypos = generator.generate([model], sample)
    tokens = torch.stack([h[0]["tokens"][:2] for h in hypos])  # n x 2
    for step, p in enumerate(exact):
        seen = torch.bincount(tokens[:, step], minlength=len(DICT)).float() / n
        tv = 0.5 * (seen - p).abs().sum().item()
        assert tv < 0.045, f"token {step + 1}: total variation {tv:.3f} from the exact distribution"
    # each row accepted some drafts and rejected others (the batch advances by the least)
    assert 0 < generator.stats.row_accepted < 3 or levels == 0


def test_sampling_without_drafts_is_the_full_models():
    """``--draft-levels 0``: the same loop samples the full model one token at a time."""
    test_sampling_is_distributed_as_the_full_models(8, 0.0, levels=0)


def _sampling(topk: int, topp: float):
    from fairseq import search

    return search.Sampling(DICT, topk if topk else -1, topp if topp else -1.0)


def test_a_wrong_acceptance_rule_would_fail_the_sampling_test(monkeypatch):
    """The test above has the power to see a wrong rule: accepting every draft gives the
    draft's distribution, which is far from the full model's here."""
    from recurnmt.modules.decoding import speculative

    def accept_all(self, lprobs, drafted, draft_probs, generator):
        return drafted.new_full((drafted.size(0),), drafted.size(1))

    monkeypatch.setattr(speculative.SelfSpeculation, "_agreement", accept_all)
    with pytest.raises(AssertionError, match="total variation"):
        test_sampling_is_distributed_as_the_full_models(0, 0.0)


# ---- the host's work --------------------------------------------------------------------------


def _speculate_once(model, sim: SimulatedDevice, compiled: bool = False):
    """One batch decoded with speculation on the simulated device, every row to the maximum
    length; returns the dispatch log and the number of verifications. ``compiled``: through the
    compiled path's code (fused rounds from --min-len 1 on), run as Python: what
    torch.compile compiles."""
    lengths = dict(max_len_b=16, min_len=1) if compiled else dict(max_len_b=9, min_len=9)
    spec = SpeculativeSequenceGenerator(
        [model], DICT, beam_size=1, max_len_a=0, draft_levels=1, draft_tokens=3,
        compiled=compiled, **lengths,
    )  # fmt: skip
    sample = _sample(bsz=3)
    with torch.no_grad(), sim:
        sim.module(model)
        sample = {"net_input": {k: sim.tensor(v) for k, v in sample["net_input"].items()}}
        with count_dispatch() as log:
            spec.generate([model], sample)
    assert not compiled or spec.stats.rounds > 0
    return log, spec.stats.verifications


@pytest.mark.parametrize("compiled", [False, True], ids=["passes", "fused rounds"])
@pytest.mark.parametrize("family", ["ringformer", "relaxed_transformer", "universal_transformer"])
def test_a_verification_waits_on_the_device_once_and_copies_nothing_to_it(
    family, compiled, monkeypatch
):
    """On a (simulated) CUDA device the host waits on the device once a greedy verification
    (what is accepted and which rows end, read together), none per level or drafted token (at
    4 and at 8 levels), plus a few times a batch (the encoder, the rows that leave); no tensor
    made on the CPU is copied to the device. The same for a fused greedy round of
    --compile-decoding (one read a round), its code run as Python.
    torch's lower-right causal bias (a tensor subclass) cannot be made under a dispatch mode:
    the same band as a boolean mask takes its place here."""
    from recurnmt.modules import attention

    sim = SimulatedDevice("cuda")
    if not sim.supported():
        pytest.skip("this torch's Python indexing takes a CUDA device guard, which needs a GPU")

    def band(t, s, device):
        return torch.ones(t, s, dtype=torch.bool, device=device).tril(s - t)

    monkeypatch.setattr(attention, "causal_lower_right", band)
    if compiled:  # the compiled path's functions, uncompiled (a dispatch mode traces nothing)
        from recurnmt.modules.decoding import speculative

        monkeypatch.setattr(speculative, "compiled_decoding", lambda owner, key, fn: fn)
    extra = {}
    for levels in (4, 8):
        model = _model(f"{family}_tiny", levels=levels)
        log, verifications = _speculate_once(model, sim, compiled)
        assert not log.to_device, [(e.op, e.where) for e in log.to_device]
        extra[levels] = len(log.syncs) - verifications
    assert 0 <= extra[4] <= 6 and 0 <= extra[8] <= 6, extra


# ---- compiled passes (--compile-decoding) --------------------------------------------------


@pytest.mark.parametrize(
    "family,levels,tokens",
    [("ringformer", 0, 1), ("universal_transformer", 2, 2), ("relaxed_transformer", 1, 3)],
)  # fmt: skip
def test_compiled_passes_decode_as_fairseqs_beam_one(family, levels, tokens):
    """``compiled``: the draft passes and verifications compiled by torch.compile over a
    static-shape cache (truncated by moving its position back, rows leaving the batch into
    smaller buffers) give fairseq's beam-1 search's output, in a batch whose rows end at
    different steps and across a length bucket (float64: fused kernels sum in another
    order)."""
    model = _model(f"{family}_tiny").double()
    if family != "universal_transformer":  # whose rows would all end at the first step
        _eos_likelier(model, 4.0)  # the relaxed model's rows then end at steps 1 and 12
    sample = _sample(bsz=6, seed=3)
    fused = 0
    for options in (dict(max_len_b=12, unk_penalty=0.5), dict(max_len_b=40, min_len=34)):
        want = _hypos(SequenceGenerator([model], DICT, beam_size=1, **options), model, sample)
        spec = SpeculativeSequenceGenerator(
            [model], DICT, beam_size=1, draft_levels=levels, draft_tokens=tokens, compiled=True,
            **options,
        )  # fmt: skip
        _assert_same(_hypos(spec, model, sample), want)
        assert spec.compiled  # no compilation failed
        # greedy: rounds fused into one compiled call, the others (the first, before
        # --min-len, near the maximum length) pass by pass
        assert spec.stats.rounds < spec.stats.verifications, spec.stats.summary()
        fused += spec.stats.rounds
        lengths = sorted(len(t) for t, _, _ in want)
        if "min_len" in options:
            assert lengths[0] > 33  # a second length bucket
        elif family == "relaxed_transformer":
            assert lengths[0] < lengths[-1]  # rows left the batch at different steps
    assert fused > 0
    from recurnmt.modules.decoding.compiled import _DECODING

    # the model's own compiled verification and round (one per model and setting)
    compiled = _DECODING[model.decoder.stack]
    assert ("speculation", 1, tuple(range(levels, 4))) in compiled
    round_key = ("speculation round", tuple(range(levels)), tuple(range(levels, 4)))
    assert (*round_key, tokens if levels else 0) in compiled


def test_compiled_sampling_draws_as_the_eager_passes():
    """Sampling with compiled passes: the same generator seed draws the same tokens as the
    eager passes (the token rule runs outside the compiled code; float64)."""
    model = _model("ringformer_tiny").double()
    sample = _sample(bsz=3, seed=5)
    outs = []
    for compiled in (False, True):
        torch.manual_seed(7)
        generator = SpeculativeSequenceGenerator(
            [model], DICT, beam_size=1, max_len_b=6, draft_levels=2, draft_tokens=2,
            search_strategy=_sampling(0, 0.0), compiled=compiled,
        )  # fmt: skip
        outs.append([t.tolist() for t, _, _ in _hypos(generator, model, sample)])
    assert outs[0] == outs[1]


def test_compiled_passes_that_fail_to_compile_run_eagerly(monkeypatch, caplog):
    """A pass torch.compile cannot compile: one warning naming the flag, the eager passes
    from then on, the same output."""
    from recurnmt.modules.decoding import speculative

    def broken(*args):
        raise RuntimeError("InductorError: no C++ compiler found\ndetail")

    monkeypatch.setattr(speculative, "compiled_decoding", lambda owner, key, fn: broken)
    model = _model("ringformer_tiny")
    sample = _sample()
    options = dict(beam_size=1, max_len_b=12)
    want = _hypos(SequenceGenerator([model], DICT, **options), model, sample)
    spec = SpeculativeSequenceGenerator(
        [model], DICT, draft_levels=1, draft_tokens=2, compiled=True, **options
    )
    with caplog.at_level("WARNING", logger="recurnmt.nmt.speculative"):
        _assert_same(_hypos(spec, model, sample), want)
        _assert_same(_hypos(spec, model, sample), want)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == [
        "--compile-decoding: compiling a pass failed (InductorError: no C++ compiler found); "
        "eager from now on"
    ]
    assert not spec.compiled
