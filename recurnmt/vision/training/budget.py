"""Budgeted early exit for DVT cascades: ``python -m recurnmt.vision.training.budget CKPT [options]``.

DVT (Wang et al. 2021, sec. 3.3) stops at the first exit whose softmax confidence reaches
that exit's threshold eta_k. The thresholds are solved on held-out data for a compute budget
B (eq. 10): maximise accuracy subject to average FLOPs per image <= B.

The paper solves eq. 10 with a genetic algorithm. A cascade has few exits (3 in the paper),
so here the search is exhaustive over a grid: each eta_k takes the quantiles of the
validation confidences at exit k (plus "nobody exits"), every combination is scored at once
on the validation exits' logits, and the most accurate combination within the budget wins
(ties: the cheaper). With more than ``max_candidates`` combinations a seeded random sample
of them is scored. Scoring from per-exit logits is exact because a stage's output for a sample
does not depend on which other samples run with it (:meth:`DVTCascade.early_exit` is tested
against it); the command also runs the real early-exit inference on the test images.

The cost of an exit is the multiply-accumulates ("FLOPs" in vision papers) of running the
cascade up to it, reuse modules included, counted by :mod:`recurnmt.vision.training.flops`.

Output: a table of budget, thresholds, test top-1, average MACs per image and the share of
images leaving at each exit, the per-exit accuracies of the full cascade, and a PNG of
accuracy against MACs (``--plot``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Subset

from recurnmt.cli import entry_point
from recurnmt.vision.models.dvt import DVTCascade
from recurnmt.vision.training.exits import ExitLogits, collect_exit_logits
from recurnmt.vision.training.flops import count_macs


class _Prefix(nn.Module):
    def __init__(self, cascade: DVTCascade, num_exits: int) -> None:
        super().__init__()
        self.cascade, self.num_exits = cascade, num_exits

    def forward(self, x: Tensor) -> Tensor:
        return self.cascade.forward_exits(x, self.num_exits)[-1]


def exit_costs(model: DVTCascade, input_shape: Sequence[int]) -> list[int]:
    """Multiply-accumulates per image of leaving at exit k = 1..K (cumulative)."""
    shape = (1, *tuple(input_shape)[-3:])
    return [count_macs(_Prefix(model, k), shape) for k in range(1, model.num_exits + 1)]


def simulate(
    confidence: Tensor, correct: Tensor, costs: Sequence[float], thresholds: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """Scores M threshold sets at once.

    Args:
        confidence: K x N.
        correct: K x N.
        costs: K cumulative costs.
        thresholds: M x (K - 1).

    Returns:
        Accuracy (%) M, mean cost M and the share of images leaving at each exit M x K.
    """
    k, n = confidence.shape
    leave = confidence[None, :-1] >= thresholds[:, :, None]  # M x K-1 x N
    last = torch.ones_like(leave[:, :1])  # M x 1 x N
    exit_at = torch.cat([leave, last], dim=1).int().argmax(1)  # M x N, the first exit taken
    right = correct.float().T.gather(1, exit_at.T).T  # M x N
    cost = torch.as_tensor(costs, dtype=torch.float64)[exit_at]  # M x N
    share = torch.nn.functional.one_hot(exit_at, k).double().mean(1)  # M x K
    return 100 * right.mean(1), cost.mean(1), share


def candidate_thresholds(
    confidence: Tensor, steps: int = 40, max_candidates: int = 20000, seed: int = 0
) -> Tensor:
    """Threshold sets M x (K - 1) from the quantiles of each exit's confidences."""
    q = torch.linspace(0, 1, steps + 1)
    grids = [
        torch.cat([torch.quantile(c.double(), q.double()).float(), torch.tensor([float("inf")])])
        for c in confidence[:-1]
    ]
    grids = [g.unique() for g in grids]
    total = 1
    for g in grids:
        total *= g.numel()
    if total <= max_candidates:
        return torch.cartesian_prod(*grids).reshape(total, len(grids))
    gen = torch.Generator().manual_seed(seed)
    picks = [g[torch.randint(g.numel(), (max_candidates,), generator=gen)] for g in grids]
    return torch.stack(picks, dim=1)


def solve_thresholds(
    val: ExitLogits,
    costs: Sequence[float],
    budget: float,
    candidates: Tensor | None = None,
    chunk: int = 4096,
) -> tuple[Tensor, float, float]:
    """DVT eq. 10 on ``val``: the thresholds (K - 1) of best accuracy with mean cost <=
    ``budget``; with a budget below exit 1's cost, everyone leaves at exit 1.

    Returns:
        The thresholds, their validation accuracy (%) and their mean validation cost.
    """
    conf, correct = val.confidence, val.correct
    if candidates is None:
        candidates = candidate_thresholds(conf)
    best: tuple[float, float, Tensor] | None = None
    for start in range(0, candidates.size(0), chunk):
        thr = candidates[start : start + chunk]
        acc, cost, _ = simulate(conf, correct, costs, thr)
        ok = cost <= budget * (1 + 1e-9)
        if not ok.any():
            continue
        # the best accuracy within the budget, then the lowest cost
        acc = torch.where(ok, acc.double(), -float("inf"))
        top = acc.max()
        i = int(torch.where(acc == top, cost, float("inf")).argmin())
        if best is None or (float(top), -float(cost[i])) > (best[0], -best[1]):
            best = (float(top), float(cost[i]), thr[i])
    if best is None:
        thr = torch.zeros(conf.size(0) - 1)
        acc, cost, _ = simulate(conf, correct, costs, thr[None])
        return thr, float(acc[0]), float(cost[0])
    return best[2], best[0], best[1]


@dataclass
class BudgetRow:
    """One budget: its thresholds and what they give on the test images."""

    budget: float
    thresholds: list[float]
    top1: float
    macs: float
    share: list[float]
    val_top1: float


def budget_table(
    val: ExitLogits, test: ExitLogits, costs: Sequence[float], budgets: Sequence[float]
) -> list[BudgetRow]:
    """Thresholds solved on ``val`` for each budget, scored on ``test``."""
    candidates = candidate_thresholds(val.confidence)
    rows = []
    for budget in budgets:
        thr, val_acc, _ = solve_thresholds(val, costs, budget, candidates)
        acc, cost, share = simulate(test.confidence, test.correct, costs, thr[None])
        rows.append(
            BudgetRow(
                float(budget),
                thr.tolist(),
                float(acc[0]),
                float(cost[0]),
                share[0].tolist(),
                val_acc,
            )
        )
    return rows


def default_budgets(costs: Sequence[float], count: int = 8) -> list[float]:
    """``count`` budgets from exit 1's cost to the last exit's, evenly spaced in log scale
    (the interesting part of the curve is near the cheap end)."""
    lo, hi = float(costs[0]), float(costs[-1])
    return [lo * (hi / lo) ** (i / (count - 1)) for i in range(count)]


def _unit(costs: Sequence[float]) -> tuple[float, str]:
    return (1e9, "GMACs") if max(costs) >= 1e9 else (1e6, "MMACs")


def format_table(
    rows: Sequence[BudgetRow], exit_top1: Sequence[float], costs: Sequence[float]
) -> str:
    """The budget table and the per-exit line, as plain text."""
    scale, unit = _unit(costs)
    k = len(costs)
    head = f"{'budget':>9} {'thresholds':>{7 * (k - 1)}} {'top-1':>7} {unit + '/img':>11} "
    head += " ".join(f"{'exit' + str(i + 1):>6}" for i in range(k))
    lines = [
        "per-exit (every image runs the whole cascade): "
        + ", ".join(
            f"exit {i + 1} {a:.2f}% at {c / scale:.4g} {unit}"
            for i, (a, c) in enumerate(zip(exit_top1, costs, strict=True))
        ),
        head,
    ]
    for r in rows:
        thr = " ".join(f"{t:6.3f}" if t != float("inf") else "   inf" for t in r.thresholds)
        share = " ".join(f"{100 * s:5.1f}%" for s in r.share)
        lines.append(
            f"{r.budget / scale:9.4g} {thr:>{7 * (k - 1)}} {r.top1:6.2f}% "
            f"{r.macs / scale:11.4g} {share}"
        )
    return "\n".join(lines)


def plot_budget_curve(
    rows: Sequence[BudgetRow],
    exit_top1: Sequence[float],
    costs: Sequence[float],
    path: str | Path,
    title: str = "DVT: accuracy vs compute",
) -> Path:
    """Top-1 against mean MACs per image: the adaptive cascade and each exit on its own."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scale, unit = _unit(costs)
    fig, ax = plt.subplots(figsize=(5, 3.6), dpi=120)
    pts = sorted((r.macs / scale, r.top1) for r in rows)
    ax.plot(*zip(*pts, strict=True), "o-", label="early exit (thresholds per budget)")
    ax.plot(
        [c / scale for c in costs], list(exit_top1), "s--", label="exit k, every image", alpha=0.7
    )
    ax.set_xlabel(f"{unit} per image")
    ax.set_ylabel("top-1 (%)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


@torch.no_grad()
def run_early_exit(
    model: DVTCascade, loader: Iterable, thresholds: Sequence[float], device: torch.device
) -> tuple[float, Tensor]:
    """The real adaptive inference: top-1 (%) and each image's exit index."""
    model.eval()
    correct, exits = 0, []
    for images, target in loader:
        logits, exit_at = model.early_exit(images.to(device), thresholds)
        correct += int(logits.argmax(-1).cpu().eq(target).sum())
        exits.append(exit_at.cpu())
    exits = torch.cat(exits)
    return 100 * correct / max(exits.numel(), 1), exits


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m recurnmt.vision.training.budget", description=__doc__
    )
    p.add_argument("checkpoint", help="a DVT checkpoint of recurnmt.vision.training.train")
    p.add_argument("--data", help="data set (default: the training data set)")
    p.add_argument("--data-root", help="data folder (not needed for digits)")
    p.add_argument(
        "--select-on",
        default="holdout",
        choices=["holdout", "train"],
        help="holdout: solve the thresholds on the even-numbered evaluation images and report "
        "on the odd-numbered ones; train: solve on the (unaugmented) training set, as the "
        "paper does, and report on the whole evaluation set",
    )
    p.add_argument("--budgets", type=float, nargs="+", help="budgets in MACs per image")
    p.add_argument("--num-budgets", type=int, default=8, help="budgets when none are given")
    p.add_argument("--plot", help="write the accuracy-vs-MACs curve to this PNG")
    p.add_argument("--json", help="write the table as JSON to this file")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default 1)")
    return p


def main(argv: list[str] | None = None) -> dict:
    from recurnmt.vision.checkpoint import load_checkpoint, model_from_checkpoint
    from recurnmt.vision.data import build_dataset

    args = build_parser().parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(args.threads or 1)
    ckpt = load_checkpoint(args.checkpoint)
    model = model_from_checkpoint(ckpt).to(device).eval()
    if not isinstance(model, DVTCascade):
        raise ValueError(f"{args.checkpoint}: {ckpt['model_name']} is not a DVT cascade")
    data = args.data or ckpt.get("data", {}).get("name", "digits")
    root = args.data_root or ckpt.get("args", {}).get("data_root")
    img_size = tuple(ckpt["model_kwargs"].get("img_size") or model.img_size)
    eval_set, spec = build_dataset(data, "eval", root=root, img_size=img_size)
    if args.select_on == "holdout":
        val_set = Subset(eval_set, range(0, len(eval_set), 2))
        test_set = Subset(eval_set, range(1, len(eval_set), 2))
    else:
        val_set, _ = build_dataset(data, "train", root=root, img_size=img_size, augment=False)
        test_set = eval_set

    def loader(ds) -> DataLoader:
        return DataLoader(ds, batch_size=args.batch_size)

    val = collect_exit_logits(model, loader(val_set), device)
    test = collect_exit_logits(model, loader(test_set), device)
    costs = exit_costs(model, (spec.in_chans, *img_size))
    budgets = args.budgets or default_budgets(costs, args.num_budgets)
    rows = budget_table(val, test, costs, budgets)
    for r in rows:  # the real adaptive inference agrees with the scored logits
        acc, exits = run_early_exit(model, loader(test_set), r.thresholds, device)
        share = torch.bincount(exits, minlength=model.num_exits).double() / exits.numel()
        r.top1, r.share = acc, share.tolist()
        r.macs = float(torch.as_tensor(costs, dtype=torch.float64)[exits].mean())
    exit_top1 = test.accuracy()
    print(
        f"{ckpt['model_name']} on {data}: thresholds solved on {len(val_set)} "
        f"{'held-out' if args.select_on == 'holdout' else 'training'} images, "
        f"reported on {len(test_set)} test images"
    )
    print(format_table(rows, exit_top1, costs))
    report = {
        "model": ckpt["model_name"],
        "exit_top1": exit_top1,
        "exit_macs": costs,
        "rows": [r.__dict__ for r in rows],
    }
    if args.plot:
        print(f"plot: {plot_budget_curve(rows, exit_top1, costs, args.plot)}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1, default=str))
    return report


cli = entry_point(main, "python -m recurnmt.vision.training.budget")

if __name__ == "__main__":
    sys.exit(cli())
