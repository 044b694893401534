"""Relaxed recursion: a level's own low-rank deltas on every linear of a shared block.

Relaxed Recursive Transformers (Bae et al., ICLR 2025, arXiv 2410.20672; "Relaxed Recursive
Transformer: multi-LoRA layers", eq. 3) relax layer tying with a LoRA per level: level l runs
every linear of its (shared) block as

    h = W' x + b' + B_l A_l x + db_l,

W', b' the block's weight and bias, shared by every level that runs the block, and B_l A_l the
level's own rank-r term (LoRA, Hu et al. 2021), computed in rank space, x -> A_l x (r values)
-> B_l (A_l x): no d x d matrix per level unless r is the full rank. ``db_l`` is the level's
own bias delta: the paper's models (Gemma, TinyLlama, Pythia) have no biases in these linears;
fairseq's transformer has them, and each trained layer has its own, so recurnmt gives every
relaxed level a bias delta next to its LoRA (what makes the full-rank relaxation exactly the
original model, :mod:`recurnmt.modules.relaxed_init`). Without block biases
(``StackConfig.bias=False``) there are none.

The linears, as the paper relaxes "every linear of the block" (its LoRA targets the query,
key, value and output projections and the FFN's): the fused Q/K/V projection as three groups
(one LoRA each for Q, K and V), the attention output, the cross-attention's query, its fused
K/V (two groups) and output, the FFN's up- and down-projection.

The term is the same equation as a RingFormer level signal added after a projection
(RingFormer eq. 5-6, ``W x + (x B) A^T``), so each delta is a
:class:`~recurnmt.modules.level_signals.LowRankSignal`; only its initialisation differs:

* trained from scratch (``fairseq-train --level-lora-rank R``): LoRA's own (Hu et al. 2021
  sec. 4.1 and its code): the up factor zero, the down factor Kaiming-uniform, so training
  starts as plain sharing;
* converted from a trained model: the truncated SVD of the difference between the original
  layer's weight and the shared one, with the singular values in the up factor,
  ``B_l = U_r S_r``, ``A_l = V_r^T`` (the paper's SVD initialisation, sec. "multi-LoRA layers";
  the first author's public code, ``model/relaxation/lora/svd_init.py`` of
  ``raymin0223/mixture_of_recursions``: ``lora_B = u @ diag(s)``, ``lora_A = v``), see
  :meth:`LowRankDelta.set_difference`. The LoRA scale alpha / r of that code (PEFT's) is 1
  here: its SVD initialisation writes the factors unscaled.

Shapes: ... x in -> ... x (groups * out), groups contiguous as in a fused projection.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from recurnmt.modules.level_signals import LowRankSignal

# name -> (the block's linear it relaxes, its groups): Q/K/V and K/V are fused projections
LINEARS: dict[str, tuple[str, int]] = {
    "qkv": ("self_attn.qkv_proj", 3),
    "out": ("self_attn.out_proj", 1),
    "cross_q": ("cross_attn.q_proj", 1),
    "cross_kv": ("cross_attn.kv_proj", 2),
    "cross_out": ("cross_attn.out_proj", 1),
    "ffn_up": ("ffn.up", 1),
    "ffn_down": ("ffn.down", 1),
}


class LowRankDelta(nn.Module):
    """A level's term on one (possibly fused) linear: ``(x A^T) B^T + db`` per group.

    Args:
        in_dim: the linear's input width.
        out_dim: the output width of each group.
        rank: the LoRA rank; capped at ``min(in_dim, out_dim)``, the full rank (as the first
            author's code caps its rank pattern).
        groups: groups of a fused projection (3 for Q/K/V), each with its own factors.
        bias: a bias delta (``groups * out_dim``, zero-initialised).
    """

    def __init__(
        self, in_dim: int, out_dim: int, rank: int, groups: int = 1, bias: bool = True
    ) -> None:
        super().__init__()
        rank = min(rank, in_dim, out_dim)
        # LoRA's initialisation (Hu et al. 2021): up factor zero, down Kaiming-uniform
        self.lowrank = LowRankSignal(in_dim, out_dim, rank, groups, down_init="kaiming")
        self.bias = nn.Parameter(torch.zeros(groups * out_dim)) if bias else None

    @property
    def rank(self) -> int:
        return self.lowrank.rank

    def forward(self, x: Tensor) -> Tensor:
        out = self.lowrank(x)  # ... x (G * out), in rank space
        return out if self.bias is None else out + self.bias

    def folded(self, weight: Tensor, bias: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """A linear's ``weight`` and ``bias`` with this term folded in, ``W' + B A`` and
        ``b' + db``: the same linear map as ``linear(x) + self(x)`` (Relaxed Recursive
        Transformers eq. 3, by associativity), as one plain linear. Made when a decoding
        session starts (:mod:`recurnmt.modules.decoding.session`): a relaxed level then runs its linears
        with as many operations as an unshared layer."""
        return self.lowrank.folded_weight(weight, into_input=False), _sum(bias, self.bias)

    @torch.no_grad()
    def set_difference(self, weight: Tensor, bias: Tensor | None = None) -> tuple[float, float]:
        """Starts the term at the truncated SVD of ``weight`` (Relaxed Recursive Transformers,
        SVD initialisation of the multi-LoRA layers): per group, ``weight_g = U S V^T``,
        up ``U_r S_r``, down ``V_r^T``, r this term's rank; exact at the full rank.

        Args:
            weight: the original layer's weight minus the shared one, (G * out) x in.
            bias: the original layer's bias minus the shared one, G * out (or None).

        Returns:
            The energy of ``weight`` the term keeps and its whole energy (sums of squared
            singular values: the kept one over the whole is 1 minus the squared relative
            Frobenius error of the truncation, Eckart-Young).
        """
        signal, r = self.lowrank, self.rank
        groups = weight.view(signal.groups, signal.out_dim, -1).double()  # G x out x in
        u, s, vh = torch.linalg.svd(groups, full_matrices=False)
        signal.up.copy_(u[..., :r] * s[..., None, :r])  # G x out x r
        signal.down.copy_(vh[:, :r].reshape(-1, vh.size(-1)))  # (G * r) x in
        if self.bias is not None:
            self.bias.copy_(bias if bias is not None else 0)
        energy = s.square()
        return energy[..., :r].sum().item(), energy.sum().item()

    def weight_delta(self) -> Tensor:
        """The term's weight, (G * out) x in (for tests and analysis; forward never forms it)."""
        signal = self.lowrank
        down = signal.down.view(signal.groups, signal.rank, -1)  # G x r x in
        return (signal.up @ down).flatten(0, 1)


class LevelLoRA(nn.ModuleDict):
    """A level's :class:`LowRankDelta` for every linear of its block (keys of :data:`LINEARS`).

    Args:
        embed_dim: block width C.
        ffn_dim: FFN inner width.
        rank: the LoRA rank r (>= 1; each linear's is capped at its full rank).
        cross_attention: the block has cross-attention (decoders).
        ffn: the block has an FFN.
        bias: the block's linears have biases, so the level gets bias deltas.
    """

    def __init__(
        self,
        embed_dim: int,
        ffn_dim: int,
        rank: int,
        *,
        cross_attention: bool = False,
        ffn: bool = True,
        bias: bool = True,
    ) -> None:
        if rank < 1:
            raise ValueError(f"rank={rank}: a level LoRA has rank 1 or more (0: no LoRA)")
        c, f = embed_dim, ffn_dim
        shapes = {"qkv": (c, c, 3), "out": (c, c, 1)}
        if cross_attention:
            shapes |= {"cross_q": (c, c, 1), "cross_kv": (c, c, 2), "cross_out": (c, c, 1)}
        if ffn:
            shapes |= {"ffn_up": (c, f, 1), "ffn_down": (f, c, 1)}
        super().__init__(
            {
                name: LowRankDelta(i, o, rank, groups=g, bias=bias)
                for name, (i, o, g) in shapes.items()
            }
        )


def _sum(a: Tensor | None, b: Tensor | None) -> Tensor | None:
    if a is None:
        return b
    return a if b is None else a + b
