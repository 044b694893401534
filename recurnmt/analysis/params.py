"""Parameter accounting, P* of the RingFormer paper.

RingFormer Table 1 reports P*: every parameter except the encoder and decoder token
embeddings and the vocabulary head (output projection). Positional embeddings are embeddings
too and are excluded (the paper's models use sinusoidal ones, which have no parameters).
Shared parameters count once: a tensor used by six levels is one tensor.

Command line::

    recurnmt-params ringformer_wmt_en_de ringformer_wmt_en_de_big
    recurnmt-params ringformer_tiny -- --level-signal-rank 8
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass

from torch import nn

# names of the submodules that P* leaves out, in fairseq's transformer and in ours
EXCLUDED_MODULES = ("embed_tokens", "embed_positions", "output_projection")


@dataclass(frozen=True)
class ParamReport:
    """Parameter counts of a model.

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


def _distinct(params) -> dict[int, nn.Parameter]:
    return {id(p): p for p in params}


def count_parameters(model: nn.Module) -> ParamReport:
    """Counts ``model``'s parameters the way RingFormer Table 1 does."""
    everything = _distinct(model.parameters())
    embeddings: dict[int, nn.Parameter] = {}
    head: dict[int, nn.Parameter] = {}
    for name, module in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if leaf in ("embed_tokens", "embed_positions"):
            embeddings.update(_distinct(module.parameters()))
        elif leaf == "output_projection" and module is not None:
            head.update(_distinct(module.parameters()))
    head = {k: v for k, v in head.items() if k not in embeddings}  # tied head counts once
    total = sum(p.numel() for p in everything.values())
    n_emb = sum(p.numel() for p in embeddings.values())
    n_head = sum(p.numel() for p in head.values())
    return ParamReport(total, n_emb, n_head, total - n_emb - n_head)


def p_star(model: nn.Module) -> int:
    """RingFormer's P*: parameters without embeddings and vocabulary head."""
    return count_parameters(model).p_star


def main(argv: list[str] | None = None) -> None:
    """``recurnmt-params ARCH [ARCH ...] [-- FLAGS]``: prints P* of architectures."""
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1 :]
    parser = argparse.ArgumentParser(
        prog="recurnmt-params",
        description="Parameter counts (RingFormer P*) of fairseq architectures; "
        "flags after -- go to the model as on the fairseq-train command line.",
    )
    parser.add_argument("archs", nargs="+", help="registered architectures")
    parser.add_argument("--vocab", type=int, default=100, help="toy vocabulary size")
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    opts = parser.parse_args(argv)

    from recurnmt.nmt.build import build_model, toy_dictionary

    if not opts.json:
        print(
            f"{'architecture':<36} {'H/FF':>11} {'N':>3} {'P*':>12} {'embeddings':>12} {'total':>12}"
        )
    for arch in opts.archs:
        model, args, _ = build_model(arch, extra, toy_dictionary(opts.vocab))
        report = count_parameters(model)
        if opts.json:
            print(json.dumps({"arch": arch, **asdict(report)}))
            continue
        hff = f"{args.encoder_embed_dim}/{args.encoder_ffn_embed_dim}"
        print(
            f"{arch:<36} {hff:>11} {args.encoder_layers:>3} {report.p_star / 1e6:>11.2f}M "
            f"{report.embeddings / 1e6:>11.2f}M {report.total / 1e6:>11.2f}M"
        )


if __name__ == "__main__":
    main()
