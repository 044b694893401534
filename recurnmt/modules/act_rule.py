"""The Universal Transformer paper's ACT rule: halted positions leave the level loop.

Dehghani et al. (2019), "Universal Transformers", sec. 2.2: "once a symbol halts, its state is
simply copied to the next step until all blocks halt, or we reach a maximum number of steps".
The authors' code (tensor2tensor, ``universal_transformer_act`` in
``models/research/universal_transformer_util.py``) transforms every position at every step
instead and only stops changing a halted position's output (``update_weights`` 0); that is
the ``authors`` rule, recurnmt's default (:mod:`recurnmt.modules.halting`). This module is the
``paper`` rule (``act_rule``):

* *the state that is copied* is the halted position's ACT output y = sum_{t<=N} w_t s_t (Graves
  2016 eq. 6-7, with w_t = p_t before its halting level N and the remainder R at N): what the
  code calls ``new_state``, the one state it copies for a halted position. A position halting
  at level N still runs level N (its weight there is R); from level N + 1 on its state is y.
* *what a halted position still is*: a key and value of self-attention. At every deeper level
  j its frozen state enters level j as any input does (level embedding, UT positions) and
  only level j's key/value projection runs on it
  (:meth:`~recurnmt.modules.block.TransformerBlock.keys_values`); it is no query, so the Q
  projection, the attention output, cross-attention and the FFN run on the running positions
  only.
* *the output mixture*: y <- w_t s_t + (1 - w_t) y exactly as under the authors' rule (Graves
  eq. 6-7; w_t = 0 after N), so a position's output is the same sum over the levels it ran;
  only the s_t of running positions differ (they attend to frozen states, not transformed
  ones). With no early halting the two rules give the same outputs.
* *the ponder cost*: N + R (Graves eq. 11) as under the authors' rule; N, the levels a
  position was counted running, is now also the levels that did its work.
* *padding* (B x T ``padding_mask``) is halted from the start: no work, no weight, output 0
  (the keys are masked anyway; the criterion ignores padding's ponder cost).

How the levels run:

* training (gradients on), hooks that add terms inside the block (attention probes, DVT's
  FFN input), a static-shape cache, or several new positions on a cache: *masked*, every
  position runs the block on its state (the frozen one where halted, which gives exactly the
  keys and values above) and the halted positions' results are discarded: the same values,
  none of the work saved;
* a full pass in inference (no gradients; the encoder, scoring): *compacted*, each row's
  running positions are gathered as queries (B' x T': the rows with a running position, the
  most running positions of a row), the level's keys and values are the running queries' own
  and the halted positions' projections of their frozen state, and the block runs on the
  queries alone; a level's cost follows the running positions (up to the padding of each row
  to T');
* incremental decoding in inference (one new position per row): halted rows leave the step's
  level loop, their deeper levels' keys and values from their frozen state, through the
  compaction of the per-row exits (:func:`recurnmt.modules.decoding.exits.run_halting`).

``threshold`` = 1: a position whose sum reaches exactly 1 has no weight left and is frozen,
while the ponder count (as the authors' code) counts it running one level more.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from recurnmt.modules.attention import MemoryKV
from recurnmt.modules.checkpointing import checkpointed_block
from recurnmt.modules.decoding.exits import run_halting
from recurnmt.modules.halting import HaltingAccumulator, HaltingUnit
from recurnmt.modules.hooks import LevelHook

if TYPE_CHECKING:
    from recurnmt.modules.decoding.cache import StackCache
    from recurnmt.modules.decoding.session import DecodingSession
    from recurnmt.modules.level_parts import LevelParts
    from recurnmt.modules.stack import RecurrentStack

RULES = ("authors", "paper")


def set_act_rule(model: nn.Module, rule: str) -> int:
    """Every halting unit of ``model`` follows ``rule`` from now on (a model trained with one
    rule decoded with the other, ``scripts/act_rule.py``); returns how many units there are.

    Raises:
        ValueError: an unknown rule.
    """
    if rule not in RULES:
        raise ValueError(f"act_rule={rule!r}: choose one of {', '.join(RULES)}")
    units = [m for m in model.modules() if isinstance(m, HaltingUnit)]
    for unit in units:
        unit.rule = rule
    return len(units)


def _block_terms(hooks: Sequence[LevelHook]) -> bool:
    """Whether a hook adds something inside the block (attention terms, probes, the FFN's
    input), which would see the compacted queries instead of the pass's positions."""
    return any(
        type(hook).attention is not LevelHook.attention
        or type(hook).cross_attention is not LevelHook.cross_attention
        or type(hook).ffn_input is not LevelHook.ffn_input
        for hook in hooks
    )


def run_paper_rule(
    stack: RecurrentStack,
    x: Tensor,
    order: Sequence[int],
    kv: dict[int, MemoryKV],
    padding_mask: Tensor | None,
    cache: StackCache | None,
    hooks: Sequence[LevelHook],
    session: DecodingSession | None,
    may_stop: bool,
) -> tuple[Tensor, Tensor | None]:
    """The levels ``order`` on ``x`` (B x T x C) under the paper rule (the module docstring):
    returns the ACT output (B x T x C) and, without a cache, the ponder cost N + R (B x T)."""
    unit = stack.halting
    if cache is not None and not torch.is_grad_enabled() and x.size(1) == 1:
        if hasattr(cache.level(order[0]), "open_step"):  # a static-shape cache runs masked
            return run_halting(stack, x, order, kv, cache, hooks, session), None
    halting = HaltingAccumulator(x, unit.threshold, ponder=cache is None)
    if padding_mask is not None:
        halting.halt(padding_mask)
    compact = cache is None and not torch.is_grad_enabled() and not _block_terms(hooks)
    last = len(order) - 1
    for step, i in enumerate(order):
        running = ~halting.halted()  # B x T, before this level
        if may_stop and not bool(running.any()):
            break
        x = torch.where(running.unsqueeze(-1), x, halting.output)  # halted: the frozen y
        parts = stack.levels[i] if session is None else session.levels[i]
        h = parts.enter(x)
        for hook in hooks:
            h = hook.before_level(i, h)
        weights = halting.weights(stack.halting(h, session and session.halting), last=step == last)
        block = stack.block_of_level(i)
        if compact:
            x = _compacted_level(block, parts, h, x, running, padding_mask, kv.get(i))
        else:
            level_cache = None if cache is None else cache.level(i)
            kwargs = dict(
                padding_mask=padding_mask, memory=kv.get(i), cache=level_cache, hooks=hooks
            )
            if stack.grad_checkpointing and stack.training and torch.is_grad_enabled():
                out = checkpointed_block(block, h, parts, stack.offload_activations, **kwargs)
            else:
                out = block(h, parts, **kwargs)
            x = torch.where(running.unsqueeze(-1), out, x)
        for hook in hooks:
            x = hook.after_level(i, x)
        halting.accumulate(x, weights)
    return halting.output, halting.ponder_cost if halting.ponder else None


class _LevelKeys:
    """One level's keys and values for the compacted queries of a full pass, read by the
    block's self-attention as a cache: the halted positions' from their frozen state
    (``frozen``: their rows, their positions and their keys and values, n x 2 x H x D), the
    running positions' as the block computes them (:meth:`append_pair`), and which keys each
    query may attend (:attr:`key_mask`, B' x 1 x T' x T)."""

    query_rows = None  # every row of the compacted block has its queries

    def __init__(
        self,
        length: int,
        frozen: tuple[Tensor, Tensor, Tensor] | None,
        index: Tensor,
        valid: Tensor,
        key_mask: Tensor,
    ) -> None:
        self.length, self.frozen, self.index, self.valid = length, frozen, index, valid
        self.key_mask = key_mask

    def append_pair(self, kv: Tensor) -> tuple[Tensor, Tensor]:
        """Every position's keys and values (B' x H x T x D each) with the queries' own
        (``kv``: 2 x B' x H x T' x D) at their positions; padding's are 0 (masked)."""
        two, b, heads, _, d = kv.shape
        buffer = kv.new_zeros(two, b, heads, self.length, d)  # the dtype autocast gave kv
        if self.frozen is not None:
            rows, positions, values = self.frozen
            buffer[:, rows, :, positions] = values.to(kv.dtype)
        rows, slots = self.valid.nonzero(as_tuple=True)
        buffer[:, rows, :, self.index[rows, slots]] = kv[:, rows, :, slots]
        keys, values = buffer.unbind(0)
        return keys, values


def _compacted_level(
    block: nn.Module,
    parts: LevelParts,
    h: Tensor,
    x: Tensor,
    running: Tensor,
    padding_mask: Tensor | None,
    memory: MemoryKV | None,
) -> Tensor:
    """Level ``parts`` of ``block`` on the running positions alone: ``h`` (B x T x C) is every
    position's input to the level (entered), ``x`` their states (halted: frozen); returns the
    states after the level, the halted positions' unchanged."""
    counts = running.sum(1)  # B
    rows = counts.nonzero().flatten()  # the B' rows with a running position
    if rows.numel() == 0:
        return x
    run = running.index_select(0, rows)  # B' x T
    width = int(counts.max())
    # slot s of a row holds its s-th running position; empty slots repeat the first (a valid
    # query, whose result is dropped)
    index = torch.argsort((~run).to(torch.int8), dim=1, stable=True)[:, :width]  # B' x T'
    valid = torch.arange(width, device=h.device) < counts.index_select(0, rows).unsqueeze(1)
    index = torch.where(valid, index, index[:, :1])
    hr = h.index_select(0, rows)  # B' x T x C
    c, t = h.size(-1), h.size(1)
    queries = hr.gather(1, index.unsqueeze(-1).expand(-1, -1, c))  # B' x T' x C

    pad = None if padding_mask is None else padding_mask.index_select(0, rows)  # B' x T
    fr, fp = (~run if pad is None else ~run & ~pad).nonzero(as_tuple=True)
    frozen = None
    if fr.numel():  # the halted positions: their frozen state's keys and values only
        kv = block.keys_values(hr[fr, fp].unsqueeze(0), parts)  # 2 x 1 x H x n x D
        frozen = (fr, fp, kv.squeeze(1).permute(2, 0, 1, 3))  # n x 2 x H x D
    attn = block.self_attn
    keys = torch.arange(t, device=h.device)
    allowed = torch.ones(rows.numel(), width, t, dtype=torch.bool, device=h.device)
    if pad is not None:
        allowed = allowed & ~pad.unsqueeze(1)
    if attn.causal:
        allowed = allowed & (keys <= index.unsqueeze(-1))
        if pad is not None:  # as attention_mask: a query always sees itself
            allowed = allowed | (keys == index.unsqueeze(-1))
    cache = _LevelKeys(t, frozen, index, valid, allowed.unsqueeze(1))
    mem = None if memory is None else memory._replace(rows=rows)  # their queries alone
    out = block(queries, parts, memory=mem, cache=cache)  # B' x T' x C
    vr, vs = valid.nonzero(as_tuple=True)
    x = x.clone()
    x[rows.index_select(0, vr), index[vr, vs]] = out[vr, vs].to(x.dtype)
    return x
