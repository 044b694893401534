"""``data_prep.imagenet`` on a tiny ILSVRC2012 in the official formats.

The fixture has the real files' structure: a training tar of per-class tars, a flat validation
tar, and a devkit ``.tar.gz`` with ``data/meta.mat`` (a MATLAB struct array of synsets,
non-leaf synsets included) and the validation ground truth. The images are real handwritten
digits (scikit-learn's set) as JPEGs, one digit per class.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from scipy.io import savemat
from sklearn.datasets import load_digits

from data_prep import imagenet
from data_prep.errors import IntegrityError, PrepError
from recurnmt.vision.data.image_folder import scan_folder

REPO = Path(__file__).resolve().parents[1]
WNIDS = ["n01440764", "n01443537", "n01484850"]  # classes 1-3 of ILSVRC2012
WORDS = ["tench, Tinca tinca", "goldfish, Carassius auratus", "great white shark"]
TRAIN_PER_CLASS = 4
VAL_TRUTH = [2, 1, 3, 3, 1, 2]  # ILSVRC2012_IDs of val images 1..6


def jpeg(digit: int, k: int) -> bytes:
    digits = load_digits()
    image = digits.images[digits.target == digit][k]  # 8 x 8, values 0..16
    pixels = np.kron(image * 15.9, np.ones((4, 4))).astype(np.uint8)  # 32 x 32
    buffer = io.BytesIO()
    Image.fromarray(np.stack([pixels] * 3, -1)).save(buffer, format="JPEG")
    return buffer.getvalue()


def add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def write_fixture(root: Path, truth: list[int] = VAL_TRUTH) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    with tarfile.open(root / imagenet.TRAIN_TAR, "w") as outer:
        for c, wnid in enumerate(WNIDS):
            inner = io.BytesIO()
            with tarfile.open(fileobj=inner, mode="w") as tar:
                for k in range(TRAIN_PER_CLASS):
                    add_bytes(tar, f"{wnid}_{100 + k}.JPEG", jpeg(c, k))
            add_bytes(outer, f"{wnid}.tar", inner.getvalue())
    with tarfile.open(root / imagenet.VAL_TAR, "w") as tar:
        for i, label in enumerate(VAL_TRUTH, 1):
            add_bytes(tar, f"ILSVRC2012_val_{i:08d}.JPEG", jpeg(label - 1, 10 + i))
    fields = ["ILSVRC2012_ID", "WNID", "words", "num_children"]
    rows = [(i + 1, w, words, 0) for i, (w, words) in enumerate(zip(WNIDS, WORDS, strict=True))]
    rows.append((4, "n01440000", "fish", 2))  # an inner WordNet node: not a class
    synsets = np.array(rows, dtype=[(f, object) for f in fields])
    mat = io.BytesIO()
    savemat(mat, {"synsets": synsets})
    with tarfile.open(root / imagenet.DEVKIT, "w:gz") as tar:
        add_bytes(tar, "ILSVRC2012_devkit_t12/data/meta.mat", mat.getvalue())
        gt = "".join(f"{v}\n" for v in truth).encode()
        add_bytes(tar, "ILSVRC2012_devkit_t12/data/ILSVRC2012_validation_ground_truth.txt", gt)
    return root


def prepare(source: Path, out: Path, **kwargs) -> dict:
    return imagenet.prepare_folder(
        source / imagenet.TRAIN_TAR,
        source / imagenet.VAL_TAR,
        source / imagenet.DEVKIT,
        out,
        progress=False,
        **kwargs,
    )


def test_devkit_leaves_are_the_classes(tmp_path):
    synsets, truth = imagenet.read_devkit(write_fixture(tmp_path) / imagenet.DEVKIT)
    assert [synsets[i].wnid for i in sorted(synsets)] == WNIDS
    assert synsets[2].words.startswith("goldfish") and truth == VAL_TRUTH


def test_folder_layout_and_labels(tmp_path):
    summary = prepare(write_fixture(tmp_path / "src"), tmp_path / "imagenet", verify=True)
    out = tmp_path / "imagenet"
    assert (summary["classes"], summary["train"], summary["val"]) == (3, 12, 6)
    assert sorted(p.name for p in (out / "train").iterdir()) == WNIDS
    assert (out / "train" / WNIDS[0] / f"{WNIDS[0]}_100.JPEG").is_file()
    # validation image i sits in the folder of its ground-truth class
    for i, label in enumerate(VAL_TRUTH, 1):
        assert (out / "val" / WNIDS[label - 1] / f"ILSVRC2012_val_{i:08d}.JPEG").is_file()
    assert (out / "synsets.txt").read_text().splitlines()[1] == f"{WNIDS[1]} {WORDS[1]}"
    # the vision loader indexes train and val alike
    train, classes = scan_folder(out / "train")
    val, _ = scan_folder(out / "val", classes)
    assert len(train) == 12 and sorted(label for _, label in val) == [0, 0, 1, 1, 2, 2]
    assert json.loads((out / "prepare.json").read_text())["val"] == 6


def test_existing_output_needs_force(tmp_path):
    source = write_fixture(tmp_path / "src")
    prepare(source, tmp_path / "out")
    with pytest.raises(FileExistsError, match="--force"):
        prepare(source, tmp_path / "out")
    prepare(source, tmp_path / "out", force=True)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("truncate_train", "ILSVRC2012_img_train.tar: truncated or corrupt"),
        ("short_truth", "ILSVRC2012_val_00000006.JPEG has no label"),
        ("bad_jpeg", "not a readable image"),
        ("no_devkit", "ILSVRC2012_devkit_t12.tar.gz does not exist|unreadable devkit"),
    ],
)
def test_damaged_inputs_are_named_and_leave_nothing(tmp_path, damage, message):
    source = write_fixture(
        tmp_path / "src", VAL_TRUTH[:5] if damage == "short_truth" else VAL_TRUTH
    )
    if damage == "truncate_train":
        data = (source / imagenet.TRAIN_TAR).read_bytes()
        (source / imagenet.TRAIN_TAR).write_bytes(data[: len(data) // 2])
    if damage == "bad_jpeg":
        with tarfile.open(source / imagenet.VAL_TAR, "w") as tar:
            for i in range(1, 7):
                add_bytes(tar, f"ILSVRC2012_val_{i:08d}.JPEG", b"\xff\xd8 not a jpeg")
    if damage == "no_devkit":
        (source / imagenet.DEVKIT).write_bytes(b"")
    with pytest.raises((IntegrityError, FileNotFoundError), match=message):
        prepare(source, tmp_path / "out", verify=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]  # no (partial) output


def test_subset_draws_reproducibly_and_rebuilds_a_listing(tmp_path):
    prepare(write_fixture(tmp_path / "src"), tmp_path / "full")
    full = tmp_path / "full"
    a = imagenet.draw_subset(full, classes=2, train_per_class=3, val_per_class=2, seed=5)
    assert a == imagenet.draw_subset(full, 2, 3, 2, seed=5)
    assert len(a["classes"]) == 2 and len(a["train"]) == 6 and len(a["val"]) == 4
    imagenet.write_subset(full, a, tmp_path / "small")
    small = tmp_path / "small"
    assert sorted(p.name for p in (small / "train").iterdir()) == a["classes"]
    linked = small / a["train"][0]
    assert linked.stat().st_ino == (full / a["train"][0]).stat().st_ino  # a hard link
    assert len((small / "synsets.txt").read_text().splitlines()) == 2
    # the recorded listing rebuilds the same subset
    imagenet.main(
        ["subset", str(full), "--list", str(small / "subset.json"), "-o", str(tmp_path / "again")]
    )
    again = json.loads((tmp_path / "again" / "subset.json").read_text())
    assert again["train"] == a["train"] and again["val"] == a["val"]


def test_subset_refuses_impossible_sizes(tmp_path):
    prepare(write_fixture(tmp_path / "src"), tmp_path / "full")
    with pytest.raises(PrepError, match="--classes 4"):
        imagenet.draw_subset(tmp_path / "full", 4, 1, 1, seed=0)
    with pytest.raises(PrepError, match="--val-per-class 3"):
        imagenet.draw_subset(tmp_path / "full", 3, 1, 3, seed=0)


def test_cli_reports_errors_in_one_line(tmp_path):
    source = write_fixture(tmp_path / "src")
    (source / imagenet.VAL_TAR).unlink()
    cmd = [sys.executable, "-m", "data_prep.imagenet", "folder", "--source", str(source)]
    result = subprocess.run(
        [*cmd, "-o", str(tmp_path / "out"), "--no-progress"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"python -m data_prep.imagenet: error: {source / imagenet.VAL_TAR} does not exist"
    )
    assert not (tmp_path / "out").exists()


def test_vision_training_reads_the_prepared_folder(tmp_path):
    from recurnmt.vision.training import train as train_cli

    prepare(write_fixture(tmp_path / "src"), tmp_path / "imagenet")
    run = tmp_path / "run"
    train_cli.main(
        ["--data", "imagenet", "--data-root", str(tmp_path / "imagenet"), "--img-size", "32"]
        + ["--model", "vit_mini_patch4", "--epochs", "1", "--batch-size", "4"]
        + ["--output", str(run), "--no-tensorboard", "--no-progress", "--threads", "1"]
    )
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["epoch"] == 1 and 0 <= metrics[-1]["top1"] <= 100


def write_hub_copy(root: Path, val_labels: list[int] | None = None) -> Path:
    """The hub's ILSVRC/imagenet-1k layout: data/{train,validation}-*.parquet with an encoded
    image column and a ClassLabel, plus rows.json with this copy's row counts."""
    import datasets

    features = datasets.Features(
        {"image": datasets.Image(), "label": datasets.ClassLabel(names=WORDS)}
    )
    val_labels = [v - 1 for v in VAL_TRUTH] if val_labels is None else val_labels
    splits = {
        "train": [
            (jpeg(c, k), c, f"{WNIDS[c]}_{100 + k}.JPEG") for c in range(3) for k in range(2)
        ],
        "validation": [
            (jpeg(max(c, 0), 10 + i), c, f"ILSVRC2012_val_{i:08d}.JPEG")
            for i, c in enumerate(val_labels, 1)
        ],
    }
    (root / "data").mkdir(parents=True)
    for split, rows in splits.items():
        ds = datasets.Dataset.from_dict(
            {
                "image": [{"bytes": b, "path": name} for b, _, name in rows],
                "label": [c for _, c, _ in rows],
            },
            features=features,
        )
        ds.to_parquet(str(root / "data" / f"{split}-00000-of-00001.parquet"))
    rows_json = {split: len(rows) for split, rows in splits.items()}
    (root / "rows.json").write_text(json.dumps(rows_json))
    return root


def test_hub_copy_gives_the_folder_layout(tmp_path):
    out = tmp_path / "imagenet"
    summary = imagenet.prepare_from_hub(
        out,
        from_local=write_hub_copy(tmp_path / "hub"),
        cache_dir=tmp_path / "cache",
        verify=True,
        progress=False,
    )
    assert (summary["classes"], summary["train"], summary["val"]) == (3, 6, 6)
    assert sorted(p.name for p in (out / "train").iterdir()) == ["0000", "0001", "0002"]
    assert (out / "train" / "0001" / f"{WNIDS[1]}_100.JPEG").read_bytes() == jpeg(1, 0)
    for i, label in enumerate(VAL_TRUTH, 1):
        assert (out / "val" / f"{label - 1:04d}" / f"ILSVRC2012_val_{i:08d}.JPEG").is_file()
    assert (out / "synsets.txt").read_text().splitlines()[0] == f"0000 {WORDS[0]}"
    train, classes = scan_folder(out / "train")
    assert len(train) == 6 and len(scan_folder(out / "val", classes)[0]) == 6


def test_hub_rows_without_labels_are_refused(tmp_path):
    hub = write_hub_copy(tmp_path / "hub", val_labels=[0, 1, -1])
    with pytest.raises(IntegrityError, match="validation row 3 has no label"):
        imagenet.prepare_from_hub(
            tmp_path / "out", from_local=hub, cache_dir=tmp_path / "cache", progress=False
        )
    assert not (tmp_path / "out").exists()
