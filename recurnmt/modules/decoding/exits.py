"""Per-token exits that skip the work: rows leave a decoding step's level loop early.

At each decoding step (one new position per row, a :class:`~recurnmt.modules.decoding.cache.
StackCache`), from the ``min_level``-th level on, a row whose exit test passes leaves the level
loop with its state at that level as its output (CALM, Schuster et al. 2022; the
Depth-Adaptive Transformer, Elbayad et al. 2020). The rows still running go on
*compacted*: the next level's block runs its projections and FFN on those rows only, so a
level's cost follows the rows that run it; their queries attend at their places in the batch,
over keys, values and memory left where they are (:class:`StepRows`, ``MemoryKV.rows``).

Later steps attend to every level's keys and values of every earlier position, an exited row's
included. Those of the levels it skipped come from its exit state (*state propagation*: CALM's
and the Depth-Adaptive Transformer's copy of the exited state to the levels above): at
each deeper level j the state enters level j as the level's input would (its level embedding,
the Universal Transformer's position term) and only level j's key/value projection runs on it
(:meth:`~recurnmt.modules.block.TransformerBlock.keys_values`: the key and value rows of its
fused Q/K/V projection), none of its attention, cross-attention or FFN. It is exact for
what it claims (the keys and values of the exit state at the deeper levels); the alternative,
running the skipped levels for the cache, would spend what the exit saved.

The exit tests (the confidence a row's state at level r already gives the full depth's token):

* ``margin``: the softmax margin, top-1 minus top-2 probability of the output layer at level r
  (CALM's "softmax response"); it runs the output layer at every candidate level, itself
  a cost (about ``V / (12 C)`` levels' worth per candidate level at width C and vocabulary V);
* ``saturation``: the cosine of consecutive levels' states (CALM's "hidden-state saturation");
  no output layer;
* ``classifier``: one linear unit per level on the state, sigmoid(w_r . s + b_r), trained after
  the fact on a frozen model to say whether level r's argmax is the full depth's (CALM's oracle
  labels; :class:`ExitClassifier`).

A row exits where its confidence is at least the threshold. Exits apply to incremental decoding
in inference (no gradients), one position per row; a full pass (training, scoring) runs every
level. Beam search reorders the cache between steps as always: an exited row's propagated keys
and values are ordinary cache entries.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from recurnmt.modules.attention import MemoryKV
from recurnmt.modules.decoding.kv_cache import KVCache
from recurnmt.modules.decoding.options import EXIT_TESTS
from recurnmt.modules.errors import ConfigError
from recurnmt.modules.halting import HaltingAccumulator
from recurnmt.modules.hooks import LevelHook

if TYPE_CHECKING:
    from recurnmt.modules.decoding.cache import StackCache
    from recurnmt.modules.decoding.session import DecodingSession
    from recurnmt.modules.stack import RecurrentStack

TESTS = EXIT_TESTS
Head = Callable[[Tensor], Tensor]  # B x T x C features -> B x T x V logits


class ExitClassifier(nn.Module):
    """One linear unit per level on the (final-normed) state: the probability that level r's
    argmax already is the full depth's (CALM's learned early-exit classifier, one
    unit per level as the issue of record asks; trained on a frozen model).

    Args:
        num_levels: N, the decoder's levels (row r - 1 scores level r, r = 1 .. N).
        embed_dim: C.
    """

    def __init__(self, num_levels: int, embed_dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(num_levels, embed_dim))
        self.bias = nn.Parameter(torch.zeros(num_levels))

    @property
    def num_levels(self) -> int:
        return self.weight.size(0)

    def forward(self, level: int, state: Tensor) -> Tensor:
        """The exit probability of ``state`` (... x C) after ``level`` levels (1-based)."""
        w, b = self.weight[level - 1], self.bias[level - 1]
        return torch.sigmoid(state.float() @ w.float() + b.float())

    def save(self, path: Path, **about: object) -> None:
        """Writes the units and ``about`` (what model they were trained on) to ``path``."""
        torch.save({"exit_classifier": self.state_dict(), "about": about}, path)

    @classmethod
    def load(cls, path: Path) -> tuple[ExitClassifier, dict]:
        """The units written by :meth:`save`, and what they were trained on.

        Raises:
            ConfigError: ``path`` is missing or holds no exit classifier (``exit_classifier``).
        """
        try:
            saved = torch.load(path, map_location="cpu", weights_only=True)
            state = saved["exit_classifier"]
            unit = cls(*state["weight"].shape)
            unit.load_state_dict(state)
        except FileNotFoundError:
            raise ConfigError("exit_classifier", str(path), "no such file") from None
        except Exception as error:  # noqa: BLE001 - a corrupt file, whatever its fault
            text = str(error).strip()  # torch's unpickling errors run over several lines
            detail = type(error).__name__ + (f": {text}" if text and "\n" not in text else "")
            raise ConfigError(
                "exit_classifier", str(path), f"not an exit classifier file ({detail})"
            ) from None
        return unit, dict(saved.get("about", {}))


@dataclass
class Exits:
    """Which rows leave a decoding step's level loop, and how many levels rows ran.

    Args:
        test: one of :data:`TESTS`.
        threshold: a row exits where its confidence is at least this.
        min_level: the fewest levels a row runs (1 .. N - 1).
        head: the output layer (``margin``).
        classifier: the per-level units (``classifier``).
    """

    test: str
    threshold: float
    min_level: int = 1
    head: Head | None = None
    classifier: ExitClassifier | None = None
    rows: int = field(default=0, init=False)  # rows decoded (row-steps)
    levels_run: int = field(default=0, init=False)  # levels those rows ran, summed
    exited: dict[int, int] = field(default_factory=dict, init=False)  # level -> rows

    def __post_init__(self) -> None:
        if self.test not in TESTS:
            raise ConfigError("exit_test", self.test, f"one of {', '.join(TESTS)}")
        if self.test == "margin" and self.head is None:
            raise ValueError("the margin test needs the output layer")
        if self.test == "classifier" and self.classifier is None:
            raise ValueError("the classifier test needs its units")

    def confidence(self, level: int, state: Tensor, before: Tensor, normed: Tensor) -> Tensor:
        """The confidence (b) of rows whose hidden state after ``level`` levels is ``state``
        (b x 1 x C; ``before``: their state one level earlier; ``normed``: ``state`` with the
        stack's final norm, the output it would give)."""
        if self.test == "margin":
            probs = self.head(normed).float().softmax(-1)
            top = probs.topk(2, dim=-1).values
            return (top[..., 0] - top[..., 1]).flatten()
        if self.test == "saturation":
            return torch.cosine_similarity(state.float(), before.float(), dim=-1).flatten()
        return self.classifier(level, normed).flatten()

    def count(self, level: int, rows: int) -> None:
        self.rows += rows
        self.levels_run += level * rows
        self.exited[level] = self.exited.get(level, 0) + rows

    @property
    def mean_levels(self) -> float:
        """Levels a row ran per decoding step, on average so far (0 before any)."""
        return self.levels_run / self.rows if self.rows else 0.0

    def summary(self, num_levels: int) -> str:
        """One line for the log: levels run on average, and where rows left."""
        shares = ", ".join(
            f"{level}: {100 * n / self.rows:.1f}%" for level, n in sorted(self.exited.items())
        )
        return (
            f"exits ({self.test} >= {self.threshold:g}, from level {self.min_level}): rows ran "
            f"{self.mean_levels:.2f} of {num_levels} levels on average over {self.rows} "
            f"row-steps (rows leaving at level {shares})"
        )


class StepRows:
    """A level's :class:`KVCache` as the running rows ``rows`` see it during one step (the
    level protocol's cache; ``rows`` None: every row): the block appends their new keys and
    values at ``position`` and attends with their queries at their places in the batch
    (:attr:`query_rows`) over every row's keys and values, which are therefore never gathered
    row by row. Attention's cost stays the whole batch's (a few percent of a level at one new
    position per row); the projections and the FFN run for the running rows only."""

    key_mask = None

    def __init__(self, cache: KVCache, position: int, rows: Tensor | None) -> None:
        self.cache, self.position, self.query_rows = cache, position, rows

    def write(self, kv: Tensor, rows: Tensor | None) -> None:
        """Writes ``kv`` (2 x b x H x 1 x D) as the new position of ``rows`` (None: all)."""
        slot = self.cache.buffer.narrow(3, self.position, 1)
        if rows is None:
            slot.copy_(kv)
        else:  # index_copy_ does not cast (autocast gives kv in its lower precision)
            slot.index_copy_(1, rows, kv.to(slot.dtype))

    def append_pair(self, kv: Tensor) -> tuple[Tensor, Tensor]:
        self.write(kv, self.query_rows)
        keys, values = self.cache.buffer.narrow(3, 0, self.position + 1).unbind(0)
        return keys, values


class _StepLevels(dict):
    """``{level: StepRows}`` read as a :class:`StackCache`'s levels (``level(i)``)."""

    def level(self, index: int) -> StepRows:
        return self[index]


def _hooks_rows(hooks: Sequence[LevelHook], rows: Tensor) -> list[LevelHook]:
    selected = []
    for hook in hooks:
        select = getattr(hook, "rows", None)
        if select is None:
            raise ValueError(f"{type(hook).__name__} cannot follow rows that exit early")
        selected.append(select(rows))
    return selected


class _Running:
    """The rows of one decoding step still in its level loop (both loops of this module):
    every level's cache opened for the step's position of every row, the running rows' global
    indices, their memory and hooks, and the outputs of the rows that left."""

    def __init__(self, stack, x: Tensor, order: Sequence[int], kv: dict[int, MemoryKV],
                 cache: StackCache, hooks: Sequence[LevelHook]) -> None:  # fmt: skip
        if x.size(1) != 1:
            raise ValueError(f"rows leave a step's loop one position at a time, not {x.size(1)}")
        self.b = x.size(0)
        self.steps = _StepLevels()
        for i in order:
            level = cache.level(i)
            attn = stack.block_of_level(i).self_attn
            shape = (self.b, attn.num_heads, 1, attn.embed_dim // attn.num_heads)
            self.steps[i] = StepRows(level, level.open_step(x.new_empty(shape)), None)
        self.kv, self.memory, self.hooks = kv, kv, list(hooks)
        self.rows: Tensor | None = None  # global indices of the running rows (None: all)
        self.out: Tensor | None = None

    def split(
        self, stack, leave: Tensor, states: Tensor, deeper: Sequence[int], session
    ) -> Tensor | None:
        """The running rows where ``leave`` (b) leave with their ``states`` (b x 1 x C): their
        output, and the state the levels ``deeper`` take their keys and values from; the
        others run on. Returns those (indices into the running rows; empty: none), or None
        where no row left."""
        local = leave.nonzero().flatten()
        if local.numel() == 0:
            return None
        state = states.index_select(0, local)
        gone = local if self.rows is None else self.rows.index_select(0, local)
        if self.out is None:
            self.out = state.new_empty(self.b, 1, state.size(-1))
        self.out.index_copy_(0, gone, state)
        hooks = _hooks_rows(self.hooks, local)
        _propagate(stack, state, deeper, gone, self.steps, hooks, session)
        keep = (~leave).nonzero().flatten()
        if keep.numel():
            self._keep(keep)
        return keep

    def _keep(self, keep: Tensor) -> None:
        """The running rows ``keep`` (indices into them) run on."""
        self.rows = keep if self.rows is None else self.rows.index_select(0, keep)
        self.hooks = _hooks_rows(self.hooks, keep)
        by_id: dict[int, MemoryKV] = {}
        self.memory = {
            j: by_id.setdefault(id(m), m._replace(rows=self.rows)) for j, m in self.kv.items()
        }
        for s in self.steps.values():
            s.query_rows = self.rows

    def result(self, x: Tensor) -> Tensor:
        """Every row's output, the running rows' ``x`` among those that left."""
        if self.out is None:
            return x
        self.out.index_copy_(0, self.rows, x)
        return self.out


def run_levels(
    stack: RecurrentStack,
    x: Tensor,
    order: Sequence[int],
    kv: dict[int, MemoryKV],
    cache: StackCache,
    hooks: Sequence[LevelHook],
    session: DecodingSession | None,
    exits: Exits,
) -> Tensor:
    """The levels ``order`` of one decoding step on ``x`` (B x 1 x C: one new position per
    row) with exits: returns every row's hidden state (B x 1 x C), each at the level it left.

    Every level's cache gains the step's position for every row: the running rows' keys and
    values from the block, the exited rows' from their exit state (state propagation).
    """
    running = _Running(stack, x, order, kv, cache, hooks)
    last = len(order) - 1
    for step, i in enumerate(order):
        before = x
        x = stack._level(i, x, running.memory, None, running.steps, running.hooks,
                         session=session)  # fmt: skip
        ran = step + 1
        if ran < exits.min_level or step == last:
            continue
        normed = x if stack.final_norm is None else stack.final_norm(x)
        leave = exits.confidence(ran, x, before, normed) >= exits.threshold
        keep = running.split(stack, leave, x, order[step + 1 :], session)
        if keep is None:
            continue
        exits.count(ran, x.size(0) - keep.numel())
        if keep.numel() == 0:
            return running.out
        x = x.index_select(0, keep)
    exits.count(len(order), x.size(0))
    return running.result(x)


def _propagate(
    stack: RecurrentStack,
    state: Tensor,
    deeper: Sequence[int],
    rows: Tensor,
    steps: dict[int, StepRows],
    hooks: Sequence[LevelHook],
    session: DecodingSession | None,
) -> None:
    """The keys and values of the levels ``deeper`` for rows ``rows`` that exited with
    ``state`` (n x 1 x C): each level's key/value projection of the state as it enters that
    level (CALM's state propagation)."""
    for j in deeper:
        parts = stack.levels[j] if session is None else session.levels[j]
        h = parts.enter(state)
        for hook in hooks:
            h = hook.before_level(j, h)
        steps[j].write(stack.block_of_level(j).keys_values(h, parts, hooks), rows)


def exits_of(
    options,
    num_levels: int,
    head: Head | None,
    load: Callable[[str], ExitClassifier] | None = None,
) -> Exits | None:
    """The :class:`Exits` the decoding ``options`` ask for (None: no exits), for a decoder of
    ``num_levels`` levels and output layer ``head``; ``load`` reads the classifier file."""
    if options.exit_test is None:
        return None
    classifier = None
    if options.exit_test == "classifier":
        classifier = (load or (lambda p: ExitClassifier.load(Path(p))[0]))(options.exit_classifier)
        if classifier.num_levels != num_levels:
            raise ConfigError(
                "exit_classifier", options.exit_classifier,
                f"units for {classifier.num_levels} levels, the decoder has {num_levels}",
            )  # fmt: skip
    return Exits(options.exit_test, options.exit_threshold, options.min_exit_level, head,
                 classifier)  # fmt: skip


def run_halting(
    stack: RecurrentStack,
    x: Tensor,
    order: Sequence[int],
    kv: dict[int, MemoryKV],
    cache: StackCache,
    hooks: Sequence[LevelHook],
    session: DecodingSession | None,
) -> Tensor:
    """The levels ``order`` of one decoding step on ``x`` (B x 1 x C) under ACT's paper rule
    (:mod:`recurnmt.modules.act_rule`): returns every row's ACT output (B x 1 x C).

    The halting rows take the place of the exiting rows of :func:`run_levels`: a row whose
    halting level this was leaves the loop with its ACT output, which is the state the deeper
    levels' keys and values come from (:func:`_propagate`); the rest run on compacted.
    """
    running = _Running(stack, x, order, kv, cache, hooks)
    halting = HaltingAccumulator(x, stack.halting.threshold, ponder=False)
    last = len(order) - 1
    for step, i in enumerate(order):
        x = stack._level(i, x, running.memory, None, running.steps, running.hooks, halting,
                         step == last, session)  # fmt: skip
        if step == last:
            break
        keep = running.split(stack, halting.halted().flatten(), halting.output,
                             order[step + 1 :], session)  # fmt: skip
        if keep is None:
            continue
        if keep.numel() == 0:
            return running.out
        x, halting = x.index_select(0, keep), halting.select(keep)
    return running.result(halting.output)
