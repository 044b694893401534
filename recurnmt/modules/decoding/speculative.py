"""Lossless self-speculative decoding: a recursive decoder drafts with its own first levels.

A weight-shared decoder's first r levels, followed by its final norm and output projection, are a
complete, cheaper model made of the same weights: the model a mixed-depth-trained decoder runs at
depth r (``--mixed-depth-levels``; SReT appendix B's mixed depth, LayerSkip's early exit). Its
per-level keys and values *are* the full model's for those levels. So each iteration of
:meth:`SelfSpeculation.run`:

1. drafts k tokens with levels 1..r, one position at a time, appending to those levels' caches,
   and runs the last drafted token through them too (k + 1 positions);
2. verifies all k + 1 positions with levels r+1..N in one pass that starts from the draft's
   level-r states (no level is run twice) and appends to those levels' caches;
3. accepts the longest prefix of drafts the full model agrees with and takes the full model's
   token after it (its correction, or a bonus token when every draft was accepted), then
   truncates every level's cache to what was accepted (:meth:`StackCache.truncate`, a length).

Greedy: a draft is accepted where it is the full model's argmax, so the output is token for token
the full model's greedy output (up to the rounding of a pass over several positions at once).
Sampling: speculative rejection sampling (Leviathan et al. 2023, "Fast Inference from
Transformers via Speculative Decoding", Algorithm 1; Chen et al. 2023): draft d ~ q is accepted
with probability min(1, p(d) / q(d)), else a token is drawn from norm(max(0, p - q)); after k
accepted drafts one more is drawn from p. The emitted tokens are distributed exactly as the
full model's samples.

A batch advances by the smallest acceptance of its rows: the rows that accepted more emit the
full model's own token at that position as well (greedy: their draft; sampling: their accepted
draft), so every row stays exact and all rows keep one cache length. Finished rows leave the
batch.

With ``compiled`` (``--compile-decoding``) the passes run compiled by ``torch.compile`` over a
static-shape cache (:class:`~recurnmt.modules.decoding.static_cache.StaticStackCache`: a draft pass
writes one position, a verification several, a truncation moves the position back). Greedy
decoding then runs a whole round as one compiled function (:func:`_greedy_round`): the k
draft passes with their embeddings and argmaxes, the verification, the full model's tokens
and how many drafts they accept, so that a round costs the host one call and one read; at
the steps where fairseq's adjustment of the scores depends on the step (before the minimum
length, at the maximum), and for sampling, the passes are compiled one by one and the token
choices and the acceptance stay eager (docs/compiled_decoding.md).

The front end supplies a :class:`~recurnmt.modules.decoding.protocol.DecodingSide` (the decoder side, the
memory, the output layer) and a :class:`TokenRule` (how log-probabilities become the
distribution a token is chosen from at a step: fairseq's forbidden pad, unk penalty, minimum
and maximum length; temperature, top-k and top-p). Stacks whose levels are not a computation from the first
level on refuse: ACT's halting mixes every level's output, so the state after r levels is not the
input of level r + 1.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from recurnmt.modules.decoding.cache import StackCache
from recurnmt.modules.decoding.compiled import compiled_decoding
from recurnmt.modules.decoding.options import DecodingOptions
from recurnmt.modules.decoding.protocol import DecodingSide
from recurnmt.modules.decoding.rules import TokenRule, scaled
from recurnmt.modules.decoding.static_cache import BUCKET, StaticStackCache
from recurnmt.modules.errors import ConfigError
from recurnmt.modules.stack import RecurrentStack


@dataclass
class Statistics:
    """What speculation did (the log's acceptance statistics)."""

    verifications: int = 0
    drafted: int = 0
    accepted: int = 0  # the batch's: its rows' smallest, summed over verifications
    emitted: int = 0
    rows_accepted: int = 0  # every row's own, summed over rows and verifications
    rows_verified: int = 0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    rounds: int = 0  # verifications made by fused compiled rounds (drafts and verification)
    round_seconds: float = 0.0

    @property
    def mean_accepted(self) -> float:
        """Accepted drafts per verification (the batch's smallest)."""
        return self.accepted / max(self.verifications, 1)

    @property
    def row_accepted(self) -> float:
        """Drafts a row's own verification accepted, on average (a batch advances by its
        rows' smallest: at batch 1 the two agree)."""
        return self.rows_accepted / max(self.rows_verified, 1)

    @property
    def tokens_per_verification(self) -> float:
        return self.emitted / max(self.verifications, 1)

    def add(self, other: Statistics) -> None:
        for name in (
            "verifications", "drafted", "accepted", "emitted", "rows_accepted", "rows_verified",
            "draft_seconds", "verify_seconds", "rounds", "round_seconds",
        ):  # fmt: skip
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def summary(self) -> str:
        fused = (
            f", {self.rounds} of them in fused rounds ({self.round_seconds:.2f} s)"
            if self.rounds else ""
        )  # fmt: skip
        return (
            f"speculation: {self.verifications} verifications, {self.mean_accepted:.2f} drafts "
            f"accepted and {self.tokens_per_verification:.2f} tokens per verification (a row "
            f"accepted {self.row_accepted:.2f}), "
            f"draft {self.draft_seconds:.2f} s, verify {self.verify_seconds:.2f} s{fused}"
        )


@dataclass
class Decoded:
    """One batch's output: per row its tokens (ending at eos where it stopped) and the full
    model's log-probability of each, in the rows' original order."""

    tokens: list[Tensor]
    scores: list[Tensor]
    stats: Statistics


def check_draft(stack: RecurrentStack, levels: Any, tokens: int) -> None:
    """Refuses a draft depth (``levels``: a number, or ``auto``) or length (``tokens``) that
    ``stack`` cannot run, naming the option
    (:class:`~recurnmt.modules.decoding.options.DecodingOptions`).

    Raises:
        ConfigError: naming ``draft_levels`` or ``draft_tokens``.
    """
    options = DecodingOptions.from_texts({"draft_levels": levels, "draft_tokens": tokens})
    options.check_stack(stack.num_levels, stack.halting is not None)


class SelfSpeculation:
    """Greedy or sampled decoding of a stack with drafts from its own first ``draft_levels``
    levels, ``draft_tokens`` at a time (module docstring).

    Args:
        decoder: the front end's decoder.
        draft_levels: r, the levels the draft runs (1 <= r < N); 0: no draft, the full model
            one token at a time in this same loop (what speculation is measured against).
        draft_tokens: k, tokens drafted per verification (none without draft levels).
        rule: how a token is chosen from the log-probabilities.
        compiled: None: eager passes over the default cache. Else the passes compiled by
            ``torch.compile`` over a static-shape cache (:mod:`~recurnmt.modules.decoding.static_cache`:
            a truncation moves its position back), from each decoding's second verification on;
            a pass that fails to compile calls ``compiled`` with the error and runs eagerly
            from then on.
    """

    def __init__(
        self,
        decoder: DecodingSide,
        draft_levels: int,
        draft_tokens: int,
        rule: TokenRule,
        compiled: Callable[[Exception], None] | None = None,
    ) -> None:
        stack = decoder.stack
        if not isinstance(draft_levels, int):  # auto is a front end's calibration
            raise ConfigError("draft_levels", draft_levels, "a number of levels")
        check_draft(stack, draft_levels, draft_tokens)
        order = list(stack.active_levels)
        self.shallow, self.deep = tuple(order[:draft_levels]), tuple(order[draft_levels:])
        self.decoder, self.k, self.rule = decoder, draft_tokens if draft_levels else 0, rule
        self.failed = compiled  # compiled passes: called with the error if compiling fails
        self.passes = EAGER  # a draft pass, a verification, a draft pass without the logits
        self.round = None  # greedy, compiled: a whole round (_greedy_round) compiled
        self.vocab = 0  # the output layer's, once a verification has run
        self.broken = False  # compiling failed: eager from then on

    def _compile(self) -> None:
        """From the second iteration on (the first one made every level's buffers, projected
        the memory and folded the levels' weights), the passes compiled, and greedy rounds
        fused into one compiled function."""
        stack = self.decoder.stack
        self.passes = tuple(
            compiled_decoding(stack, ("speculation", which, levels), EAGER[which])
            for which, levels in ((0, self.shallow), (1, self.deep), (2, self.shallow))
        )
        if not self.rule.sampling:
            key = ("speculation round", self.shallow, self.deep, self.k)
            self.round = compiled_decoding(stack, key, _greedy_round)

    def _pass(self, which: int, x: Tensor, levels, cache: StackCache, hooks):
        """A draft pass (0), a verification (1) or the last draft pass (2, its state alone):
        the levels on ``x``, then the output layer (not for 2); compiled where asked, eager
        from the first failure to compile on."""
        try:
            return self.passes[which](self.decoder, x, levels, cache, hooks)
        except Exception as error:  # noqa: BLE001 (any failure to compile: eager, reported)
            if self.passes is EAGER:
                raise
            self._eager(error)
            return EAGER[which](self.decoder, x, levels, cache, hooks)

    def _eager(self, error: Exception) -> None:
        """Compiling failed: eager passes and no fused round from now on, reported once."""
        self.passes, self.round, self.broken = EAGER, None, True
        self.failed(error)

    @torch.no_grad()
    def run(
        self,
        prefix: Tensor,
        max_len: int,
        eos: int,
        generator: torch.Generator | None = None,
    ) -> Decoded:
        """Decodes from ``prefix`` (B x 1: the first target token, fairseq's eos) for at most
        ``max_len`` tokens besides it (the rule forces eos at step ``max_len``), with a cache of
        its own."""
        decoder = self.decoder
        stats = Statistics()
        # compiled: fixed shapes (a multiple of the length bucket, so that one sentence's buffers
        # are shaped as another's and the compilations serve both)
        capacity = -(-(max_len + 1) // BUCKET) * BUCKET
        static = self.failed is not None
        cache = StaticStackCache(capacity, prefix.device) if static else StackCache()
        fused = None  # what fused rounds read besides the cache: positions, the rule's bias
        rows = list(range(prefix.size(0)))  # the original row of each row still running
        tokens, scores = prefix, torch.zeros(prefix.shape, device=prefix.device)
        done: dict[int, tuple[Tensor, Tensor]] = {}
        step = 0  # tokens generated so far; the caches hold as many positions
        while True:
            k = min(self.k, max_len - step)
            verdict = None
            # the first verification makes the buffers, projects the memory, folds the levels
            first_round = stats.verifications == 0
            if self.round is not None and not first_round and self.rule.steady_over(step, k + 1):
                if fused is None:
                    bias = self.rule.bias(self.vocab, prefix.device)
                    fused = decoder.position_rows(capacity), bias
                verdict = self._fused_round(tokens[:, -1:], cache, step, k, eos, fused, stats)
            if verdict is None:
                verdict = self._round(tokens[:, -1:], cache, step, k, eos, generator, stats)
            emitted, chosen, accepted, agreed, ends, first = verdict
            n = emitted.size(1)
            cache.truncate(step + n)
            if static and first_round and self.passes is EAGER and not self.broken:
                self._compile()
            stats.verifications += 1
            stats.drafted += k
            stats.accepted += accepted
            stats.emitted += n
            stats.rows_accepted += agreed
            stats.rows_verified += emitted.size(0)
            tokens = torch.cat([tokens, emitted], 1)
            scores = torch.cat([scores, chosen], 1)
            step += n
            # a row ends at its first eos among what it emitted (the rule forces one at the
            # maximum length: max_len + 1 tokens)
            ending = [i for i, e in enumerate(ends) if e < n or step > max_len]
            if not ending:
                continue
            for i in ending:
                end = step - n + min(ends[i], n - 1) + 1  # tokens up to its eos
                done[rows[i]] = (tokens[i, 1 : end + 1], scores[i, 1 : end + 1])
            if len(ending) == len(ends):
                break
            ended = set(ending)
            rows = [row for i, row in enumerate(rows) if i not in ended]
            keep = (first >= n).nonzero()[:, 0]  # on the device: no host-made index
            cache = cache.reorder(keep)
            decoder.select(keep)
            tokens, scores = tokens[keep], scores[keep]
        order = sorted(done)
        return Decoded([done[r][0] for r in order], [done[r][1] for r in order], stats)

    def _fused_round(self, last, cache, step, k, eos, fused, stats):
        """One greedy round as one compiled call (:func:`_greedy_round`), or None where
        compiling it failed (the passes then run eagerly)."""
        rows, bias = fused
        start = time.perf_counter()
        cache.set_positions(step, k + 1)
        try:
            target, chosen, read = self.round(
                self.decoder, last, rows, cache, self.shallow, self.deep, k, eos, bias,
                self.rule.temperature,
            )  # fmt: skip
        except Exception as error:  # noqa: BLE001 (any failure to compile: eager, reported)
            cache.position.window(None)
            self._eager(error)
            return None
        accepted, agreed, *ends = read.tolist()  # the round's one read
        first = read[2:]
        n = accepted + 1
        stats.rounds += 1
        stats.round_seconds += time.perf_counter() - start
        return target[:, :n], chosen[:, :n], accepted, agreed, ends, first

    def _round(self, last, cache, step, k, eos, generator, stats):
        """One round pass by pass: k drafts, the verification, the acceptance. Returns the
        emitted tokens (B x n), their log-probabilities, the batch's acceptance, the rows'
        summed acceptance, and each row's first eos among the full model's tokens (host
        numbers, and on the device)."""
        decoder, rule = self.decoder, self.rule
        static = isinstance(cache, StaticStackCache)
        start = time.perf_counter()
        drafts, draft_probs, states, positions = [], [], [], []
        for j in range(k + 1):  # k drafts, and the last one through the draft's levels
            x, pos = decoder.embed(last, step + j)
            positions.append(pos)
            if not self.shallow:  # no draft: the full model reads the token itself
                states.append(x)
                break
            if static:
                cache.set_positions(step + j, 1)
            last_pass = j == k  # the state alone: no output layer
            hidden, logits = self._pass(2 if last_pass else 0, x, self.shallow, cache,
                                        decoder.hooks(pos))  # fmt: skip
            states.append(hidden)
            if last_pass:
                break
            if rule.sampling:
                q = rule.probs(rule.lprobs(logits, step + j)[:, 0])
                last = torch.multinomial(q, 1, generator=generator)
                draft_probs.append(q)
            else:
                last = rule.argmax(logits, step + j)  # B x 1
            drafts.append(last)
        stats.draft_seconds += time.perf_counter() - start
        start = time.perf_counter()
        pos = None if positions[0] is None else torch.cat(positions, 1)
        if static:
            cache.set_positions(step, len(states))
        _, logits = self._pass(1, torch.cat(states, 1), self.deep, cache, decoder.hooks(pos))
        lprobs = rule.lprobs(logits, step)  # B x (k + 1) x V
        self.vocab = lprobs.size(-1)
        drafted = torch.cat(drafts, 1) if drafts else last[:, :0]
        if rule.sampling:
            agree = self._agreement(lprobs, drafted, draft_probs, generator)  # per row
            accepted, agreed = torch.stack([agree.min(), agree.sum()]).tolist()  # a read
            emitted = self._emit(lprobs, drafted, draft_probs, agree, accepted, generator)
            first = _first(emitted.eq(eos))
            ends = first.tolist()  # and a second
        else:  # the full model's tokens: one read says what is accepted and what ends
            target = lprobs.argmax(-1)  # B x (k + 1)
            agree = (drafted == target[:, :k]).long().cumprod(1).sum(1)
            first = _first(target.eq(eos))
            read = torch.cat([agree.min().view(1), agree.sum().view(1), first])
            accepted, agreed, *ends = read.tolist()
            emitted = target[:, : accepted + 1]
        chosen = lprobs[:, : emitted.size(1)].gather(-1, emitted.unsqueeze(-1))[..., 0]
        stats.verify_seconds += time.perf_counter() - start
        return emitted, chosen, accepted, agreed, ends, first

    def _agreement(self, lprobs, drafted, draft_probs, generator) -> Tensor:
        """How many drafts each row's verification accepts (B): greedy, while the draft is
        the full model's argmax; sampling, while u q(d) <= p(d), u uniform (Leviathan et al.
        2023, Algorithm 1: accepted with probability min(1, p(d) / q(d)))."""
        k = drafted.size(1)
        if k == 0:
            return drafted.new_zeros(drafted.size(0))
        if not self.rule.sampling:
            agree = drafted == lprobs[:, :k].argmax(-1)
        else:
            p = self.rule.probs(lprobs[:, :k])
            q = torch.stack(draft_probs, 1)  # B x k x V
            pd = p.gather(-1, drafted.unsqueeze(-1))[..., 0]
            qd = q.gather(-1, drafted.unsqueeze(-1))[..., 0]
            u = torch.rand(pd.shape, generator=generator, device=pd.device)
            agree = u * qd <= pd
        return agree.long().cumprod(1).sum(1)

    def _emit(self, lprobs, drafted, draft_probs, agree, accepted: int, generator) -> Tensor:
        """The tokens every row emits: the first ``accepted`` drafts (the rows' smallest
        acceptance), then the full model's token at the next position. Greedy: its argmax.
        Sampling: a row that accepted its draft there emits it; one that rejected it draws from
        norm(max(0, p - q)); after k accepted drafts a row draws from p."""
        k = drafted.size(1)
        if not self.rule.sampling:
            last = lprobs[:, accepted].argmax(-1, keepdim=True)
        else:
            p = self.rule.probs(lprobs[:, accepted])  # B x V
            if accepted < k:
                residual = (p - draft_probs[accepted]).clamp_min(0)
                mass = residual.sum(-1, keepdim=True)
                # a row whose residual is empty (p == q) cannot have rejected: p is as good
                p = torch.where(mass > 0, residual / mass.clamp_min(1e-30), p)
            last = torch.multinomial(p, 1, generator=generator)
            if accepted < k:  # the rows that accepted their draft here emit it
                took = (agree > accepted).unsqueeze(1)
                last = torch.where(took, drafted[:, accepted : accepted + 1], last)
        return torch.cat([drafted[:, :accepted], last], 1)


def _eager_pass(decoder: DecodingSide, x: Tensor, levels, cache: StackCache, hooks):
    """The levels on ``x``, then the output layer: the state after them and the logits."""
    out = decoder.run(x, levels, cache, hooks)
    return out.hidden, decoder.logits(out.output)


def _eager_state(decoder: DecodingSide, x: Tensor, levels, cache: StackCache, hooks):
    """The levels on ``x``: the state after them (no logits)."""
    return decoder.run(x, levels, cache, hooks).hidden, None


EAGER = (_eager_pass, _eager_pass, _eager_state)


def fastest_draft(decode: Callable[[int], object], num_levels: int) -> tuple[int, dict[int, float]]:
    """The draft depth with which ``decode(levels)`` (one decoding of the same sentences with
    drafts from the first ``levels`` levels; 0: no draft) is fastest among 0 .. N - 1, and
    each depth's seconds: where decoding without drafts is faster still (a large batch, which
    advances by its rows' smallest acceptance, or a poor draft), 0."""
    times = {}
    for levels in range(num_levels):
        start = time.perf_counter()
        decode(levels)
        times[levels] = time.perf_counter() - start
    return min(times, key=times.get), times


def _greedy_round(
    decoder: DecodingSide,
    last: Tensor,
    rows: Tensor | None,
    cache: StaticStackCache,
    shallow: tuple[int, ...],
    deep: tuple[int, ...],
    k: int,
    eos: int,
    bias: Tensor,
    temperature: float,
) -> tuple[Tensor, Tensor, Tensor]:
    """A greedy round as one function, what is compiled: ``k`` drafts from the ``shallow``
    levels (each embedded at its position and chosen as :meth:`TokenRule.argmax` chooses at a
    steady step: the scores plus the rule's ``bias``), the last draft through them too, then
    the ``deep`` levels over all k + 1 positions, the full model's tokens and how many drafts
    each row's tokens accept. The cache's positions are set to the round's k + 1 before
    (each draft pass writes one of them, :meth:`StepPosition.window`); ``rows``: the position
    embedding of every position of the cache (or None), read at the round's positions.

    Returns:
        The full model's tokens (B x (k + 1)), their log-probabilities (as
        :meth:`TokenRule.lprobs` gives them), and what the host reads: the batch's
        acceptance, the rows' summed acceptance, then each row's first eos among the tokens
        (k + 1 where there is none).
    """
    position = cache.position
    b = last.size(0)
    here = None if rows is None else rows.index_select(0, position.index)  # (k + 1) x C
    states, drafts = [], []
    for j in range(k + 1 if shallow else 1):
        pos = None if here is None else here.narrow(0, j, 1).unsqueeze(0).expand(b, 1, -1)
        x = decoder.embedded(last, pos)
        if not shallow:  # no draft: the full model reads the token itself
            states.append(x)
            break
        position.window(j)
        out = decoder.run(x, shallow, cache, decoder.hooks(pos))
        states.append(out.hidden)
        if j == k:
            break
        last = _steady_scores(decoder.logits(out.output), bias, temperature).argmax(-1)
        drafts.append(last)
    position.window(None)
    pos = None if here is None else here.unsqueeze(0).expand(b, -1, -1)
    out = decoder.run(torch.cat(states, 1), deep, cache, decoder.hooks(pos))
    scores = scaled(decoder.logits(out.output), temperature)
    lprobs = _steady_scores(torch.log_softmax(scores, dim=-1), bias, 1.0)
    target = lprobs.argmax(-1)  # B x (k + 1)
    chosen = lprobs.gather(-1, target.unsqueeze(-1))[..., 0]
    if drafts:
        agree = (torch.cat(drafts, 1) == target[:, :k]).long().cumprod(1).sum(1)
    else:
        agree = target.new_zeros(b)
    read = torch.cat([agree.min().view(1), agree.sum().view(1), _first(target.eq(eos))])
    return target, chosen, read


def _steady_scores(scores: Tensor, bias: Tensor, temperature: float) -> Tensor:
    """Scores (float32) as :class:`TokenRule` adjusts them at a steady step: divided by the
    temperature, a NaN as -inf, plus the rule's bias."""
    scores = scaled(scores, temperature)
    return scores.masked_fill(scores.isnan(), -math.inf) + bias


def _first(hits: Tensor) -> Tensor:
    """Per row the index of the first True of ``hits`` (B x T), or T where there is none."""
    return torch.where(hits.any(1), hits.long().argmax(1), hits.size(1))
