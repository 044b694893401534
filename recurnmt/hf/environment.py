"""What ``transformers`` needs of the environment beyond its own requirements.

fairseq-fixed requires torchaudio, which recurnmt never uses, but transformers imports it
whenever it is installed (its pipelines' audio utilities). torchaudio 2.11.0 declares no torch
requirement, so a resolver installs it beside any torch, yet it loads only with torch 2.11 or
newer: with an older torch, ``import transformers``' pipelines fail with an undefined-symbol
``OSError`` that names neither package. :func:`check_torchaudio` says so first.
"""

from __future__ import annotations

from importlib import metadata


def _major_minor(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("+")[0].split(".")[:2])


def check_torchaudio(versions: dict[str, str] | None = None) -> None:
    """Raises ``ImportError`` naming the fix when torchaudio is newer than torch.

    Args:
        versions: ``{"torch": ..., "torchaudio": ...}``; default: the installed ones.
    """
    if versions is None:
        try:
            versions = {name: metadata.version(name) for name in ("torch", "torchaudio")}
        except metadata.PackageNotFoundError:
            return  # no torchaudio: transformers does not import it
    torch, audio = versions["torch"], versions["torchaudio"]
    if _major_minor(audio) > _major_minor(torch):
        raise ImportError(
            f"torchaudio {audio} does not load with torch {torch}, and transformers imports it "
            f"(fairseq-fixed requires torchaudio): install the torchaudio of your torch, "
            f"pip install 'torchaudio=={torch.split('+')[0]}'"
        )
