"""What fairseq's commands say in their logs, read back: one reader for every format.

``fairseq-train`` logs its statistics under a tag (``train_inner`` every ``--log-interval``
updates, ``train`` at the end of an epoch, ``valid`` after a validation), in one of three
``--log-format``s:

* ``json``: ``... | INFO | train_inner | {"epoch": 1, "loss": "9.1", ...}``; end-of-epoch and
  validation keys carry the tag (``"train_loss"``, ``"valid_ppl"``);
* ``simple``, progress: ``... | INFO | train_inner | epoch 001:  2 / 9 loss=9.1, ppl=...``;
* ``simple`` and ``tqdm``, end of epoch and validation:
  ``... | INFO | valid | epoch 002 | valid on 'valid' subset | loss 5.1 | ppl 14.93 | ...``.

:func:`log_records` reads all three into ``{statistic: text}`` records with the names the
simple format uses (json's tag prefix dropped); the functions below pick what the scripts
report. ``fairseq-generate`` closes with its own speed, read by :func:`generation_speed`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

_PAIR = re.compile(r"(\w+)=([-+\d.eE]+)")  # simple format progress: loss=9.1, ppl=...
# fairseq-generate's closing line: "Translated 1,555 sentences (33,982 tokens) in 33.6s
# (46.22 sentences/s, 1010.01 tokens/s)"
_TRANSLATED = re.compile(
    r"Translated ([\d,]+) sentences \(([\d,]+) tokens\) in ([\d.]+)s "
    r"\(([\d.]+) sentences/s, ([\d.]+) tokens/s\)"
)


def _record(body: str, tag: str) -> dict[str, str] | None:
    """The statistics of one logged line after its ``| tag |`` (None: not statistics)."""
    if body.startswith("{"):
        try:
            raw = json.loads(body)
        except json.JSONDecodeError:
            return None
        return {str(k).removeprefix(f"{tag}_"): str(v) for k, v in raw.items()}
    if "=" in body:
        return dict(_PAIR.findall(body))
    parts = (part.strip() for part in body.split(" | "))
    return dict(part.split(" ", 1) for part in parts if " " in part)


def log_records(log: Path, tag: str) -> list[dict[str, str]]:
    """The statistics ``fairseq-train`` logged under ``tag``, oldest first.

    Args:
        log: a fairseq-train log (json, simple or tqdm format; other lines are skipped).
        tag: ``train_inner``, ``train``, ``valid`` (or another validation subset).

    Returns:
        One ``{statistic: value as text}`` per logged line, names as in the simple format
        (``loss``, ``ppl``, ``num_updates``, ``wps``, ...).
    """
    marker = f"| {tag} |"
    records = []
    for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
        at = line.find(marker)
        if at >= 0 and (record := _record(line[at + len(marker) :].strip(), tag)):
            records.append(record)
    return records


def _number(value: str) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def last_valid_stats(train_log: Path) -> dict[str, str]:
    """The last validation's statistics (``{}``: none logged)."""
    found = log_records(train_log, "valid")
    return found[-1] if found else {}


def valid_ppl(train_log: Path) -> float | None:
    """Validation perplexity at the last validation of a ``fairseq-train`` log."""
    return _number(last_valid_stats(train_log).get("ppl"))


def train_stats(train_log: Path) -> dict[str, float]:
    """Training loss and perplexity at the last logged update."""
    found = log_records(train_log, "train_inner")
    last = found[-1] if found else {}
    return {k: float(last[k]) for k in ("num_updates", "loss", "ppl") if k in last}


def epoch_stats(train_log: Path) -> dict[int, dict[str, float]]:
    """fairseq's end-of-epoch training statistics per epoch: ``{epoch: {"wps": ..., "ups":
    ..., "wall": ..., "loss": ...}}``."""
    found = {}
    for record in log_records(train_log, "train"):
        numbers = {k: _number(v) for k, v in record.items() if k != "epoch"}
        found[int(record["epoch"])] = {k: v for k, v in numbers.items() if v is not None}
    return found


def generation_speed(generate_log: Path) -> dict[str, float] | None:
    """What ``fairseq-generate`` says of its own speed (None: no such line)."""
    match = _TRANSLATED.search(generate_log.read_text(encoding="utf-8"))
    if match is None:
        return None
    sentences, tokens, seconds, per_s, tokens_per_s = match.groups()
    return {
        "sentences": int(sentences.replace(",", "")),
        "tokens": int(tokens.replace(",", "")),
        "seconds": float(seconds),
        "sentences_per_s": float(per_s),
        "tokens_per_s": float(tokens_per_s),
    }
