"""Mean attention distance per head and level of vision models (RingFormer Fig. 3).

ViT (Dosovitskiy et al. 2021, appendix D.7, Fig. 7 right) measures how far in image space a head
integrates information: for query patch i and key patch j at pixel distance d_ij, the head's
attention distance is ``sum_j a_ij d_ij``, averaged over the query patches of an image and
then over images. RingFormer Fig. 3 plots it for every head of every level (500 validation
images) to compare ViT, RingFormer, One Wide FFN and UiT.

Conventions here:

* d_ij is the Euclidean distance between patch centres in pixels: the patch size times the
  distance on the token grid (P_h dy, P_w dx for non-square patches).
* The class token is excluded as a query and as a key, as in ViT's analysis. The remaining
  weights of each query are renormalised to sum to 1 (``renormalize=True``), so attention
  parked on the class token does not count as distance 0; pass ``renormalize=False`` for
  the raw sum.
* Probabilities come from :class:`~recurnmt.analysis.attention_recorder.AttentionRecorder`
  (the model's own projections and masks, recomputed outside SDPA).

Supported: every :class:`~recurnmt.vision.models.vit.VisionTransformer` (ViT/DeiT, naive
recursion, RingFormer-ViT, UiT, OWF-ViT). SReT is refused: its stages run on three token grids
of different strides between convolutional poolings, and its sliced group attention lets a
token attend only within its (permuted) group, so a level's distances neither share a pixel
scale nor measure a head's free choice.

Command line::

    python -m recurnmt.analysis.attention_distance --checkpoint runs/vision/digits/best.pt \\
        [--checkpoint OTHER.pt ...] [--model vit_mini_patch4 ...] [--data digits] \\
        [--num-images 500] -o mad.png
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from pathlib import Path

import torch
from torch import Tensor, nn

from recurnmt.analysis.attention_recorder import AttentionRecorder
from recurnmt.cli import entry_point

PROG = "recurnmt-attention-distance"  # also python -m recurnmt.analysis.attention_distance


def patch_distances(
    grid: tuple[int, int], patch_size: tuple[int, int], device: torch.device | None = None
) -> Tensor:
    """Pixel distances between the centres of all patches of a token grid.

    Args:
        grid: token rows and columns (h, w); tokens are in row-major order (ViT's flatten).
        patch_size: patch height and width in pixels.

    Returns:
        N x N, N = h * w.
    """
    rows, cols = torch.meshgrid(
        torch.arange(grid[0], device=device), torch.arange(grid[1], device=device), indexing="ij"
    )
    pos = torch.stack([rows.flatten() * patch_size[0], cols.flatten() * patch_size[1]], dim=-1)
    return torch.cdist(pos.double(), pos.double())  # N x N


def mean_attention_distance(
    probs: Tensor, distances: Tensor, num_prefix_tokens: int = 1, renormalize: bool = True
) -> Tensor:
    """Attention distance of every head on every image, averaged over query patches.

    Args:
        probs: attention probabilities B x H x T x T, T = num_prefix_tokens + N.
        distances: N x N pixel distances (:func:`patch_distances`).
        num_prefix_tokens: leading non-patch tokens (the class token), excluded.
        renormalize: rescale each query's weights on the patches to sum to 1.

    Returns:
        B x H.
    """
    p = num_prefix_tokens
    a = probs[:, :, p:, p:].double()  # B x H x N x N
    if renormalize:
        a = a / a.sum(dim=-1, keepdim=True).clamp_min(1e-12)
    return (a * distances).sum(dim=-1).mean(dim=-1)


def _check_supported(model: nn.Module) -> None:
    from recurnmt.vision.models.vit import VisionTransformer

    name = type(model).__name__
    if name == "SReT":
        raise ValueError(
            "mean attention distance is not defined for SReT here: its stages attend on token "
            "grids of three different strides (convolutional pooling in between) and its sliced "
            "group attention restricts each token to its group; use a ViT-family model"
        )
    if not isinstance(model, VisionTransformer):
        raise ValueError(f"{name}: mean attention distance supports ViT-family models only")
    if any(parts.slicing is not None for parts in model.stack.levels):
        raise ValueError("this model uses sliced group attention; MAD is not supported for it")


@torch.no_grad()
def model_attention_distance(
    model: nn.Module,
    images: Iterable[Tensor],
    renormalize: bool = True,
    progress: bool = True,
    total: int | None = None,
) -> Tensor:
    """Mean attention distance of every head at every level, averaged over all images.

    Args:
        model: a ViT-family model (evaluation mode is set here).
        images: batches B x C x H x W.
        total: number of batches, for the progress bar.

    Returns:
        N_levels x H, in pixels.

    Raises:
        ValueError: an unsupported model (SReT, sliced attention, not a ViT).
    """
    from tqdm import tqdm

    _check_supported(model)
    model.eval()
    levels = model.stack.num_levels
    sums: Tensor | None = None
    count = 0
    cache: dict[tuple[int, int], Tensor] = {}
    grid: tuple[int, int] = (0, 0)

    def reduce(call: int, probs: Tensor) -> None:
        nonlocal sums
        dist = cache.setdefault(
            grid, patch_distances(grid, model.patch_embed.patch_size, probs.device)
        )
        mad = mean_attention_distance(probs, dist, model.num_prefix_tokens, renormalize).sum(0)
        if sums is None:
            sums = torch.zeros(levels, probs.size(1), dtype=torch.float64, device=probs.device)
        sums[call] += mad

    with AttentionRecorder(model.stack, on_probs=reduce) as rec:
        for batch in tqdm(
            images, desc="attention distance", unit="batch", total=total, disable=not progress
        ):
            device = next(model.parameters()).device
            batch = batch.to(device)
            grid = model.patch_embed.grid_size(tuple(batch.shape[-2:]))
            rec.reset()
            model(batch)
            if rec.calls != levels:  # ACT would stop early; our vision models have none
                raise ValueError(f"recorded {rec.calls} self-attention calls for {levels} levels")
            count += batch.size(0)
    if sums is None or count == 0:
        raise ValueError("no images")
    return (sums / count).float().cpu()


# -------------------------------------------------------------------------------- the figure


def plot(
    results: dict[str, Tensor],
    out: Path,
    title: str = "",
    uniform: dict[str, float] | None = None,
) -> Path:
    """RingFormer Fig. 3 layout: one panel per model, every head a point at its level.

    Args:
        results: N_levels x H distances per model name.
        uniform: per model, the distance of uniform attention over its grid, drawn dashed.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(results)
    fig, axes = plt.subplots(1, n, figsize=(3.4 * n, 3.2), sharey=True, squeeze=False)
    for ax, (name, mad) in zip(axes[0], results.items(), strict=True):
        levels, heads = mad.shape
        for h in range(heads):
            ax.scatter(
                range(1, levels + 1), mad[:, h].numpy(), s=14, alpha=0.8, label=f"head {h + 1}"
            )
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("level (network depth)")
        ax.set_xticks(range(1, levels + 1))
        if uniform and name in uniform:
            ax.axhline(uniform[name], ls="--", lw=0.8, color="grey", label="uniform attention")
        ax.grid(alpha=0.3)
    top = max([float(m.max()) for m in results.values()] + list((uniform or {}).values()))
    axes[0][0].set_ylim(0, 1.08 * top)  # shared by all panels
    axes[0][0].set_ylabel("mean attention distance (pixels)")
    if max(m.shape[1] for m in results.values()) <= 16:
        axes[0][-1].legend(fontsize=6, loc="lower right")
    fig.suptitle(title or "Mean attention distance (RingFormer Fig. 3)")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


# ---------------------------------------------------------------------------------- command


def _load(
    spec: str, is_checkpoint: bool, num_classes: int, img_size, in_chans: int
) -> tuple[str, nn.Module]:
    from recurnmt.vision.registry import create_model

    if is_checkpoint:
        from recurnmt.vision.checkpoint import load_checkpoint, model_from_checkpoint

        ckpt = load_checkpoint(spec)
        return ckpt["model_name"], model_from_checkpoint(ckpt)
    kwargs = {"num_classes": num_classes, "in_chans": in_chans}
    if img_size is not None:
        kwargs["img_size"] = img_size
    return f"{spec} (untrained)", create_model(spec, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--checkpoint",
        nargs="+",
        default=[],
        metavar="CKPT",
        help="checkpoints of recurnmt.vision.training.train, one panel each",
    )
    p.add_argument(
        "--model",
        nargs="+",
        default=[],
        metavar="NAME",
        help="registered models with fresh weights, one panel each (a baseline)",
    )
    p.add_argument("--data", default="digits", help="data set: digits, cifar10, cifar100, imagenet")
    p.add_argument("--data-root", help="data folder (not needed for digits)")
    p.add_argument("--img-size", type=int, help="image size for --model (the data set's)")
    p.add_argument(
        "--num-images", type=int, default=500, help="random evaluation images (RingFormer: 500)"
    )
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--seed", type=int, default=0, help="image sampling seed")
    p.add_argument(
        "--no-renormalize",
        action="store_true",
        help="do not renormalise the patch weights after dropping the class token",
    )
    p.add_argument("--labels", nargs="+", help="panel titles (checkpoints first, then models)")
    p.add_argument("--device", default="auto")
    p.add_argument("--json", type=Path, help="also write the per-head distances as JSON here")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--title", default="")
    p.add_argument("-o", "--out", type=Path, default=Path("mad.png"))
    return p


def main(argv: list[str] | None = None) -> dict[str, list[list[float]]]:
    args = build_parser().parse_args(argv)
    specs = [(c, True) for c in args.checkpoint] + [(m, False) for m in args.model]
    if not specs:
        raise ValueError("give --checkpoint and/or --model")
    if args.labels and len(args.labels) != len(specs):
        raise ValueError(f"--labels needs {len(specs)} names, got {len(args.labels)}")
    from torch.utils.data import DataLoader, Subset

    from recurnmt.vision.data import build_dataset, data_spec

    device = torch.device(
        ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    )
    spec = data_spec(args.data, args.data_root)
    size = (args.img_size, args.img_size) if args.img_size else spec.img_size
    results: dict[str, Tensor] = {}
    uniform: dict[str, float] = {}
    for k, (s, is_ckpt) in enumerate(specs):
        name, model = _load(s, is_ckpt, spec.num_classes, size, spec.in_chans)
        label = args.labels[k] if args.labels else name
        if label in results:
            label = f"{label} ({k + 1})"
        model = model.to(device)
        _check_supported(model)
        dataset, _ = build_dataset(
            args.data, "eval", root=args.data_root, img_size=tuple(model.img_size)
        )
        g = torch.Generator().manual_seed(args.seed)
        pick = torch.randperm(len(dataset), generator=g)[: args.num_images].tolist()
        loader = DataLoader(Subset(dataset, pick), batch_size=args.batch_size)
        images = (x for x, _ in loader)
        mad = model_attention_distance(
            model, images, not args.no_renormalize, not args.no_progress, total=len(loader)
        )
        results[label] = mad
        grid = model.patch_embed.grid_size(tuple(model.img_size))
        uniform[label] = patch_distances(grid, model.patch_embed.patch_size).mean().item()
        print(
            f"{label}: {len(pick)} images, {mad.shape[0]} levels x {mad.shape[1]} heads; "
            f"distance {mad.min():.2f}-{mad.max():.2f} px "
            f"(uniform attention over the {grid[0]}x{grid[1]} grid: {uniform[label]:.2f} px)"
        )
        for level, row in enumerate(mad.tolist(), start=1):
            print(f"  level {level:>2}: " + " ".join(f"{v:6.2f}" for v in row))
    plot(results, args.out, args.title, uniform)
    print(args.out)
    report = {name: mad.tolist() for name, mad in results.items()}
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return report


cli = entry_point(main, PROG)  # the console script

if __name__ == "__main__":
    sys.exit(cli())
