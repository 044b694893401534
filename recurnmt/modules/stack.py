"""A stack of levels executing shared blocks according to a depth plan.

``RecurrentStack`` is the one level loop of recurnmt. It owns M unique
:class:`~recurnmt.modules.layers.TransformerBlock` objects, N per-level
:class:`~recurnmt.modules.layers.LevelParts` and a :class:`~recurnmt.modules.depth_plan.DepthPlan`;
level i runs ``blocks[plan[i]]`` with ``levels[i]``. The architectures differ only in the
configuration:

=================  ======  ==========================================================
architecture       M       per-level parts
=================  ======  ==========================================================
vanilla            N       none (norms in each block)
Universal (UT)     1       sinusoidal level embedding (``signal.kind="static"``)
RingFormer         1       own layer norms, low-rank signals on Q/K/V and FFN input
Takase & Kiyono    M < N   none; ``sharing`` orders the blocks
=================  ======  ==========================================================

For decoders, the encoder memory is projected to keys and values once per unique block
(once per sentence for a fully shared decoder) and reused by every level that runs the block;
in incremental decoding those projections live in the cache next to each level's
self-attention keys and values, so levels never mix their states.
"""

from __future__ import annotations

from torch import Tensor, nn

from recurnmt.modules.attention import KVCache
from recurnmt.modules.config import StackConfig
from recurnmt.modules.depth_plan import DepthPlan
from recurnmt.modules.layers import LevelParts, TransformerBlock
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
        self.blocks = nn.ModuleList(TransformerBlock(cfg) for _ in range(self.plan.num_unique))
        self.levels = nn.ModuleList(LevelParts(cfg) for _ in range(cfg.num_levels))
        if cfg.signal.kind == "static":
            emb = sinusoidal_level_embedding(cfg.num_levels, cfg.embed_dim)
            self.register_buffer("level_embedding", emb, persistent=False)
        else:
            self.level_embedding = None
        self.final_norm = nn.LayerNorm(cfg.embed_dim) if cfg.normalize_before else None

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
        cache: KVCache | None = None,
        return_states: bool = False,
    ) -> tuple[Tensor, list[Tensor]]:
        """Runs all levels.

        Args:
            x: B x T x C.
            key_padding_mask: B x T, True at padding.
            causal: causal self-attention (decoders).
            memory: B x S x C encoder output (decoders).
            memory_padding_mask: B x S, True at memory padding.
            cache: incremental decoding state (a dict owned by the caller); ``x`` then holds
                only the new positions.
            return_states: also return the output of every level (before the final norm).

        Returns:
            The output (B x T x C) and the list of per-level outputs (empty unless asked).
        """
        kv = self.memory_kv(memory, cache) if self.cfg.cross_attention else {}
        states: list[Tensor] = []
        for i, b in enumerate(self.plan.block_of_level):
            if self.level_embedding is not None:
                x = x + self.level_embedding[i]
            x = self.blocks[b](
                x,
                self.levels[i],
                key_padding_mask=key_padding_mask,
                causal=causal,
                memory_kv=kv.get(b),
                memory_padding_mask=memory_padding_mask,
                cache=cache,
                cache_key=f"{i}.",
            )
            if return_states:
                states.append(x)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return x, states

    def untied(self) -> RecurrentStack:
        """A copy in which every level has its own block, holding the same weights.

        The copy computes the same function; it is the reference against which weight sharing
        is checked, and a starting point for fine-tuning without sharing.
        """
        copy = RecurrentStack(
            self.cfg.replace(num_unique=None), DepthPlan.build(self.cfg.num_levels)
        )
        copy.to(next(self.parameters()).device)
        for level in range(self.cfg.num_levels):
            copy.blocks[level].load_state_dict(self.block_of_level(level).state_dict())
        copy.levels.load_state_dict(self.levels.state_dict())
        if self.final_norm is not None:
            copy.final_norm.load_state_dict(self.final_norm.state_dict())
        return copy

    def block_of_level(self, level: int) -> TransformerBlock:
        """The block object executed at ``level``."""
        return self.blocks[self.plan.block_of_level[level]]
