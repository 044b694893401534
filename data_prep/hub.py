"""Parallel corpora from the Hugging Face hub (through ``datasets``), or a local copy of them.

Files are fetched with ``datasets``' parquet loader from ``hf://`` paths at a pinned revision.
Downloads land in the ``datasets`` / ``huggingface_hub`` caches, so an interrupted download
resumes where it stopped when the command is run again. Loading the parquet files directly
(rather than by repository name) also works for repositories that still carry a legacy loading
script, which ``datasets`` >= 4 refuses to run.

``--from-local DIR`` accepts either the hub's files in the hub's layout (``DIR/<data file
pattern>``) or a ``datasets`` ``save_to_disk`` directory. Row counts are verified against the
expected ones (for a local copy, against ``DIR/rows.json`` if present).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from data_prep.errors import DownloadError, IntegrityError

ROWS_FILE = "rows.json"


@dataclass(frozen=True)
class HubSource:
    """Where a corpus lives on the hub and what it must contain.

    Attributes:
        dataset: Repository id, e.g. ``"wmt/wmt14"``.
        revision: Commit (or branch) to read.
        data_files: Hub split name -> file pattern inside the repository.
        expected_rows: Hub split name -> number of rows it must have.
        column: Column holding ``{lang: text}`` dictionaries.
    """

    dataset: str
    revision: str
    data_files: dict[str, str]
    expected_rows: dict[str, int] = field(default_factory=dict)
    column: str = "translation"

    def hub_url(self, pattern: str) -> str:
        """``hf://`` URL of a file pattern at the pinned revision."""
        revision = self.revision.replace("/", "%2F")
        return f"hf://datasets/{self.dataset}@{revision}/{pattern}"


def _load_parquet(files: dict[str, str], cache_dir: Path | None, redownload: bool) -> Any:
    import datasets

    return datasets.load_dataset(
        "parquet",
        data_files=files,
        cache_dir=str(cache_dir) if cache_dir else None,
        download_mode="force_redownload" if redownload else "reuse_dataset_if_exists",
    )


def _load_local(
    source: HubSource, local: Path, cache_dir: Path | None
) -> tuple[Any, dict[str, int]]:
    import datasets

    expected = dict(source.expected_rows)
    rows_file = local / ROWS_FILE
    if rows_file.is_file():
        expected = {k: int(v) for k, v in json.loads(rows_file.read_text()).items()}
    if (local / "dataset_dict.json").is_file():
        return datasets.load_from_disk(str(local)), expected
    files: dict[str, list[str]] = {}
    for split, pattern in source.data_files.items():
        matches = sorted(str(p) for p in local.glob(pattern))
        if not matches:
            raise FileNotFoundError(f"{local}: no file matches {pattern!r} for split {split!r}")
        files[split] = matches
    return _load_parquet(files, cache_dir, redownload=False), expected


def load_splits(
    source: HubSource,
    from_local: Path | None = None,
    cache_dir: Path | None = None,
    redownload: bool = False,
) -> dict[str, Any]:
    """Load every split of ``source`` and check its row count.

    Args:
        source: The hub dataset.
        from_local: Read this local copy instead of the hub.
        cache_dir: ``datasets`` cache directory (default: its own default).
        redownload: Discard cached downloads and fetch again.

    Returns:
        Hub split name -> ``datasets.Dataset``.

    Raises:
        DownloadError: If the hub cannot be reached or the download fails (rerun to resume).
        IntegrityError: If a file is unreadable or a split has the wrong number of rows.
    """
    where = str(from_local) if from_local else f"{source.dataset}@{source.revision}"
    try:
        if from_local is not None:
            loaded, expected = _load_local(source, Path(from_local), cache_dir)
        else:
            files = {split: source.hub_url(p) for split, p in source.data_files.items()}
            loaded, expected = _load_parquet(files, cache_dir, redownload), source.expected_rows
    except FileNotFoundError:
        raise
    except (OSError, ConnectionError) as err:
        if from_local is not None:
            raise IntegrityError(f"cannot read {where}: {err}") from err
        raise DownloadError(
            f"download of {where} failed ({type(err).__name__}: {err}); "
            "run the command again to resume from the datasets cache"
        ) from err
    except Exception as err:  # pyarrow / datasets raise many types for unreadable files
        raise IntegrityError(f"cannot load {where}: {type(err).__name__}: {err}") from err
    splits = {split: loaded[split] for split in source.data_files}
    for split, ds in splits.items():
        if source.column not in ds.column_names:
            raise IntegrityError(f"{where}: split {split!r} has no {source.column!r} column")
        want = expected.get(split)
        if want is not None and len(ds) != want:
            raise IntegrityError(
                f"{where}: split {split!r} has {len(ds)} rows, expected {want} "
                "(incomplete or different copy; use --redownload to fetch it again)"
            )
    return splits


def iter_pairs(
    dataset: Any, src: str, tgt: str, column: str = "translation", desc: str = "read"
) -> Iterator[tuple[str, str]]:
    """Yield ``(source, target)`` texts of a translation dataset, with a progress bar."""
    rows = dataset.select_columns([column])
    with tqdm(total=len(rows), desc=desc, unit=" rows", leave=False) as bar:
        for batch in rows.iter(batch_size=10_000):
            for item in batch[column]:
                yield item[src], item[tgt]
            bar.update(len(batch[column]))
