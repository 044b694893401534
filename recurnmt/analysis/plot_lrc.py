"""Plot the evolution of SReT's learnable residual coefficients (SReT Fig. 7 / Fig. 16).

The recurrent criterion logs the LRC scalars (eq. 9-10) as ``lrc_{side}_b{block}_{sublayer}_
{branch}`` and ``lrc_{side}_l{level}_nll_{branch}`` (see :mod:`recurnmt.nmt.criterion`). This
command reads them back from fairseq's training log (``simple`` or ``json`` log format) or
from a ``--tensorboard-logdir``, and draws one panel per sub-layer with the main-branch and
identity-branch coefficients against the update number.

    recurnmt-plot-lrc train.log -o lrc.png
    recurnmt-plot-lrc checkpoints/tensorboard/train_inner -o lrc.png
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

from recurnmt.cli import entry_point
from recurnmt.experiments.fairseq_log import log_records

Series = dict[str, list[tuple[int, float]]]


def read_log(path: Path) -> Series:
    """LRC series from a fairseq training log (train_inner lines, simple or json format)."""
    series: Series = defaultdict(list)
    for record in log_records(path, "train_inner"):
        if "num_updates" not in record:
            continue
        step = int(float(record["num_updates"]))
        for key, value in record.items():
            if key.startswith("lrc_"):
                series[key].append((step, float(value)))
    return dict(series)


def read_tensorboard(logdir: Path) -> Series:
    """LRC series from tensorboard event files under ``logdir`` (``train_inner`` preferred)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    series: Series = defaultdict(list)
    dirs = {p.parent for p in logdir.rglob("events.out.tfevents.*")}
    # fairseq writes per-interval values to train_inner/ and epoch averages to train/
    inner = {d for d in dirs if d.name == "train_inner"}
    for d in sorted(inner or dirs):
        acc = EventAccumulator(str(d), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            name = tag.rsplit("/", 1)[-1]
            if name.startswith("lrc_"):
                series[name].extend((e.step, e.value) for e in acc.Scalars(tag))
    return {k: sorted(v) for k, v in series.items()}


def read_series(path: Path) -> Series:
    """LRC series from a log file or a tensorboard directory.

    Raises:
        ValueError: nothing LRC-like was found (naming the path).
    """
    series = read_tensorboard(path) if path.is_dir() else read_log(path)
    if not series:
        raise ValueError(
            f"{path}: no lrc_* values found; train an LRC model (e.g. --arch sret_*) with "
            "--criterion recurrent_label_smoothed_cross_entropy"
        )
    return series


def plot(series: Series, out: Path, title: str = "") -> Path:
    """One panel per sub-layer (name without the branch), main and skip branches as lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels: dict[str, dict[str, list[tuple[int, float]]]] = defaultdict(dict)
    for key, points in series.items():
        stem, branch = key[len("lrc_") :].rsplit("_", 1)
        panels[stem][branch] = points
    names = sorted(panels)
    cols = min(3, len(names))
    rows = -(-len(names) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.0 * rows), squeeze=False)
    for ax, name in zip(axes.flat, names, strict=False):
        for branch, style in (("main", "-"), ("skip", "--")):
            if branch in panels[name]:
                steps, values = zip(*panels[name][branch], strict=True)
                label = "main branch" if branch == "main" else "identity branch"
                ax.plot(steps, values, style, label=label)
        ax.set_title(name.replace("_", " "), fontsize=9)
        ax.set_xlabel("update")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(names) :]:
        ax.axis("off")
    fig.suptitle(title or "Learnable residual coefficients (SReT eq. 9-10)")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="recurnmt-plot-lrc", description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path, help="fairseq training log or tensorboard logdir")
    parser.add_argument("-o", "--out", type=Path, default=Path("lrc.png"))
    parser.add_argument("--title", default="")
    args = parser.parse_args(argv)
    print(plot(read_series(args.source), args.out, args.title))


cli = entry_point(main, "recurnmt-plot-lrc")  # the console script

if __name__ == "__main__":
    sys.exit(cli())
