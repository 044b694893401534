"""Representation similarity by linear CKA between the levels of two models (RingFormer Fig. 2/4).

Centered kernel alignment with a linear kernel (Kornblith et al. 2019, "Similarity of neural
network representations revisited", eq. 4 with the linear HSIC of sec. 3): for n examples with
features X (n x p) and Y (n x q), column-centered,

    CKA(X, Y) = ||Y^T X||_F^2 / (||X^T X||_F ||Y^T Y||_F),

which equals HSIC(K, L) / sqrt(HSIC(K, K) HSIC(L, L)) for the Gram matrices K = X X^T and
L = Y Y^T. It is invariant to orthogonal transforms and isotropic scaling of either side, not to
general invertible linear maps.

Estimator: the exact full-data (biased HSIC) linear CKA, not a minibatch estimate. It is
computed in feature space, so memory depends on the widths only: :class:`CKAAccumulator`
streams batches of tokens and sums X^T X, Y^T Y, X^T Y and the column sums in float64 (after
subtracting the first batch's means, for numerical safety); centering is applied at the end.
Any number of tokens gives the same value as :func:`linear_cka` on all of them at once, so the
unbiased minibatch estimator of Nguyen et al. (2021) is not needed.

RingFormer Fig. 2 compares, for every pair of levels, the representations of 3K WMT-14 test
sentence pairs, encoder levels on source tokens and decoder levels on target tokens with
teacher forcing. Here every non-padding token is one example; a level's representation is
its output (before a final layer norm), for our models and fairseq's own ``transformer``
alike (fairseq also returns the embedding output, which is dropped).

Command line::

    python -m recurnmt.analysis.cka --data data-bin/lohelp_de_en --subset test \\
        --reference vanilla/checkpoint_best.pt ringformer/checkpoint_best.pt \\
        ut/checkpoint_best.pt -o cka.png [--max-sentences 3000]
    python -m recurnmt.analysis.cka --vision --data digits \\
        --reference runs/vit/best.pt runs/ringformer/best.pt -o cka_vision.png
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from recurnmt.analysis.nmt_inputs import SIDES, load_nmt_models, translation_batches
from recurnmt.cli import entry_point
from recurnmt.modules.hooks import LevelOutputs

PROG = "recurnmt-cka"  # also python -m recurnmt.analysis.cka

# ---------------------------------------------------------------------------------- linear CKA


def linear_cka(x: Tensor, y: Tensor) -> Tensor:
    """Linear CKA of two representations of the same n examples (Kornblith et al. 2019).

    Args:
        x: n x p.
        y: n x q.

    Returns:
        A scalar tensor in [0, 1] (float64).
    """
    return cka_matrix(x[None], y[None])[0, 0]


def cka_matrix(xs: Tensor | Sequence[Tensor], ys: Tensor | Sequence[Tensor]) -> Tensor:
    """Linear CKA between every level of ``xs`` and every level of ``ys`` on the same examples.

    Args:
        xs: La x n x p (or a sequence of La tensors n x p).
        ys: Lb x n x q.

    Returns:
        La x Lb, float64.
    """
    acc = CKAAccumulator()
    acc.update(xs, ys)
    return acc.result()


class CKAAccumulator:
    """Exact linear CKA between the levels of two models, accumulated over batches of examples.

    Keeps sum(x), sum(y), X^T X per level, Y^T Y per level and X^T Y for every pair of levels
    (float64), all after subtracting the first batch's column means (a fixed shift does not
    change the centered statistics but keeps the final subtraction of n * mean^2 well
    conditioned).
    """

    def __init__(self) -> None:
        self.n = 0
        self._shift: list[Tensor] = []
        self._sum: list[Tensor] = []
        self._gram: list[Tensor] = []  # per side: L x p x p
        self._cross: Tensor | None = None  # (La p) x (Lb q)

    def update(self, xs: Tensor | Sequence[Tensor], ys: Tensor | Sequence[Tensor]) -> None:
        """Adds a batch of n examples: ``xs`` La x n x p and ``ys`` Lb x n x q."""
        sides = [torch.stack(list(s)) if not isinstance(s, Tensor) else s for s in (xs, ys)]
        if sides[0].size(1) != sides[1].size(1):
            raise ValueError(f"{sides[0].size(1)} vs {sides[1].size(1)} examples")
        if sides[0].size(1) == 0:
            return
        first = not self._shift
        if first:
            self._shift = [s.mean(dim=1, keepdim=True).detach() for s in sides]
        # products in one precision, at least float32 (half-precision models); sums in float64
        dtype = torch.promote_types(torch.promote_types(*(s.dtype for s in sides)), torch.float32)
        centred = []
        for i, s in enumerate(sides):
            s = s.detach().to(dtype) - self._shift[i].to(dtype)  # L x n x p
            total, gram = s.sum(dim=1).double(), (s.transpose(1, 2) @ s).double()  # L x p x p
            if first:
                self._sum.append(total)
                self._gram.append(gram)
            else:
                self._sum[i] += total
                self._gram[i] += gram
            centred.append(s)
        x, y = centred  # La x n x p, Lb x n x q
        cross = (x.permute(0, 2, 1).flatten(0, 1) @ y.permute(1, 0, 2).flatten(1)).double()
        self._cross = cross if self._cross is None else self._cross + cross
        self.n += x.size(1)

    def result(self) -> Tensor:
        """The La x Lb CKA matrix (float64, on the device of the inputs)."""
        if self.n == 0 or self._cross is None:
            raise ValueError("no examples were accumulated")
        n = self.n
        means = [s / n for s in self._sum]  # L x p
        grams = [
            g - n * m[:, :, None] * m[:, None, :] for g, m in zip(self._gram, means, strict=True)
        ]
        (la, p), (lb, q) = means[0].shape, means[1].shape
        cross = self._cross - n * means[0].flatten()[:, None] * means[1].flatten()[None, :]
        hsic_xy = cross.view(la, p, lb, q).pow(2).sum(dim=(1, 3))  # La x Lb
        hsic_xx, hsic_yy = (g.pow(2).sum(dim=(1, 2)) for g in grams)  # La, Lb
        return hsic_xy / (hsic_xx[:, None] * hsic_yy[None, :]).sqrt()


# ------------------------------------------------------------------------- NMT level states


def _num_levels(model: nn.Module, side: str) -> int:
    part = getattr(model, side)
    if hasattr(part, "stack"):  # ours: RecurrentEncoder / RecurrentDecoder
        return part.stack.num_levels
    return len(part.layers)  # fairseq's TransformerEncoderBase / TransformerDecoderBase


def _levels_only(states: list[Tensor], levels: int) -> list[Tensor]:
    # fairseq's transformer puts the embedding output first; ours returns levels only, fewer
    # when ACT halted every position early (the state then stays what it was)
    if len(states) > levels:
        states = states[-levels:]
    return states + [states[-1]] * (levels - len(states))


@torch.no_grad()
def nmt_level_states(model: nn.Module, sample: dict[str, Any], pad: int) -> dict[str, list[Tensor]]:
    """Per-level hidden states of a translation model on one batch, padding removed.

    Works for every ``recurrent_transformer`` architecture and for fairseq's ``transformer``.
    The decoder runs with teacher forcing on ``prev_output_tokens``; its state at position t
    is the one that predicts ``target[:, t]``.

    Args:
        model: an encoder-decoder in evaluation mode.
        sample: a fairseq translation batch (``net_input`` and ``target``).
        pad: the padding index.

    Returns:
        ``{"encoder": [n_src x C] * N_enc, "decoder": [n_tgt x C] * N_dec}``, tokens in
        batch-major order (sentence by sentence), the same for every model on the same batch.
    """
    net = sample["net_input"]
    src, target = net["src_tokens"], sample["target"]
    enc = model.encoder(src, src_lengths=net["src_lengths"], return_all_hiddens=True)
    _, extra = model.decoder(
        net["prev_output_tokens"], encoder_out=enc, features_only=True, return_all_hiddens=True
    )
    out = {}
    for side, states, tokens in (
        ("encoder", enc["encoder_states"], src),
        ("decoder", extra["inner_states"], target),
    ):
        keep = tokens.ne(pad)  # B x T
        states = _levels_only(list(states), _num_levels(model, side))
        out[side] = [s.transpose(0, 1)[keep] for s in states]  # T x B x C -> n x C
    return out


def nmt_cka(
    reference: nn.Module,
    models: Sequence[nn.Module],
    batches: Sequence[dict[str, Any]],
    pad: int,
    device: torch.device,
    progress: bool = True,
) -> dict[str, list[Tensor]]:
    """CKA matrices of every model against the reference, per side.

    Returns:
        ``{"encoder": [N_ref x N_model] * len(models), "decoder": [...]}``.
    """
    from fairseq import utils
    from tqdm import tqdm

    accs = {side: [CKAAccumulator() for _ in models] for side in SIDES}
    for sample in tqdm(batches, desc="CKA", unit="batch", disable=not progress):
        sample = utils.move_to_cuda(sample, device) if device.type == "cuda" else sample
        ref = nmt_level_states(reference, sample, pad)
        for i, model in enumerate(models):
            states = nmt_level_states(model, sample, pad)
            for side in SIDES:
                accs[side][i].update(ref[side], states[side])
    return {side: [a.result().cpu() for a in accs[side]] for side in SIDES}


# ---------------------------------------------------------------------- vision level states


@torch.no_grad()
def vision_level_states(model: nn.Module, images: Tensor) -> list[Tensor]:
    """Per-level token states of a :class:`~recurnmt.vision.models.vit.VisionTransformer`.

    Every token of every image (class token included) is an example.

    Returns:
        N_levels tensors (B T) x D.
    """
    if not (hasattr(model, "embed") and hasattr(model, "stack")):
        raise ValueError(f"{type(model).__name__}: CKA supports the ViT-family models only")
    states = LevelOutputs()
    model.forward_features(images, hooks=[states])
    return [s.flatten(0, 1) for s in _levels_only(states.outputs, model.stack.num_levels)]


def vision_cka(
    paths: Sequence[str | Path],
    data: str,
    data_root: str | None,
    max_images: int,
    batch_size: int,
    device: torch.device,
) -> tuple[list[str], list[Tensor]]:
    """CKA of vision checkpoints (``recurnmt.vision.training.train``) against the first one.

    Returns:
        (the model names, one N_ref x N_model matrix per further checkpoint).
    """
    from torch.utils.data import DataLoader, Subset

    from recurnmt.vision.checkpoint import load_checkpoint, model_from_checkpoint
    from recurnmt.vision.data import build_dataset

    ckpts = [load_checkpoint(p) for p in paths]
    models = [model_from_checkpoint(c).to(device).eval() for c in ckpts]
    sizes = {tuple(m.img_size) for m in models}
    if len(sizes) > 1:
        raise ValueError(f"the models expect different image sizes: {sorted(sizes)}")
    dataset, _ = build_dataset(data, "eval", root=data_root, img_size=sizes.pop())
    dataset = Subset(dataset, range(min(max_images, len(dataset))))
    accs = [CKAAccumulator() for _ in models[1:]]
    for images, _ in DataLoader(dataset, batch_size=batch_size):
        images = images.to(device)
        ref = vision_level_states(models[0], images)
        for acc, model in zip(accs, models[1:], strict=True):
            acc.update(ref, vision_level_states(model, images))
    return [c["model_name"] for c in ckpts], [a.result().cpu() for a in accs]


# -------------------------------------------------------------------------------- the figure


def plot(
    rows: dict[str, list[Tensor]],
    names: Sequence[str],
    reference: str,
    out: Path,
    title: str = "",
) -> Path:
    """RingFormer Fig. 2 layout: one row per side, one heatmap per model against the reference.

    Args:
        rows: ``{row title: [N_ref x N_model matrix per model]}``.
        names: the compared models' names (one per column).
        reference: the reference model's name (x axis).
    """
    import logging

    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # fairseq may log at DEBUG
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    cols = len(names)
    fig, axes = plt.subplots(
        len(rows),
        cols,
        figsize=(3.4 * cols + 1.0, 3.2 * len(rows) + 0.4),
        squeeze=False,
        constrained_layout=True,
    )
    image = None
    for r, (side, mats) in enumerate(rows.items()):
        for c, (name, mat) in enumerate(zip(names, mats, strict=True)):
            ax = axes[r][c]
            m = mat.T.numpy()  # rows: the model's levels, columns: the reference's
            image = ax.imshow(m, origin="lower", vmin=0, vmax=1, cmap="magma")
            if max(m.shape) <= 12:
                for (i, j), v in np.ndenumerate(m):
                    colour = "black" if v > 0.6 else "white"
                    ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7, color=colour)
            ax.set_xticks(range(m.shape[1]), [str(i + 1) for i in range(m.shape[1])])
            ax.set_yticks(range(m.shape[0]), [str(i + 1) for i in range(m.shape[0])])
            ax.set_xlabel(f"{reference} layer", fontsize=8)
            ax.set_ylabel(f"{side}: {name} level", fontsize=8)
            if r == 0:
                ax.set_title(f"{name} vs {reference}", fontsize=9)
    if image is not None:
        fig.colorbar(image, ax=axes, shrink=0.8, label="linear CKA")
    fig.suptitle(title or "Linear CKA between levels (RingFormer Fig. 2)")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def _diagonal(mat: Tensor) -> list[float]:
    return [round(float(v), 4) for v in torch.diagonal(mat)]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--reference",
        nargs="+",
        required=True,
        metavar="CKPT",
        help="the reference checkpoint (e.g. the vanilla Transformer), then the "
        "checkpoints to compare with it",
    )
    p.add_argument(
        "--data",
        required=True,
        help="fairseq data-bin directory; with --vision a data set name (digits)",
    )
    p.add_argument("--subset", default="test", help="translation subset (default test)")
    p.add_argument(
        "--max-sentences",
        type=int,
        default=3000,
        help="first sentence pairs of the subset (RingFormer: 3K)",
    )
    p.add_argument("--batch-size", type=int, default=64, help="sentences (images) per batch")
    p.add_argument(
        "--vision",
        action="store_true",
        help="vision checkpoints of recurnmt.vision.training.train; --data names the data set",
    )
    p.add_argument("--data-root", help="vision data folder (not needed for digits)")
    p.add_argument("--max-images", type=int, default=1000, help="vision: images to use")
    p.add_argument("--labels", nargs="+", help="names for the reference and each model")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    p.add_argument("--json", type=Path, help="also write the matrices as JSON here")
    p.add_argument("--title", default="")
    p.add_argument("-o", "--out", type=Path, default=Path("cka.png"))
    return p


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = build_parser().parse_args(argv)
    if len(args.reference) < 2:
        raise ValueError("--reference needs the reference checkpoint and at least one more")
    if args.labels and len(args.labels) != len(args.reference):
        raise ValueError(f"--labels needs {len(args.reference)} names, got {len(args.labels)}")
    device = torch.device(
        ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    )
    if args.vision:
        names, mats = vision_cka(
            args.reference, args.data, args.data_root, args.max_images, args.batch_size, device
        )
        rows = {"image tokens": mats}
    else:
        models, names, task = load_nmt_models(args.reference, args.data, device)
        batches = translation_batches(task, args.subset, args.max_sentences, args.batch_size)
        pad = task.source_dictionary.pad()
        rows = nmt_cka(models[0], models[1:], batches, pad, device)
    names = list(args.labels or names)
    plot(rows, names[1:], names[0], args.out, args.title)
    result = {
        "reference": names[0],
        "models": names[1:],
        "cka": {side: [m.tolist() for m in mats] for side, mats in rows.items()},
        "diagonal": {side: [_diagonal(m) for m in mats] for side, mats in rows.items()},
    }
    for side, diags in result["diagonal"].items():
        for name, diag in zip(names[1:], diags, strict=True):
            print(f"{side:<8} {name} vs {names[0]}: diagonal " + " ".join(f"{v:.3f}" for v in diag))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(args.out)
    return result


cli = entry_point(main, PROG)  # the console script

if __name__ == "__main__":
    sys.exit(cli())
