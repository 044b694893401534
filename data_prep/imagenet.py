"""``python -m data_prep.imagenet``: ImageNet-1K (ILSVRC2012) in the folder layout, and subsets.

ImageNet cannot be downloaded anonymously: get the three official files from image-net.org
(after accepting its terms) and point this command at them::

    ILSVRC2012_img_train.tar        1,000 class tars (n01440764.tar, ...), 1,281,167 JPEGs
    ILSVRC2012_img_val.tar          50,000 JPEGs (ILSVRC2012_val_00000001.JPEG, ...)
    ILSVRC2012_devkit_t12.tar.gz    data/meta.mat (ILSVRC2012_ID -> WordNet id) and
                                    data/ILSVRC2012_validation_ground_truth.txt

``folder`` streams them (no unpacked copy of the tars is needed) into::

    OUT/train/n01440764/n01440764_10026.JPEG
    OUT/val/n01440764/ILSVRC2012_val_00000293.JPEG
    OUT/synsets.txt                 "n01440764 tench, Tinca tinca", one line per class
    OUT/prepare.json                counts, written last

which is what ``recurnmt.vision`` reads with ``--data imagenet --data-root OUT``.

``hub`` builds the same layout from the Hugging Face copy ``ILSVRC/imagenet-1k`` (gated:
accept its terms on the hub and log in with ``hf auth login`` or set ``HF_TOKEN``), through
the ``datasets`` cache, so an interrupted download resumes. The hub copy has label indices
and class words but no WordNet ids, so its class folders are the zero-padded indices
(``0000`` ... ``0999``, in the same order as the sorted WordNet ids) and ``synsets.txt``
maps them to the words. ``--from-local DIR`` reads a copy in the hub's layout
(``DIR/data/{train,validation}-*.parquet``).

``subset`` draws ImageNet-small from such a folder (RingFormer sec. 4.2 and appendix A.3: 100
random classes, 1,000 training images each from the training set, 50 test images each from the
validation set) as hard links (``--copy`` to copy), and records the drawn files in
``subset.json``; ``--list FILE`` rebuilds a recorded (or the authors' published) listing.

Both write their output atomically (:mod:`data_prep.atomic`): an error, Ctrl-C or kill leaves
no half-written folder. A truncated tar, a validation set without a label for every image or a
class the devkit does not know stops the run with a message that names the file.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import shutil
import sys
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from data_prep.atomic import atomic_output_dir
from data_prep.errors import IntegrityError, PrepError
from data_prep.hub import HubSource, load_splits
from recurnmt.cli import entry_point

PROG = "python -m data_prep.imagenet"
TRAIN_TAR = "ILSVRC2012_img_train.tar"
VAL_TAR = "ILSVRC2012_img_val.tar"
DEVKIT = "ILSVRC2012_devkit_t12.tar.gz"
FULL_COUNTS = {"classes": 1000, "train": 1_281_167, "val": 50_000}
IMAGE_SUFFIXES = (".jpeg", ".jpg", ".png")
HUB = HubSource(
    dataset="ILSVRC/imagenet-1k",
    revision="main",
    data_files={"train": "data/train-*.parquet", "validation": "data/validation-*.parquet"},
    expected_rows={"train": FULL_COUNTS["train"], "validation": FULL_COUNTS["val"]},
    column="image",
)
# RingFormer appendix A.3: 100 classes, 1,000 train and 50 test images per class
SMALL = dict(classes=100, train_per_class=1000, val_per_class=50)


@dataclass(frozen=True)
class Synset:
    """One ILSVRC2012 class: its 1-based devkit id, WordNet id and words."""

    ilsvrc_id: int
    wnid: str
    words: str


def read_devkit(path: Path) -> tuple[dict[int, Synset], list[int]]:
    """The 1,000 leaf synsets of ``meta.mat`` by ILSVRC2012_ID, and the validation labels.

    Returns:
        (synsets by id, the ground-truth id of validation image 1, 2, ... in order).

    Raises:
        IntegrityError: the archive is unreadable or lacks ``meta.mat`` / the ground truth.
    """
    from scipy.io import loadmat  # scipy comes with the vision extra (scikit-learn)

    members: dict[str, bytes] = {}
    try:
        with tarfile.open(path) as tar:
            for member in tar:
                name = member.name.rsplit("/", 1)[-1]
                if name in ("meta.mat", "ILSVRC2012_validation_ground_truth.txt"):
                    members[name] = tar.extractfile(member).read()
    except (tarfile.TarError, OSError, EOFError) as err:
        raise IntegrityError(f"{path}: unreadable devkit archive ({err})") from err
    for name in ("meta.mat", "ILSVRC2012_validation_ground_truth.txt"):
        if name not in members:
            raise IntegrityError(f"{path}: the devkit has no data/{name}")
    try:
        meta = loadmat(io.BytesIO(members["meta.mat"]), squeeze_me=True)["synsets"]
        synsets = {
            int(row["ILSVRC2012_ID"]): Synset(
                int(row["ILSVRC2012_ID"]), str(row["WNID"]), str(row["words"])
            )
            for row in meta
            if int(row["num_children"]) == 0  # the leaves are the 1,000 classes
        }
        truth = [int(v) for v in members["ILSVRC2012_validation_ground_truth.txt"].split()]
    except (KeyError, ValueError, TypeError) as err:
        raise IntegrityError(f"{path}: malformed meta.mat or ground truth ({err})") from err
    unknown = sorted(set(truth) - set(synsets))
    if unknown:
        raise IntegrityError(f"{path}: validation labels {unknown[:5]} are not devkit classes")
    return synsets, truth


def _open_stream(path: Path) -> tarfile.TarFile:
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    return tarfile.open(path, mode="r|*")


def _image_members(tar: tarfile.TarFile, path: Path) -> Iterator[tuple[str, bytes]]:
    """(file name, bytes) of the image files of a tar stream, in archive order."""
    try:
        for member in tar:
            name = member.name.rsplit("/", 1)[-1]
            if member.isfile() and name.lower().endswith(IMAGE_SUFFIXES):
                yield name, tar.extractfile(member).read()
    except (tarfile.TarError, OSError, EOFError) as err:
        raise IntegrityError(f"{path}: truncated or corrupt archive ({err})") from err


def _verify_image(data: bytes, where: str) -> None:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()
    except (UnidentifiedImageError, OSError, SyntaxError) as err:
        raise IntegrityError(f"{where}: not a readable image ({err})") from err


def extract_train(
    path: Path, out: Path, known: set[str], *, verify: bool, progress: bool
) -> dict[str, int]:
    """Streams the training tar of class tars into ``out/WNID/``; returns images per class."""
    counts: dict[str, int] = {}
    bar = tqdm(
        total=FULL_COUNTS["classes"], desc="train classes", unit="class", disable=not progress
    )
    with _open_stream(path) as outer:
        try:
            for member in outer:
                if not (member.isfile() and member.name.endswith(".tar")):
                    continue
                wnid = Path(member.name).stem
                if wnid not in known:
                    raise IntegrityError(f"{path}: class tar {member.name} is not a devkit class")
                target = out / wnid
                target.mkdir(parents=True, exist_ok=True)
                inner_path = Path(f"{path}:{member.name}")
                with tarfile.open(fileobj=outer.extractfile(member), mode="r|") as inner:
                    for name, data in _image_members(inner, inner_path):
                        if verify:
                            _verify_image(data, f"{inner_path}/{name}")
                        (target / name).write_bytes(data)
                        counts[wnid] = counts.get(wnid, 0) + 1
                bar.update()
        except (tarfile.TarError, OSError, EOFError) as err:
            raise IntegrityError(f"{path}: truncated or corrupt archive ({err})") from err
        finally:
            bar.close()
    if not counts:
        raise IntegrityError(f"{path}: no class tars with images")
    return counts


def extract_val(
    path: Path,
    out: Path,
    synsets: dict[int, Synset],
    truth: list[int],
    *,
    verify: bool,
    progress: bool,
) -> dict[str, int]:
    """Streams the validation tar into ``out/WNID/`` by the devkit's ground truth."""
    counts: dict[str, int] = {}
    seen = 0
    with _open_stream(path) as tar:
        images = _image_members(tar, path)
        for name, data in tqdm(images, total=len(truth), desc="val images", disable=not progress):
            # ILSVRC2012_val_00000293.JPEG is the 293rd line of the ground truth
            try:
                index = int(Path(name).stem.rsplit("_", 1)[-1])
            except ValueError as err:
                raise IntegrityError(f"{path}: unexpected file name {name}") from err
            if not 1 <= index <= len(truth):
                raise IntegrityError(
                    f"{path}: {name} has no label (the ground truth lists {len(truth)} images)"
                )
            if verify:
                _verify_image(data, f"{path}:{name}")
            wnid = synsets[truth[index - 1]].wnid
            (out / wnid).mkdir(parents=True, exist_ok=True)
            (out / wnid / name).write_bytes(data)
            counts[wnid] = counts.get(wnid, 0) + 1
            seen += 1
    if seen != len(truth):
        raise IntegrityError(
            f"{path}: {seen} validation images, but the ground truth labels {len(truth)}"
        )
    return counts


def prepare_folder(
    train_tar: Path,
    val_tar: Path,
    devkit: Path,
    out: Path,
    *,
    force: bool = False,
    verify: bool = False,
    progress: bool = True,
) -> dict:
    """Builds the ImageNet folder layout at ``out`` (see the module docstring).

    Returns:
        The summary written to ``prepare.json``.
    """
    synsets, truth = read_devkit(devkit)
    known = {s.wnid for s in synsets.values()}
    with atomic_output_dir(out, replace=force) as tmp:
        train = extract_train(train_tar, tmp / "train", known, verify=verify, progress=progress)
        val = extract_val(val_tar, tmp / "val", synsets, truth, verify=verify, progress=progress)
        missing = sorted(set(val) - set(train))
        if missing:
            raise IntegrityError(
                f"{train_tar}: no training images for validation classes {', '.join(missing[:5])}"
            )
        by_wnid = {s.wnid: s for s in synsets.values()}
        lines = [f"{w} {by_wnid[w].words}" for w in sorted(train)]
        (tmp / "synsets.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
        summary = {
            "inputs": {"train": str(train_tar), "val": str(val_tar), "devkit": str(devkit)},
            "classes": len(train),
            "train": sum(train.values()),
            "val": sum(val.values()),
            "full_imagenet": {k: FULL_COUNTS[k] for k in FULL_COUNTS},
        }
        (tmp / "prepare.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return summary


def _write_hub_split(
    dataset, out: Path, split: str, *, verify: bool, progress: bool
) -> dict[str, int]:
    """Writes a hub split's encoded images, undecoded, into ``out/NNNN/``."""
    import datasets

    rows = dataset.cast_column("image", datasets.Image(decode=False))
    counts: dict[str, int] = {}
    index = 0
    with tqdm(total=len(rows), desc=f"{split} images", disable=not progress) as bar:
        for batch in rows.iter(batch_size=1000):
            for image, label in zip(batch["image"], batch["label"], strict=True):
                index += 1
                if label is None or label < 0:
                    raise IntegrityError(f"{HUB.dataset} {split} row {index} has no label")
                data = image["bytes"]
                name = Path(image.get("path") or "").name or f"{split}_{index:08d}.JPEG"
                if verify:
                    _verify_image(data, f"{HUB.dataset} {split} row {index} ({name})")
                folder = f"{label:04d}"
                (out / folder).mkdir(parents=True, exist_ok=True)
                (out / folder / name).write_bytes(data)
                counts[folder] = counts.get(folder, 0) + 1
            bar.update(len(batch["label"]))
    return counts


def prepare_from_hub(
    out: Path,
    *,
    from_local: Path | None = None,
    cache_dir: Path | None = None,
    force: bool = False,
    verify: bool = False,
    progress: bool = True,
) -> dict:
    """Builds the folder layout from the hub's ``ILSVRC/imagenet-1k`` (see the docstring).

    Raises:
        DownloadError: the hub could not be reached or the download failed (rerun to resume).
        IntegrityError: a split has the wrong row count, an unlabeled row or a bad image.
    """
    splits = load_splits(HUB, from_local, cache_dir)
    feature = splits["train"].features.get("label")
    words = list(getattr(feature, "names", None) or [])
    with atomic_output_dir(out, replace=force) as tmp:
        train = _write_hub_split(
            splits["train"], tmp / "train", "train", verify=verify, progress=progress
        )
        val = _write_hub_split(
            splits["validation"], tmp / "val", "validation", verify=verify, progress=progress
        )
        missing = sorted(set(val) - set(train))
        if missing:
            raise IntegrityError(f"{HUB.dataset}: no training images for classes {missing[:5]}")
        lines = [
            f"{c} {words[int(c)] if int(c) < len(words) else ''}".rstrip() for c in sorted(train)
        ]
        (tmp / "synsets.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
        summary = {
            "inputs": {"hub": f"{HUB.dataset}@{HUB.revision}", "from_local": str(from_local)},
            "classes": len(train),
            "train": sum(train.values()),
            "val": sum(val.values()),
            "full_imagenet": dict(FULL_COUNTS),
        }
        (tmp / "prepare.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return summary


def _list_images(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.lower().endswith(IMAGE_SUFFIXES))


def draw_subset(
    root: Path, classes: int, train_per_class: int, val_per_class: int, seed: int
) -> dict:
    """A random class subset with a fixed number of images per class (RingFormer A.3).

    Raises:
        PrepError: more classes or images per class are asked for than ``root`` has; the
            message names the option.
    """
    available = sorted(d.name for d in (root / "train").iterdir() if d.is_dir())
    if not 0 < classes <= len(available):
        raise PrepError(f"--classes {classes}: {root}/train has {len(available)} classes")
    rng = random.Random(seed)
    chosen = sorted(rng.sample(available, classes))
    listing: dict = {"seed": seed, "classes": chosen, "train": [], "val": []}
    for split, per_class, flag in (
        ("train", train_per_class, "--train-per-class"),
        ("val", val_per_class, "--val-per-class"),
    ):
        for wnid in chosen:
            folder = root / split / wnid
            images = _list_images(folder) if folder.is_dir() else []
            if len(images) < per_class:
                raise PrepError(f"{flag} {per_class}: {folder} has only {len(images)} images")
            listing[split] += [f"{split}/{wnid}/{n}" for n in sorted(rng.sample(images, per_class))]
    return listing


def write_subset(
    root: Path, listing: dict, out: Path, *, copy: bool = False, force: bool = False
) -> dict:
    """Materialises ``listing`` (paths relative to ``root``) at ``out`` as links or copies.

    Raises:
        IntegrityError: a listed file is missing from ``root``.
    """
    files = [*listing["train"], *listing["val"]]
    missing = [f for f in files if not (root / f).is_file()]
    if missing:
        raise IntegrityError(f"{root}: {len(missing)} listed files are missing, e.g. {missing[0]}")
    with atomic_output_dir(out, replace=force) as tmp:
        for rel in tqdm(files, desc="subset", unit="img", disable=len(files) < 1000):
            target = tmp / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            if copy:
                shutil.copy2(root / rel, target)
            else:
                try:
                    os.link(root / rel, target)
                except OSError as err:
                    raise PrepError(
                        f"cannot hard-link {root / rel} into {out} ({err}); pass --copy"
                    ) from err
        if (root / "synsets.txt").is_file():
            chosen = set(listing["classes"])
            lines = (root / "synsets.txt").read_text(encoding="utf-8").splitlines()
            kept = [line for line in lines if line.split(" ", 1)[0] in chosen]
            (tmp / "synsets.txt").write_text("\n".join(kept) + "\n", encoding="utf-8")
        (tmp / "subset.json").write_text(json.dumps(listing, indent=1) + "\n", encoding="utf-8")
    return listing


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    folder = sub.add_parser("folder", help="official ILSVRC2012 files -> class folders")
    folder.add_argument(
        "--source", type=Path, help=f"folder holding {TRAIN_TAR}, {VAL_TAR} and {DEVKIT}"
    )
    folder.add_argument("--train-tar", type=Path)
    folder.add_argument("--val-tar", type=Path)
    folder.add_argument("--devkit", type=Path)
    folder.add_argument("--verify", action="store_true", help="decode every image on the way")
    hub = sub.add_parser("hub", help="the hub's ILSVRC/imagenet-1k -> class folders")
    hub.add_argument("--from-local", type=Path, help="a local copy in the hub's layout")
    hub.add_argument("--cache-dir", type=Path, help="datasets cache directory")
    hub.add_argument("--verify", action="store_true", help="decode every image on the way")
    subset = sub.add_parser("subset", help="ImageNet-small: a random class subset (RingFormer A.3)")
    subset.add_argument("root", type=Path, help="an ImageNet folder made by 'folder'")
    subset.add_argument("--classes", type=int, default=SMALL["classes"])
    subset.add_argument("--train-per-class", type=int, default=SMALL["train_per_class"])
    subset.add_argument("--val-per-class", type=int, default=SMALL["val_per_class"])
    subset.add_argument("--seed", type=int, default=0)
    subset.add_argument("--list", type=Path, help="rebuild this subset.json instead of drawing")
    subset.add_argument("--copy", action="store_true", help="copy instead of hard-linking")
    for p in (folder, hub, subset):
        p.add_argument("-o", "--out", type=Path, required=True)
        p.add_argument("--force", action="store_true", help="replace an existing output")
        p.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "folder":
        for flag, default in (("train_tar", TRAIN_TAR), ("val_tar", VAL_TAR), ("devkit", DEVKIT)):
            if getattr(args, flag) is None:
                if args.source is None:
                    parser.error(f"give --source or --{flag.replace('_', '-')}")
                setattr(args, flag, args.source / default)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.command in ("folder", "hub"):
        if args.command == "folder":
            summary = prepare_folder(
                args.train_tar,
                args.val_tar,
                args.devkit,
                args.out,
                force=args.force,
                verify=args.verify,
                progress=not args.no_progress,
            )
        else:
            summary = prepare_from_hub(
                args.out,
                from_local=args.from_local,
                cache_dir=args.cache_dir,
                force=args.force,
                verify=args.verify,
                progress=not args.no_progress,
            )
        print(
            f"{args.out}: {summary['classes']} classes, {summary['train']:,} train / "
            f"{summary['val']:,} val images"
        )
        return
    if args.list is not None:
        try:
            listing = json.loads(args.list.read_text(encoding="utf-8"))
            listing = {k: listing[k] for k in ("classes", "train", "val")} | {
                "seed": listing.get("seed")
            }
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise IntegrityError(f"{args.list}: not a subset listing ({err})") from err
    else:
        listing = draw_subset(
            args.root, args.classes, args.train_per_class, args.val_per_class, args.seed
        )
    write_subset(args.root, listing, args.out, copy=args.copy, force=args.force)
    print(
        f"{args.out}: {len(listing['classes'])} classes, {len(listing['train']):,} train / "
        f"{len(listing['val']):,} val images (listing in subset.json)"
    )


cli = entry_point(main, PROG)

if __name__ == "__main__":
    sys.exit(cli())
