"""Beam search over fixed shapes (recurnmt/nmt/static_decoding.py) and its cache
(recurnmt/modules/decoding/static_cache.py): fairseq's hypotheses for every family, every row kept,
storage that never moves, the settings it refuses."""

from __future__ import annotations

import contextlib
import types

import pytest
import torch
from fairseq import search
from fairseq.sequence_generator import SequenceGenerator
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

from recurnmt.analysis.dispatch import SimulatedDevice, count_dispatch
from recurnmt.modules.attention import SelfAttention
from recurnmt.modules.decoding.kv_cache import KVCache
from recurnmt.modules.decoding.static_cache import (
    BUCKET,
    StaticKVCache,
    StaticStackCache,
    StepPosition,
)
from recurnmt.modules.decoding.static_steps import CapturedStep, StaticStep
from recurnmt.nmt.architectures import FAMILIES
from recurnmt.nmt.generation import decoding_side
from recurnmt.nmt.static_decoding import StaticSequenceGenerator
from tests.nmt_helpers import DICT, build
from tests.test_speculative import _eos_likelier, _model, _sample

SETTINGS = {
    "beam 4": dict(beam_size=4, max_len_b=12),
    "greedy": dict(beam_size=1, max_len_b=12),
    "across length buckets": dict(beam_size=2, max_len_b=70, min_len=66),  # 3 buckets
    "lenpen unkpen min/max len": dict(
        beam_size=3, max_len_b=5, len_penalty=0.6, unk_penalty=0.5, min_len=2
    ),
}


def _nbest(generator, model, sample):
    return [
        [(h["tokens"].tolist(), h["positional_scores"], h["score"]) for h in hypos]
        for hypos in generator.generate([model], sample)
    ]


def _assert_same_nbest(got, want):
    """The same hypotheses in the same order; scores equal to float rounding (attention over
    the whole buffer sums in another order)."""
    assert len(got) == len(want)
    for hypos, want_hypos in zip(got, want, strict=True):
        assert [h[0] for h in hypos] == [h[0] for h in want_hypos]
        for (_, scores, score), (_, want_scores, want_score) in zip(hypos, want_hypos, strict=True):
            torch.testing.assert_close(scores, want_scores, atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(score, want_score, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("family", FAMILIES)
def test_beam_search_equals_fairseqs_for_every_family(family, setting):
    """In float64: the static decoder sums attention over its whole buffer, in another order
    than fairseq's, and in float32 a random model's near-ties can then part the two on one
    CPU and not on another (ACT's halting threshold turns a rounding into another ponder
    count: across the length buckets, fairseq's float32 beams part from its own float64 ones,
    which the static decoder's float32 and float64 beams equal, on an AMD EPYC)."""
    model = _model(f"{family}_tiny").double()
    _eos_likelier(model)
    sample = _sample(bsz=6)
    options = SETTINGS[setting]
    want = _nbest(SequenceGenerator([model], DICT, **options), model, sample)
    got = _nbest(StaticSequenceGenerator([model], DICT, **options), model, sample)
    _assert_same_nbest(got, want)


def _eos_after_tokens(model, every: int = 5, bonus: float = 4.0) -> None:
    """eos likelier after a token that ``every`` divides, less likely after the others: a
    random model's sentences then end at steps that depend on what they generated."""
    decoder, last = model.decoder, {}
    decoder.embed_tokens.register_forward_pre_hook(lambda m, a: last.update(t=a[0][:, -1:]))
    plain = decoder.output_layer

    def output_layer(self, features):
        logits = plain(features)
        logits[..., DICT.eos()] += torch.where(last["t"] % every == 0, bonus, -bonus)
        return logits

    decoder.output_layer = types.MethodType(output_layer, decoder)


@pytest.mark.parametrize(
    "family,make_ends",
    [("universal_transformer_act", _eos_likelier), ("recurrent_transformer", _eos_after_tokens)],
)
def test_sentences_that_finish_at_different_steps_keep_their_rows(family, make_ends, monkeypatch):
    """fairseq drops a finished sentence's rows; here they stay, every reorder selects all
    rows of the batch into the same storage, and the hypotheses are still fairseq's."""
    model = _model(f"{family}_tiny")
    make_ends(model)
    sample = _sample(bsz=8)
    want = _nbest(SequenceGenerator([model], DICT, beam_size=4, max_len_b=12), model, sample)
    lengths = {len(hypos[0][0]) for hypos in want}
    assert len(lengths) >= 3, lengths  # the premise: sentences end at various steps
    seen = []
    reorder = StaticKVCache.reorder

    def spy(self, new_order):
        before = self.buffer.data_ptr() if self.buffer is not None else None
        out = reorder(self, new_order)
        seen.append((new_order.numel(), before, self.buffer.data_ptr()))
        return out

    monkeypatch.setattr(StaticKVCache, "reorder", spy)
    got = _nbest(StaticSequenceGenerator([model], DICT, beam_size=4, max_len_b=12), model, sample)
    _assert_same_nbest(got, want)
    assert seen and {rows for rows, _, _ in seen} == {8 * 4}
    assert all(before == after for _, before, after in seen)


def test_the_static_cache_attends_as_the_growing_one():
    """Step by step, self-attention over a static cache (the whole buffer, a key mask) equals
    attention over the default cache, through beam reorders; the filled keys agree."""
    torch.manual_seed(0)
    attn = SelfAttention(16, 4, causal=True).eval()
    growing, position = KVCache(), StepPosition(capacity=9, device="cpu")
    static = StaticKVCache(position)
    with torch.no_grad():
        for step in range(7):
            x = torch.randn(6, 1, 16)
            position.set(step)
            torch.testing.assert_close(
                attn(x, cache=static), attn(x, cache=growing), atol=1e-6, rtol=1e-5
            )
            order = torch.randperm(6)
            growing = growing.reorder(order)
            assert static.reorder(order) is static
    torch.testing.assert_close(static.keys, growing.keys)
    torch.testing.assert_close(static.values, growing.values)
    assert static.buffer.shape == (2, 6, 4, 9, 4)


def test_several_positions_attend_as_the_growing_cache_and_truncate():
    """Speculative decoding's use of a static cache: a verification writes several positions
    at once (query j attending to 0 .. its own position), a truncation moves the position back
    (the rejected positions stay in the buffer, masked, and are written over), and attention
    equals the default cache's throughout, across a length bucket."""
    torch.manual_seed(0)
    attn = SelfAttention(16, 4, causal=True).eval()
    growing, cache = KVCache(), StaticStackCache(64, "cpu")
    static = cache.level(0)
    step = 0
    with torch.no_grad():
        for count, keep in [(1, 1), (4, 2), (1, 1), (5, 5), (3, 1), (1, 1)] * 4:
            x = torch.randn(3, count, 16)
            cache.set_positions(step, count)
            want = attn(x, cache=growing)
            torch.testing.assert_close(attn(x, cache=static), want, atol=1e-6, rtol=1e-5)
            step += keep
            cache.truncate(step)
            growing.truncate(step)
    assert step == 44 and static.buffer.size(3) == 64  # the second bucket
    torch.testing.assert_close(static.keys, growing.keys)


def test_the_static_cache_refuses_what_would_change_its_shape():
    position = StepPosition(capacity=4, device="cpu")
    cache = StaticKVCache(position)
    position.set(0)
    cache.append_pair(torch.randn(2, 3, 2, 1, 4))
    with pytest.raises(ValueError, match="takes the step's 1 position\\(s\\), not 2"):
        cache.append_pair(torch.randn(2, 3, 2, 2, 4))
    with pytest.raises(ValueError, match="keeps its 3 rows; a step gave 2"):
        cache.append_pair(torch.randn(2, 2, 2, 1, 4))
    with pytest.raises(ValueError, match="keeps its 3 rows; the new order has 2"):
        cache.reorder(torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="positions 4 .. 4: the static-shape cache holds 4"):
        position.set(4)
    with pytest.raises(ValueError, match="positions 2 .. 4: the static-shape cache holds 4"):
        position.set(2, 3)
    with pytest.raises(ValueError, match="cannot truncate a cache of 0 positions to 1"):
        StaticStackCache(4, "cpu").truncate(1)
    with pytest.raises(ValueError, match="of 0 positions holds nothing"):
        StepPosition(0, "cpu")


@pytest.mark.parametrize(
    "options,message",
    [
        ({"search_strategy": search.Sampling(DICT)}, "--sampling, --diverse-beam-groups"),
        ({"no_repeat_ngram_size": 2}, "--no-repeat-ngram-size: not with static-shape decoding"),
        ({"match_source_len": True}, "--match-source-len: not with static-shape decoding"),
    ],
)
def test_settings_it_cannot_honour_are_refused_naming_the_flag(options, message):
    model = _model("ringformer_tiny")
    with pytest.raises(ValueError, match=message):
        StaticSequenceGenerator([model], DICT, beam_size=2, **options)


def test_models_it_cannot_decode_are_refused():
    model = _model("ringformer_tiny")
    fairseq_model, _, _ = build("transformer", "--decoder-layers", "2")
    with pytest.raises(ValueError, match="this model's decoder is a TransformerDecoder"):
        StaticSequenceGenerator([fairseq_model], DICT, beam_size=2)
    with pytest.raises(ValueError, match="--path: static-shape decoding runs one model, not 2"):
        StaticSequenceGenerator([model, model], DICT, beam_size=2)
    generator = StaticSequenceGenerator([model], DICT, beam_size=2)
    sample = _sample()
    with pytest.raises(ValueError, match="--prefix-size: not with static-shape decoding"):
        generator.generate([model], sample, prefix_tokens=sample["net_input"]["src_tokens"])


def _decode_on(sim: SimulatedDevice, model, max_len: int):
    generator = StaticSequenceGenerator(
        [model], DICT, beam_size=2, max_len_a=0, max_len_b=max_len, min_len=max_len
    )
    sample = _sample(bsz=3)
    with torch.no_grad(), sim:
        sim.module(model)
        sample = {"net_input": {k: sim.tensor(v) for k, v in sample["net_input"].items()}}
        with count_dispatch() as log:
            generator.generate([model], sample)
    return log


@pytest.mark.parametrize("family", ["ringformer", "relaxed_transformer", "universal_transformer"])
def test_a_step_waits_on_the_device_a_fixed_number_of_times_and_copies_nothing_to_it(family):
    """On a (simulated) CUDA device a step's host waits do not grow with the levels (4 or 8)
    or the steps beyond fairseq's own per-step reads of which hypotheses ended, and no tensor
    made on the CPU is copied to the device."""
    sim = SimulatedDevice("cuda")
    if not sim.supported():
        pytest.skip("this torch's Python indexing takes a CUDA device guard, which needs a GPU")
    syncs = {}
    for levels in (4, 8):
        for steps in (4, 8):
            log = _decode_on(sim, _model(f"{family}_tiny", levels=levels), steps)
            assert not log.to_device, [(e.op, e.where) for e in log.to_device]
            syncs[levels, steps] = len(log.syncs)
    assert syncs[4, 4] == syncs[8, 4] and syncs[4, 8] == syncs[8, 8], syncs
    per_step = (syncs[4, 8] - syncs[4, 4]) / 4
    assert per_step <= 1, syncs  # one read a step while no hypothesis ends (masked_select)


class _Operations(TorchDispatchMode):
    """The aten operations a region dispatches, each with its arguments' shapes and dtypes and
    its other arguments' values: what a CUDA graph captured at one step replays at another."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        def describe(a):
            return (tuple(a.shape), a.dtype, a.device.type) if isinstance(a, torch.Tensor) else a

        self.log.append((func, tree_map(describe, (args, kwargs or {}))))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("family", FAMILIES)
def test_a_step_dispatches_the_same_operations_at_every_position(family):
    """A captured CUDA graph replays the kernels of the step it was captured at, with the same
    shapes and the same constants: :class:`StaticStep` must dispatch the same operations with
    the same non-tensor arguments at every step after the first (only its buffers' values
    change), or a replay would compute another step than the one asked."""
    model = _model(f"{family}_tiny")
    src, lengths = (_sample(bsz=2)["net_input"][k] for k in ("src_tokens", "src_lengths"))
    beam, rows = 3, 6
    with torch.no_grad():
        encoder_out = model.encoder(src, lengths)
        decoder = decoding_side(model.decoder, encoder_out, group=beam)
        cache = StaticStackCache(8, "cpu")
        step = StaticStep(decoder, cache, rows)
        logs = {}
        for position in range(6):
            cache.set_position(position)
            step.tokens.copy_(torch.randint(4, len(DICT), (rows, 1)))
            with _Operations() as ops:
                step()
            logs[position] = ops.log
            cache.reorder(torch.randint(0, beam, (rows,)) + torch.arange(rows) // beam * beam)
    assert logs[1] and all(logs[p] == logs[1] for p in (2, 3, 5))
    assert logs[0] != logs[1]  # the first step projects the memory: never captured


def test_attention_reads_the_positions_of_a_length_bucket():
    """The keys a step reads grow by BUCKET positions at a time: the same shapes for every step
    of a bucket (one captured graph each), never the whole buffer at once."""
    position = StepPosition(capacity=2 * BUCKET + 5, device="cpu")
    cache = StaticKVCache(position)
    seen = {}
    for p in range(position.capacity):
        position.set(p)
        keys, _ = cache.append_pair(torch.randn(2, 1, 1, 1, 2))
        seen[p] = (keys.size(2), cache.key_mask.size(3), int(cache.key_mask.sum()))
    assert seen[0] == (BUCKET, BUCKET, 1) and seen[BUCKET - 1] == (BUCKET, BUCKET, BUCKET)
    assert seen[BUCKET] == (2 * BUCKET, 2 * BUCKET, BUCKET + 1)
    assert seen[2 * BUCKET] == (2 * BUCKET + 5, 2 * BUCKET + 5, 2 * BUCKET + 1)


class _FakeCuda:
    """torch.cuda's graph API on the CPU, for CapturedStep's bookkeeping: a "capture" runs the
    step once and records it; a "replay" runs it again into the captured output (what a
    correct graph computes); ``fail`` makes every capture raise as a capture error does."""

    def __init__(self, fail: bool = False) -> None:
        self.fail, self.captures, self.replays, self.pools = fail, 0, 0, []
        self.capturing = None

    def install(self, monkeypatch, captured) -> None:
        fake = self

        class Graph:
            def pool(self):
                return ("pool", id(fake))

            def replay(self):
                fake.replays += 1
                (logits,) = (out for graph, out in captured.graphs.values() if graph is self)
                logits.copy_(captured.step())

        class GraphContext:
            def __init__(self, graph, pool=None):
                self.graph = graph
                fake.pools.append(pool)

            def __enter__(self):
                if fake.fail:
                    raise RuntimeError("operation not permitted when stream is capturing")
                fake.captures += 1

            def __exit__(self, *exc):
                return False

        class Stream:
            def wait_stream(self, other):
                pass

        monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
        monkeypatch.setattr(torch.cuda, "graph", GraphContext)
        monkeypatch.setattr(torch.cuda, "Stream", Stream)
        monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
        monkeypatch.setattr(torch.cuda, "current_stream", Stream)


def _captured_decoding(monkeypatch, fail: bool):
    model = _model("ringformer_tiny")
    src, lengths = (_sample(bsz=2)["net_input"][k] for k in ("src_tokens", "src_lengths"))
    beam, rows, steps = 2, 4, BUCKET + 6
    failures = []
    outputs = {}
    with torch.no_grad():
        encoder_out = model.encoder(src, lengths)
        for mode in ("eager", "captured"):
            decoder = decoding_side(model.decoder, encoder_out, group=beam)
            cache = StaticStackCache(steps, "cpu")
            step = StaticStep(decoder, cache, rows)
            run = step
            if mode == "captured":
                run = CapturedStep(step, failures.append)
                fake = _FakeCuda(fail)
                fake.install(monkeypatch, run)
            g = torch.Generator().manual_seed(3)
            outs = []
            for position in range(steps):
                cache.set_position(position)
                step.tokens.copy_(torch.randint(4, len(DICT), (rows, 1), generator=g))
                outs.append((step() if position == 0 else run()).clone())
                order = torch.randint(0, beam, (rows,), generator=g)
                cache.reorder(order + torch.arange(rows) // beam * beam)
            outputs[mode] = torch.stack(outs)
    return outputs, fake, failures


def test_a_captured_step_is_captured_once_per_bucket_and_replayed(monkeypatch):
    """CapturedStep with torch.cuda's graph API faked on the CPU: one capture per length
    bucket, one replay per step, one memory pool for the batch's graphs, and every step's
    logits those of the eager step."""
    outputs, fake, failures = _captured_decoding(monkeypatch, fail=False)
    assert not failures and fake.captures == 2  # positions 1-31 and 32-37
    assert fake.replays == BUCKET + 5
    assert fake.pools == [None, ("pool", id(fake))]
    torch.testing.assert_close(outputs["captured"], outputs["eager"])


def test_a_capture_that_fails_falls_back_to_the_eager_step(monkeypatch):
    outputs, fake, failures = _captured_decoding(monkeypatch, fail=True)
    assert len(failures) == 1 and "capturing" in str(failures[0])
    assert fake.replays == 0
    torch.testing.assert_close(outputs["captured"], outputs["eager"])


@pytest.mark.parametrize(
    "family,setting",
    [("ringformer", "across length buckets"), ("universal_transformer", "beam 4"),
     ("relaxed_transformer", "greedy")],
)  # fmt: skip
def test_a_compiled_step_decodes_as_fairseqs_beam_search(family, setting, caplog):
    """``compiled`` (``--compile-decoding``): the step compiled by torch.compile gives
    fairseq's hypotheses, says so in the log, and compiles a few times per decoding, not once
    per step (float64, as above: fused kernels sum in another order again)."""
    torch._dynamo.reset()
    model = _model(f"{family}_tiny").double()
    _eos_likelier(model)
    sample = _sample(bsz=6)
    options = SETTINGS[setting]
    want = _nbest(SequenceGenerator([model], DICT, **options), model, sample)
    generator = StaticSequenceGenerator([model], DICT, compiled=True, **options)
    frames = torch._dynamo.utils.counters["stats"]
    before = frames["unique_graphs"]
    with caplog.at_level("INFO", logger="recurnmt.nmt.static_decoding"):
        got = _nbest(generator, model, sample)
    _assert_same_nbest(got, want)
    assert generator.path == "compiled" and generator.compiled
    assert "compiled by torch.compile" in caplog.text and "failed" not in caplog.text
    assert 1 <= frames["unique_graphs"] - before <= 4


def test_a_compilation_that_fails_falls_back_to_the_eager_step(monkeypatch, caplog):
    """A step torch.compile cannot compile (here: a backend that raises, as Inductor does
    without a C++ compiler) runs eagerly from then on, with one warning naming the flag; the
    hypotheses are the eager ones."""
    from recurnmt.modules.decoding import static_steps

    def broken(step):
        raise RuntimeError("InductorError: no C++ compiler found\nmore detail")

    monkeypatch.setattr(static_steps, "compiled_decoding", lambda owner, key, fn: broken)
    model = _model("ringformer_tiny")
    sample = _sample(bsz=3)
    want = _nbest(StaticSequenceGenerator([model], DICT, beam_size=2), model, sample)
    generator = StaticSequenceGenerator([model], DICT, compiled=True, beam_size=2)
    with caplog.at_level("INFO", logger="recurnmt.nmt.static_decoding"):
        got = _nbest(generator, model, sample)
        again = _nbest(generator, model, sample)
    _assert_same_nbest(got, want)
    _assert_same_nbest(again, want)
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1
    assert warnings[0].getMessage() == (
        "--compile-decoding: compiling a step failed (InductorError: no C++ compiler found); "
        "eager from now on"
    )
    assert not generator.compiled and generator.path == "eager"
