"""A stack of levels executing shared blocks according to a depth plan.

``RecurrentStack`` is the one level loop of recurnmt. It owns M unique
:class:`~recurnmt.modules.layers.TransformerBlock` objects, N per-level
:class:`~recurnmt.modules.layers.LevelParts` and a :class:`~recurnmt.modules.depth_plan.DepthPlan`;
level i runs ``blocks[plan[i]]`` with ``levels[i]``. The architectures differ only in the
configuration:

=================  ======  ==========================================================
architecture       M       per-level parts / options
=================  ======  ==========================================================
vanilla            N       none (norms in each block)
Universal (UT)     1       sinusoidal level + position embedding at every level,
                           optional ACT halting
RingFormer         1       own layer norms, low-rank signals on Q/K/V and FFN input
One Wide FFN       N       attention per block, one FFN shared by all blocks
Takase & Kiyono    M < N   none; ``sharing`` orders the blocks
SReT (internal)    M, R    ``sequence`` order over M * R levels, an NLL after every
                           level, LRC on every residual, sliced groups per loop
=================  ======  ==========================================================

For decoders, the encoder memory is projected to keys and values once per unique block
(once per sentence for a fully shared decoder) and reused by every level that runs the block;
in incremental decoding those projections live in the cache next to each level's
self-attention keys and values, so levels never mix their states.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torch import Tensor, nn

from recurnmt.modules.attention import KVCache
from recurnmt.modules.config import ConfigError, StackConfig
from recurnmt.modules.depth_plan import DepthPlan
from recurnmt.modules.halting import HaltingAccumulator, HaltingUnit
from recurnmt.modules.layers import LevelParts, TransformerBlock, build_ffn
from recurnmt.modules.level_embedding import sinusoidal_level_embedding


class RecurrentStack(nn.Module):
    """N levels over M unique Transformer blocks.

    Args:
        cfg: the stack configuration.
        plan: the level -> block mapping; built from ``cfg`` when omitted.
    """

    def __init__(self, cfg: StackConfig, plan: DepthPlan | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.plan = plan or DepthPlan.build(cfg.num_levels, cfg.num_unique, cfg.sharing)
        if self.plan.num_levels != cfg.num_levels:
            raise ValueError(
                f"depth plan has {self.plan.num_levels} levels, config {cfg.num_levels}"
            )
        if cfg.attn_permute and len(cfg.attn_permute) < self.plan.num_loops:
            raise ConfigError(
                f"attn_permute={cfg.attn_permute} gives a setting for {len(cfg.attn_permute)} "
                f"loop(s), but blocks run up to {self.plan.num_loops} times"
            )
        if cfg.attn_groups and len(cfg.attn_groups) < self.plan.num_loops:
            raise ConfigError(
                f"attn_groups={cfg.attn_groups} gives groups for {len(cfg.attn_groups)} "
                f"loop(s), but blocks run up to {self.plan.num_loops} times"
            )
        # sliced attention groups of each level: loop r of a block uses attn_groups[r]
        self.level_groups = tuple(
            cfg.attn_groups[self.plan.loop_of_level(i)] if cfg.attn_groups else 1
            for i in range(cfg.num_levels)
        )
        self.level_permute = tuple(
            cfg.attn_permute[self.plan.loop_of_level(i)] if cfg.attn_permute else True
            for i in range(cfg.num_levels)
        )
        shared_ffn = build_ffn(cfg) if cfg.ffn_sharing == "shared" else None
        self.blocks = nn.ModuleList(
            TransformerBlock(cfg, ffn=shared_ffn) for _ in range(self.plan.num_unique)
        )
        self.levels = nn.ModuleList(LevelParts(cfg) for _ in range(cfg.num_levels))
        if cfg.signal.kind == "static" or cfg.positions_every_level:
            emb = sinusoidal_level_embedding(cfg.num_levels, cfg.embed_dim)
            self.register_buffer("level_embedding", emb, persistent=False)
        else:
            self.level_embedding = None
        self.halting = HaltingUnit(cfg.embed_dim, cfg.act_bias_init) if cfg.act else None
        self.final_norm = (
            nn.LayerNorm(cfg.embed_dim, eps=cfg.norm_eps) if cfg.has_final_norm else None
        )

    def memory_kv(
        self, memory: Tensor, cache: KVCache | None = None
    ) -> dict[int, tuple[Tensor, Tensor]]:
        """Keys/values of ``memory`` (B x S x C) for every unique block, computed once.

        In incremental decoding they are computed at the first step and read back from
        ``cache`` afterwards.
        """
        kv = {}
        for b in sorted(set(self.plan.block_of_level)):
            key = f"m{b}."
            if cache is not None and key + "k" in cache:
                kv[b] = cache[key + "k"], cache[key + "v"]
                continue
            kv[b] = self.blocks[b].cross_attn.project_memory(memory)
            if cache is not None:
                cache[key + "k"], cache[key + "v"] = kv[b]
        return kv

    def forward(
        self,
        x: Tensor,
        *,
        key_padding_mask: Tensor | None = None,
        causal: bool = False,
        memory: Tensor | None = None,
        memory_padding_mask: Tensor | None = None,
        positions: Tensor | None = None,
        cache: KVCache | None = None,
        levels: Sequence[int] | None = None,
        return_states: bool = False,
        aux: dict[str, Tensor] | None = None,
        need_attn: bool = False,
        level_kwargs: Callable[[int], dict[str, Any]] | None = None,
        after_level: Callable[[int, Tensor], Tensor] | None = None,
    ) -> tuple[Tensor, list[Tensor]]:
        """Runs the levels.

        Args:
            x: B x T x C.
            key_padding_mask: B x T, True at padding.
            causal: causal self-attention (decoders).
            memory: B x S x C encoder output (decoders).
            memory_padding_mask: B x S, True at memory padding.
            positions: B x T x C position embeddings, added at every level with the level
                embedding when ``cfg.positions_every_level`` (Universal Transformer).
            cache: incremental decoding state (a dict owned by the caller); ``x`` then holds
                only the new positions.
            levels: run only these levels, in this order (e.g. SReT's shallow branch
                ``plan.first_loop_levels()``); all levels by default.
            return_states: also return the output of every level (before the final norm).
            aux: if given, receives ``"ponder"`` (B x T, ACT's N + R per position) and, with
                ``need_attn``, ``"attn"``.
            need_attn: put the last level's cross-attention probabilities, averaged over
                heads (B x T x S), into ``aux["attn"]`` (fairseq's alignment output).
            level_kwargs: called with a level index before that level runs; returns extra
                keyword arguments for its block (``attn_bias``, ``attn_logits``,
                ``ffn_context``: DVT's relationship and feature reuse), computed lazily so
                that only one level's extras are alive at a time.
            after_level: called as ``x = after_level(i, x)`` after level i's block, for
                per-level parts that read across levels (MRLA layer attention,
                :class:`~recurnmt.modules.layer_attention.LayerAttention`).

        Returns:
            The output (B x T x C) and the list of per-level outputs (empty unless asked).
        """
        if self.cfg.positions_every_level and positions is None:
            raise ValueError("this stack adds positions at every level: pass positions")
        kv = self.memory_kv(memory, cache) if self.cfg.cross_attention else {}
        order = range(self.cfg.num_levels) if levels is None else levels
        halting = HaltingAccumulator(x, self.cfg.act_threshold) if self.halting else None
        states: list[Tensor] = []
        for step, i in enumerate(order):
            if self.level_embedding is not None:
                x = x + self.level_embedding[i]
            if self.cfg.positions_every_level:
                x = x + positions
            last = step == len(order) - 1
            if halting is not None:
                weights = halting.weights(self.halting(x), last=last)
            b = self.plan.block_of_level[i]
            x = self.blocks[b](
                x,
                self.levels[i],
                key_padding_mask=key_padding_mask,
                causal=causal,
                memory_kv=kv.get(b),
                memory_padding_mask=memory_padding_mask,
                cache=cache,
                cache_key=f"{i}.",
                attn_groups=self.level_groups[i],
                attn_permute=self.level_permute[i],
                drop_path=self.cfg.drop_path_rate(i),
                cross_weights=aux if need_attn and last and aux is not None else None,
                **(level_kwargs(i) if level_kwargs is not None else {}),
            )
            if after_level is not None:
                x = after_level(i, x)
            if halting is not None:
                halting.accumulate(x, weights)
            if return_states:
                states.append(x if halting is None else halting.output)
            # with a cache every level must fill its keys/values for later steps
            if halting is not None and cache is None and not need_attn and halting.all_halted():
                break
        if halting is not None:
            x = halting.output
            if aux is not None:
                aux["ponder"] = halting.ponder_cost
        if self.final_norm is not None:
            x = self.final_norm(x)
        return x, states

    @staticmethod
    def reorder_cache(cache: KVCache, new_order: Tensor) -> KVCache:
        """The cache with its batch rows selected by ``new_order`` (beam search).

        Self-attention keys/values are reordered. The projected memory is the same for all
        beams of a sentence, so while the batch keeps its size (beams reshuffled within each
        sentence) it is left as is, as fairseq does for encoder-decoder attention; it is
        selected only when finished sentences leave the batch.
        """
        out = {}
        for key, value in cache.items():
            same_size = value.size(0) == new_order.numel()
            out[key] = (
                value if key.startswith("m") and same_size else value.index_select(0, new_order)
            )
        return out

    def untied(self) -> RecurrentStack:
        """A copy in which every level has its own block, holding the same weights.

        The copy computes the same function; it is the reference against which weight sharing
        is checked, and a starting point for fine-tuning without sharing.
        """
        ffn_sharing = "block" if self.cfg.ffn_sharing == "shared" else self.cfg.ffn_sharing
        cfg = self.cfg.replace(num_unique=None, ffn_sharing=ffn_sharing)
        copy = RecurrentStack(cfg, DepthPlan.build(self.cfg.num_levels))
        copy.level_groups = self.level_groups
        copy.level_permute = self.level_permute
        copy.to(next(self.parameters()).device)
        for level in range(self.cfg.num_levels):
            copy.blocks[level].load_state_dict(self.block_of_level(level).state_dict())
        copy.levels.load_state_dict(self.levels.state_dict())
        for name in ("halting", "final_norm"):
            if getattr(self, name) is not None:
                getattr(copy, name).load_state_dict(getattr(self, name).state_dict())
        return copy

    def block_of_level(self, level: int) -> TransformerBlock:
        """The block object executed at ``level``."""
        return self.blocks[self.plan.block_of_level[level]]
