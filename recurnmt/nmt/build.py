"""Build fairseq translation models from an architecture name, without a data directory.

Used by the parameter accounting command, the launcher's checks, the benchmarks and the
tests: it goes through fairseq's own argument parser and model registry, so the model is
exactly the one ``fairseq-train --arch ARCH FLAGS...`` would build.
"""

from __future__ import annotations

import difflib
from argparse import Namespace
from collections.abc import Sequence

from fairseq import options, tasks
from fairseq.data import Dictionary
from fairseq.models import ARCH_MODEL_REGISTRY

import recurnmt.nmt  # noqa: F401  (registers the architectures)
from recurnmt.nmt.model import RECURRENT_CRITERION


def toy_dictionary(size: int = 100) -> Dictionary:
    """A joined dictionary with ``size`` symbols beyond fairseq's four specials."""
    d = Dictionary()
    for i in range(size):
        d.add_symbol(f"w{i}")
    d.finalize(padding_factor=1)
    return d


def parse_train_args(argv: Sequence[str]) -> Namespace:
    """fairseq's parsed training arguments of a ``fairseq-train`` command line.

    Args:
        argv: the arguments, data directory first; a ``--user-dir`` is imported.
    """
    return options.parse_args_and_arch(options.get_training_parser(), list(argv))


def check_arch(arch: str) -> None:
    """Raises ``ValueError`` naming ``arch`` (and close names) unless it is registered."""
    if arch not in ARCH_MODEL_REGISTRY:
        close = difflib.get_close_matches(arch, list(ARCH_MODEL_REGISTRY), n=4, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"architecture {arch!r} is not registered with fairseq{hint}")


def arch_train_args(arch: str, extra: Sequence[str] = (), data: str = "<none>") -> Namespace:
    """fairseq training arguments for ``--arch arch`` plus ``extra`` flags (translation task).

    Raises:
        ValueError: ``arch`` is not a registered architecture.
    """
    check_arch(arch)
    argv = [data, "--task", "translation", "--arch", arch]
    argv += ["--source-lang", "src", "--target-lang", "tgt"]
    if "--criterion" not in extra:
        argv += ["--criterion", RECURRENT_CRITERION]
    return parse_train_args([*argv, *extra])


def build_model(
    arch: str,
    extra: Sequence[str] = (),
    dictionary: Dictionary | None = None,
    target_dictionary: Dictionary | None = None,
):
    """Builds the model ``fairseq-train --arch arch extra...`` would train.

    Args:
        arch: a registered architecture (ours or fairseq's).
        extra: further command-line flags, e.g. ``["--level-signal-rank", "8"]``.
        dictionary: source dictionary (a toy one by default).
        target_dictionary: target dictionary (the source one by default).

    Returns:
        ``(model, args, task)``.
    """
    args = arch_train_args(arch, extra)
    src = dictionary or toy_dictionary()
    tgt = target_dictionary or src
    task = tasks.get_task("translation")(args, src, tgt)
    model = task.build_model(args)
    return model, args, task
