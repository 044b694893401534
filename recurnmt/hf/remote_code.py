"""recurnmt's model classes for ``transformers`` (``trust_remote_code``): this file is copied as
``recurnmt_hf.py`` into every directory ``python -m recurnmt.export`` writes.

The model runs recurnmt's own blocks, which are not copied here: this file only imports them
from the installed ``recurnmt`` package, so a directory loads the code that trained it, and
where recurnmt is missing, loading stops with a message that says what to install (without it
transformers would only report an unknown model type ``recurnmt`` and advise updating
transformers). Where recurnmt is installed, ``import recurnmt.hf`` makes this file unnecessary:
the Auto classes then know the model type without ``trust_remote_code``.
"""

try:
    from recurnmt.hf import (
        RecurnmtConfig,
        RecurnmtForConditionalGeneration,
        RecurnmtModel,
        RecurnmtTokenizer,
    )
except ModuleNotFoundError as err:
    if not (err.name or "").startswith("recurnmt"):
        raise
    raise ModuleNotFoundError(
        "this model directory was written by recurnmt (python -m recurnmt.export) and runs "
        "recurnmt's blocks, which are not in it: install the recurnmt package where you load "
        "it (from a clone of its repository: pip install -e PATH_TO_RECURNMT), then load the "
        "directory after `import recurnmt.hf`, or keep trust_remote_code=True",
        name="recurnmt",
    ) from err

__all__ = [
    "RecurnmtConfig",
    "RecurnmtForConditionalGeneration",
    "RecurnmtModel",
    "RecurnmtTokenizer",
]
