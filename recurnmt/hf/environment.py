"""What ``transformers`` needs of the environment beyond its own requirements.

fairseq-fixed requires torchaudio, which recurnmt never uses, but transformers imports it
whenever it is installed (its pipelines' audio utilities), and a torchaudio that does not load
with the installed torch makes ``from transformers import Pipeline`` fail with a message about
neither. Resolvers produce such pairs: torchaudio 2.11.0 declares no torch requirement but loads
only with torch 2.11 or newer (an undefined-symbol ``OSError`` below), and it is the last
release, built for CUDA 13.0, which PyPI's torch 2.15 (CUDA 13.2) does not match (torchaudio
refuses the pair). :func:`check_torchaudio` says what to do before transformers gets there.
"""

from __future__ import annotations

import importlib.util


def check_torchaudio() -> None:
    """Raises ``ImportError`` naming the fix when torchaudio is installed but does not load."""
    if importlib.util.find_spec("torchaudio") is None:
        return
    try:
        import torchaudio  # noqa: F401  (transformers imports it next, whatever we do)
    except (ImportError, OSError, RuntimeError) as err:
        import torch

        version = torch.__version__.split("+")[0]
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ImportError(
            f"torchaudio does not load with torch {torch.__version__} ({reason}), and "
            "transformers imports it whenever it is installed. recurnmt does not use it "
            "(fairseq-fixed requires it for its speech models): pip uninstall torchaudio, or "
            f"install the torchaudio built for your torch (below torch 2.11: "
            f"pip install 'torchaudio=={version}')"
        ) from err
