"""Parameter counts: distinct parameters, and RingFormer's P*.

Shared parameters count once: a tensor used by six levels is one tensor. RingFormer Table 1
reports P*: every parameter except the encoder and decoder token embeddings and the vocabulary
head (output projection). Positional embeddings are embeddings too and are excluded (the
paper's models use sinusoidal ones, which have no parameters). The vision commands print
:func:`count_parameters`; the translation commands report :func:`parameter_report`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from torch import nn

# names of the submodules that P* leaves out, in fairseq's transformer and in ours
EMBEDDING_MODULES = ("embed_tokens", "embed_positions")
HEAD_MODULE = "output_projection"


@dataclass(frozen=True)
class ParamReport:
    """Parameter counts of a translation model.

    Attributes:
        total: all distinct parameters (what fairseq prints as "num. shared model params").
        embeddings: token and position embeddings (shared ones once).
        output_projection: the vocabulary head, 0 when tied to the embeddings.
        p_star: ``total - embeddings - output_projection`` (RingFormer Table 1).
    """

    total: int
    embeddings: int
    output_projection: int
    p_star: int


def _distinct(params: Iterable[nn.Parameter]) -> dict[int, nn.Parameter]:
    return {id(p): p for p in params}


def count_parameters(model: nn.Module) -> int:
    """Distinct parameters: a tensor shared by several levels counts once."""
    return sum(p.numel() for p in _distinct(model.parameters()).values())


def parameter_report(model: nn.Module) -> ParamReport:
    """Counts ``model``'s parameters the way RingFormer Table 1 does."""
    embeddings: dict[int, nn.Parameter] = {}
    head: dict[int, nn.Parameter] = {}
    for name, module in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if leaf in EMBEDDING_MODULES:
            embeddings.update(_distinct(module.parameters()))
        elif leaf == HEAD_MODULE and module is not None:
            head.update(_distinct(module.parameters()))
    head = {k: v for k, v in head.items() if k not in embeddings}  # tied head counts once
    total = count_parameters(model)
    n_emb = sum(p.numel() for p in embeddings.values())
    n_head = sum(p.numel() for p in head.values())
    return ParamReport(total, n_emb, n_head, total - n_emb - n_head)
