"""Evaluate a checkpoint: ``python -m recurnmt.vision.training.evaluate CKPT [options]``.

Prints top-1 and top-5 accuracy and loss on the evaluation split, the parameter count,
multiply-accumulates per image (what vision papers call FLOPs; see :mod:`.flops`) and the
forward throughput in images per second. The data set defaults to the one the checkpoint was
trained on. Under ``torchrun`` the evaluation set is sharded over the processes.
"""

from __future__ import annotations

import argparse
import json
import sys

from recurnmt.cli import entry_point
from recurnmt.flags import add_options, levels_flag, spell
from recurnmt.modules import ConfigError
from recurnmt.parameters import count_parameters
from recurnmt.vision.checkpoint import load_checkpoint, model_from_checkpoint
from recurnmt.vision.data import build_dataset
from recurnmt.vision.data.loader import eval_loader
from recurnmt.vision.training.arguments import parse_size
from recurnmt.vision.training.distributed import process_group
from recurnmt.vision.training.engine import Precision, evaluate
from recurnmt.vision.training.flops import count_macs, throughput

# an image model's stack is an encoder: elastic depth as translation spells it
ELASTIC_DEPTH = levels_flag("encoder")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m recurnmt.vision.training.evaluate", description=__doc__
    )
    p.add_argument(
        "checkpoint", help="checkpoint.pt or best.pt written by recurnmt.vision.training.train"
    )
    p.add_argument("--data", help="data set (default: the training data set)")
    p.add_argument("--data-root", help="data folder (not needed for digits)")
    p.add_argument("--img-size", help="evaluation resolution (default: the model's)")
    add_options(  # translation's spelling (--levels: before)
        p, [ELASTIC_DEPTH], with_defaults=True, aliases={ELASTIC_DEPTH.name: ("--levels",)}
    )
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--device", default="auto")
    p.add_argument("--amp", default="auto", choices=["auto", "off", "bf16", "fp16"])
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    with process_group(args.device) as info:
        ckpt = load_checkpoint(args.checkpoint)
        model = model_from_checkpoint(ckpt).to(info.device).eval()
        depth = getattr(args, ELASTIC_DEPTH.dest)
        if depth is not None:
            flag = spell(ELASTIC_DEPTH)
            if not hasattr(model, "set_depth"):
                raise ValueError(f"{flag}: a {type(model).__name__} has no elastic depth")
            try:
                model.set_depth(depth)
            except ConfigError as err:
                raise err.renamed({"levels": flag}) from None
        img_size = parse_size(args.img_size) or tuple(model.img_size)
        data = args.data or ckpt.get("data", {}).get("name", "digits")
        root = args.data_root or ckpt.get("args", {}).get("data_root")
        dataset, spec = build_dataset(data, "eval", root=root, img_size=img_size)
        loader = eval_loader(
            dataset,
            args.batch_size,
            rank=info.rank,
            world_size=info.world_size,
            workers=args.workers,
            device=info.device,
        )
        result = evaluate(model, loader, info, Precision.build(args.amp, info.device))
        shape = (1, spec.in_chans, *img_size)
        report = {
            "model": ckpt["model_name"],
            "levels": depth,
            "data": data,
            "images": result.images,
            "top1": round(result.top1, 3),
            "top5": round(result.top5, 3),
            "loss": round(result.loss, 5),
            "params_M": round(count_parameters(model) / 1e6, 4),
            "GMACs": round(count_macs(model, shape) / 1e9, 4),
            "images_per_s": round(throughput(model, (args.batch_size, *shape[1:])), 1),
        }
        if info.is_main:
            if args.json:
                print(json.dumps(report))
            else:
                at = f" at {depth} levels" if depth else ""
                print(
                    f"{report['model']}{at} on {data} ({report['images']} images, "
                    f"{img_size[0]}x{img_size[1]}): top-1 {report['top1']:.2f}%  "
                    f"top-5 {report['top5']:.2f}%  loss {report['loss']:.4f}\n"
                    f"parameters {report['params_M']:.3f}M  "
                    f"FLOPs (multiply-accumulates) {report['GMACs']:.4f}G  "
                    f"throughput {report['images_per_s']:.1f} images/s "
                    f"(batch {args.batch_size}, {info.device.type})"
                )
        return report


cli = entry_point(main, "python -m recurnmt.vision.training.evaluate")

if __name__ == "__main__":
    sys.exit(cli())
