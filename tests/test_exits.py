"""Per-row exits that skip the work (recurnmt/modules/decoding/exits.py), through fairseq's own
searches and ``generate()``: exits that never fire change nothing, rows that all exit at level
r decode as the model at r levels, a sentence decodes the same in any batch, the skipped levels
run for no row, and bad settings fail naming the option."""

from __future__ import annotations

import pytest
import torch
from fairseq import search
from fairseq.sequence_generator import SequenceGenerator

from recurnmt.modules.decoding.exits import ExitClassifier, Exits, exits_of
from recurnmt.modules.decoding.kv_cache import KVCache
from recurnmt.modules.decoding.options import DecodingOptions
from recurnmt.modules.errors import ConfigError
from recurnmt.modules.families import FAMILIES
from recurnmt.modules.hooks import LevelHook
from tests.nmt_helpers import DICT, batch, build, full_and_stepwise, train_signals

EXITING = [f for f in FAMILIES if f != "universal_transformer_act"]  # ACT is refused
LEVELS = 6
NEVER = Exits("saturation", 2.0)  # a cosine is at most 1: no row exits


def _model(family: str, seed: int = 0):
    torch.manual_seed(seed)
    model, _, _ = build(family, "--decoder-layers", str(LEVELS))
    train_signals(model)
    decoder = model.decoder
    out = decoder.output_projection
    weight = decoder.embed_tokens.weight if out is None else out.weight
    with torch.no_grad():
        weight[DICT.eos()] *= 3.0  # random models then end their sentences at various steps
    return model.eval()


def _sample(bsz: int = 5, seed: int = 1):
    src, lengths, _ = batch(seed=seed, bsz=bsz)
    return {"net_input": {"src_tokens": src, "src_lengths": lengths}}


def _decode(model, sample, exits: Exits | None, beam: int = 4, keep: bool = False, **kwargs):
    """The hypotheses of fairseq's search with ``exits`` (``keep``: the stack's as they are)."""
    stack = model.decoder.stack
    if not keep:
        stack.set_exits(exits)
    try:
        generator = SequenceGenerator([model], DICT, beam_size=beam, max_len_b=12, **kwargs)
        return [
            [(h["tokens"].tolist(), h["positional_scores"]) for h in hypos]
            for hypos in generator.generate([model], sample)
        ]
    finally:
        if not keep:
            stack.set_exits(None)


def _assert_same(got, want, atol: float = 1e-5):
    assert [[t for t, _ in hypos] for hypos in got] == [[t for t, _ in hypos] for hypos in want]
    for hypos, want_hypos in zip(got, want, strict=True):
        for (_, scores), (_, want_scores) in zip(hypos, want_hypos, strict=True):
            torch.testing.assert_close(scores, want_scores, atol=atol, rtol=atol)


@pytest.mark.parametrize("family", EXITING)
def test_exits_that_never_fire_decode_step_by_step_as_the_full_pass(family):
    """Every row runs every level through the exits' loop (its caches written row-wise):
    step by step, the decoder's outputs are its full pass's."""
    model = _model(family)
    src, lengths, prev = batch(seed=2, bsz=4)
    _, plain, _, _ = full_and_stepwise(model, src, lengths, prev)
    model.decoder.stack.set_exits(NEVER)
    try:
        full, steps, _, _ = full_and_stepwise(model, src, lengths, prev)
    finally:
        model.decoder.stack.set_exits(None)
    torch.testing.assert_close(steps, plain, atol=1e-5, rtol=1e-5)  # the cached step's
    torch.testing.assert_close(steps, full, atol=1e-4, rtol=1e-4)  # (eos's weight scaled up)


@pytest.mark.parametrize("family", EXITING)
@pytest.mark.parametrize("level", [1, 3])
def test_rows_that_all_exit_at_level_r_decode_as_the_first_r_levels(family, level):
    """Every row exits after r levels at every step: levels 1..r never read the deeper levels'
    (propagated) keys and values, so the output is the first r levels' as a model of r levels
    gives it, under beam search, greedy and sampling."""
    model, sample = _model(family), _sample()
    stack = model.decoder.stack
    sampling = {"beam": 1, "search_strategy": search.Sampling(DICT, sampling_topk=5)}
    for search_settings in ({"beam": 4}, {"beam": 1}, sampling):
        torch.manual_seed(3)
        got = _decode(model, sample, Exits("saturation", -1.0, level), **search_settings)
        stack.run_levels = list(range(level))  # the first r levels alone, through the exits'
        stack.exits = NEVER  # loop as well (no alignment weights: the same kernels)
        try:
            torch.manual_seed(3)
            want = _decode(model, sample, NEVER, **search_settings, keep=True)
        finally:
            stack.run_levels = stack.exits = None
        _assert_same(got, want)


@pytest.mark.parametrize("family", EXITING)
def test_a_sentence_decodes_the_same_in_any_batch_with_rows_exiting(family):
    """Rows exit at different levels and steps, beams reorder and sentences finish at different
    steps: each sentence's hypotheses equal those it gets decoded alone (compaction, memory
    rows and propagated keys and values follow the right rows)."""
    model, sample = _model(family), _sample(bsz=5)
    exits = Exits("saturation", 0.0, 1)
    together = _decode(model, sample, exits)
    src, lengths = sample["net_input"]["src_tokens"], sample["net_input"]["src_lengths"]
    for i, hypos in enumerate(together):
        alone = {"net_input": {"src_tokens": src[i : i + 1], "src_lengths": lengths[i : i + 1]}}
        best = _decode(model, alone, Exits("saturation", 0.0, 1))[0][:1]
        # the best hypothesis: the others of a random model's beam are near ties that the
        # float rounding of another batch size may order otherwise
        _assert_same([hypos[:1]], [best], atol=1e-4)


def test_rows_leave_at_mixed_levels_in_these_tests():
    """The batch test above is not vacuous: its rows leave at several levels."""
    exits = Exits("saturation", 0.0, 1)
    _decode(_model("ringformer"), _sample(), exits)
    assert len(exits.exited) >= 2 and 1 < exits.mean_levels < LEVELS


@pytest.mark.parametrize("family", ["ringformer", "relaxed_transformer", "universal_transformer"])
def test_skipped_levels_run_for_no_row(family):
    """The rows entering every level's FFN (its block's cross-attention queries for a decoder
    without FFN) are exactly the rows still running: the levels run sum to the exits' count,
    and beyond the first level fewer rows run than the batch has."""
    model = _model(family)
    stack = model.decoder.stack
    rows: list[int] = []
    handles = [
        block.ffn.register_forward_hook(lambda m, args, out: rows.append(args[0].shape[0]))
        for block in stack.blocks
    ]
    exits = Exits("saturation", 0.0, 1)
    try:
        _decode(model, _sample(), exits)
    finally:
        for handle in handles:
            handle.remove()
    assert sum(rows) == exits.levels_run  # the decoder's blocks alone are hooked
    assert exits.levels_run < exits.rows * LEVELS


@pytest.mark.parametrize("family", ["ringformer", "relaxed_transformer", "sret"])
@pytest.mark.parametrize("folded", [False, True])
def test_the_propagated_keys_and_values_are_what_the_block_writes(family, folded):
    """``keys_values`` of a state at a level is what the block's self-attention appends to a
    cache for that state: with the level's own terms (RingFormer's signals, a relaxed level's
    LoRA) as a full pass computes them, and folded into the projection as a decoding session
    runs them."""
    from recurnmt.modules.decoding.cache import StackCache
    from recurnmt.modules.decoding.session import DecodingSession

    model = _model(family)
    stack = model.decoder.stack
    x = torch.randn(3, 1, stack.blocks[0].self_attn.embed_dim)
    memory = stack.blocks[0].project_memory(torch.randn(3, 4, x.size(-1)))
    with torch.no_grad():
        session = DecodingSession.of(stack, StackCache()) if folded else None
        for level in (0, 4):
            parts = stack.levels[level] if session is None else session.levels[level]
            block, cache = stack.block_of_level(level), KVCache()
            block(x, parts, memory=memory, cache=cache)
            kv = block.keys_values(x, parts)
            torch.testing.assert_close(kv[0], cache.keys)
            torch.testing.assert_close(kv[1], cache.values)
    if folded and family != "sret":  # SReT's levels fold nothing
        assert any(type(p).__name__ == "SessionLevel" for p in session.levels)


def test_the_margin_and_classifier_tests_decode():
    """The margin test reads the output layer at each candidate level; the classifier test
    its units; both decode every sentence, and a unit that always says exit exits at the
    minimum level."""
    model, sample = _model("ringformer"), _sample()
    head = model.decoder.output_layer
    margin = Exits("margin", 0.0, 2, head=head)
    _assert_same(
        _decode(model, sample, margin), _decode(model, sample, Exits("saturation", -1.0, 2))
    )
    unit = ExitClassifier(LEVELS, model.decoder.stack.blocks[0].self_attn.embed_dim)
    with torch.no_grad():
        unit.bias.fill_(10.0)
    sure = Exits("classifier", 0.5, 3, classifier=unit)
    _decode(model, sample, sure)
    assert set(sure.exited) == {3}


def test_an_exit_classifier_file_round_trips_and_a_bad_one_is_refused(tmp_path):
    unit = ExitClassifier(4, 8)
    with torch.no_grad():
        unit.weight.normal_()
    unit.save(tmp_path / "exits.pt", checkpoint="ckpt.pt")
    loaded, about = ExitClassifier.load(tmp_path / "exits.pt")
    torch.testing.assert_close(loaded.weight, unit.weight)
    assert about == {"checkpoint": "ckpt.pt"}
    (tmp_path / "bad.pt").write_bytes(b"not a file torch wrote")
    with pytest.raises(ConfigError, match=r"^exit_classifier='\S+bad.pt': not an exit classifier"):
        ExitClassifier.load(tmp_path / "bad.pt")
    with pytest.raises(ConfigError, match=r"^exit_classifier='\S+missing.pt': no such file$"):
        ExitClassifier.load(tmp_path / "missing.pt")
    options = DecodingOptions.from_texts(
        {"exit_test": "classifier", "exit_classifier": str(tmp_path / "exits.pt")}
    )
    with pytest.raises(ConfigError, match=r"units for 4 levels, the decoder has 6$"):
        exits_of(options, 6, head=None)


@pytest.mark.parametrize(
    ("texts", "message"),
    [
        (
            {"exit_test": "softmax"},
            r"^exit_test='softmax': choose one of margin, saturation, class",
        ),
        ({"exit_test": "margin", "exit_threshold": 1.5}, r"^exit_threshold=1.5: the margin test"),
        ({"exit_test": "saturation", "exit_threshold": -2.0}, r"^exit_threshold=-2.0: the sat"),
        ({"exit_test": "margin", "min_exit_level": 0}, r"^min_exit_level=0: at least 1 level$"),
        ({"exit_test": "classifier"}, r"^exit_classifier=None: the classifier test reads"),
        ({"exit_classifier": "u.pt"}, r"^exit_classifier='u.pt': is read by exit_test='class"),
        ({"exit_test": "margin", "draft_levels": "1"}, r"^exit_test='margin': not with draft_lev"),
        ({"exit_test": "margin", "static_decoding": True}, r"^exit_test='margin': not with static"),
    ],
)
def test_impossible_exit_settings_fail_naming_the_option(texts, message):
    with pytest.raises(ConfigError, match=message):
        DecodingOptions.from_texts(texts)


def test_exits_against_the_decoder_are_checked():
    options = DecodingOptions.from_texts({"exit_test": "margin", "min_exit_level": 6})
    with pytest.raises(ConfigError, match=r"^min_exit_level=6: rows exit after 1 to 5 of the"):
        options.check_stack(6, act=False)
    with pytest.raises(ConfigError, match=r"^exit_test='margin': ACT's halting decides"):
        DecodingOptions.from_texts({"exit_test": "margin"}).check_stack(6, act=True)
    act = _model("universal_transformer_act").decoder.stack
    with pytest.raises(ConfigError, match=r"^exit_test='saturation': ACT's halting decides"):
        act.set_exits(NEVER)


def test_generate_decodes_with_exits_as_fairseq_does():
    """``generate(exit_test=...)``: exits that never fire give generate()'s own beams; all rows
    exiting at r give the first r levels'; the keywords are refused as fairseq refuses the
    flags, by their names."""
    from recurnmt.export import convert, generation_config

    model, args, _ = build("ringformer_tiny", "--decoder-layers", "4")
    train_signals(model)
    hf = convert(model.eval(), args, "ringformer_tiny")
    hf.generation_config = generation_config(hf, beam=4, lenpen=1.0, max_len_b=8)
    src, _, _ = batch(seed=1, bsz=4)
    ids = dict(input_ids=src, attention_mask=src.ne(DICT.pad()).long())
    plain = hf.generate(**ids)
    never = hf.generate(**ids, exit_test="saturation", exit_threshold=1.0, min_exit_level=3)
    assert torch.equal(never, plain)
    first = hf.generate(**ids, exit_test="saturation", exit_threshold=-1.0, min_exit_level=2)
    stack = hf.decoder.stack
    stack.run_levels = [0, 1]
    try:
        want = hf.generate(**ids)
    finally:
        stack.run_levels = None
    assert torch.equal(first, want)
    assert stack.exits is None  # the call's exits end with it
    with pytest.raises(ConfigError, match=r"^min_exit_level=4: rows exit after 1 to 3"):
        hf.generate(**ids, exit_test="margin", min_exit_level=4)


def test_models_that_cannot_exit_are_refused_naming_the_flag():
    """fairseq's own transformer has no level loop to leave; ACT decides depth itself."""
    from recurnmt.nmt.speculative import set_exits

    options = DecodingOptions.from_texts({"exit_test": "margin"})
    fairseq_model, _, _ = build("transformer", "--decoder-layers", "2")
    with pytest.raises(ConfigError, match=r"^--exit-test='margin': TransformerModel is not a"):
        set_exits([fairseq_model], options)
    with pytest.raises(ConfigError, match=r"^--exit-test='margin': ACT's halting decides"):
        set_exits([_model("universal_transformer_act")], options)
    model = _model("ringformer")
    ((exits, levels),) = set_exits([model], options)
    assert model.decoder.stack.exits is exits and levels == LEVELS


class _FrozenRows(LevelHook):
    """The exits' meaning without compaction, for reference: every row runs every level, but a
    row that passed the saturation test keeps its exit state (the deeper levels' outputs are
    thrown away), so each deeper level's keys and values are those of the exit state entering
    it."""

    needs_all_levels = False

    def __init__(self, threshold: float, min_level: int, levels: int) -> None:
        self.threshold, self.min_level, self.levels = threshold, min_level, levels
        self.prev = self.frozen = self.done = None

    def after_level(self, level: int, x: torch.Tensor) -> torch.Tensor:
        if x.size(1) != 1:  # the full pass: no exits
            return x
        if self.done is None:
            self.done = torch.zeros(x.size(0), dtype=torch.bool)
            self.frozen = x
        x = torch.where(self.done[:, None, None], self.frozen, x)
        ran = level + 1
        if self.min_level <= ran < self.levels:
            confidence = torch.cosine_similarity(x.float(), self.prev.float(), dim=-1).flatten()
            new = (confidence >= self.threshold) & ~self.done
            self.frozen = torch.where(new[:, None, None], x, self.frozen)
            self.done = self.done | new
        self.prev = x
        return x


@pytest.mark.parametrize("family", EXITING)
def test_exits_decode_step_by_step_as_frozen_rows_do(family, monkeypatch):
    """Compacted rows and propagated keys and values give, step after step, the outputs of
    rows that run every level with their state frozen from their exit on (the reference of
    :class:`_FrozenRows`): at later steps every row attends to exited rows' deeper keys and
    values."""
    model = _model(family)
    src, lengths, prev = batch(seed=4, bsz=4, tgt_len=8)
    min_level = 2

    def decode(threshold: float) -> tuple[Exits, torch.Tensor]:
        exits = Exits("saturation", threshold, min_level)
        model.decoder.stack.set_exits(exits)
        try:
            return exits, full_and_stepwise(model, src, lengths, prev)[1]
        finally:
            model.decoder.stack.set_exits(None)

    # the threshold at which rows leave at the most levels (random models' states differ)
    grid = [k / 25 for k in range(25)]
    threshold = max(grid, key=lambda t: len(decode(t)[0].exited))
    exits, got = decode(threshold)
    assert len(exits.exited) >= 2, exits.exited  # rows left at several levels
    decoder = model.decoder
    own = decoder.level_hooks
    monkeypatch.setattr(decoder, "level_hooks", lambda positions: [
        *own(positions), _FrozenRows(threshold, min_level, LEVELS)])  # fmt: skip
    _, want, _, _ = full_and_stepwise(model, src, lengths, prev)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
