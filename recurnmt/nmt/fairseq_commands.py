"""fairseq's commands end a recurnmt error as recurnmt's own do: before any data is read, in
one line, with exit code 2.

``fairseq-train``, ``-generate``, ``-validate`` and ``-interactive`` import the plugin
(``--user-dir``) while they parse their command line; from then on three things hold.

* fairseq-train's architecture function checks the model's settings as the command line is
  parsed (:func:`recurnmt.nmt.model.check_model_args`, :mod:`recurnmt.nmt.architectures`).
* Every command's ``main`` starts with ``fairseq.utils.import_user_module(cfg.common)``, before
  its task reads the dictionaries; the plugin wraps that function to check the whole
  configuration there (:func:`check_command`): the model being trained and how
  (``--checkpoint-segment``, the criterion's options and ``--teacher-checkpoint``), each
  checkpoint of ``--path`` (missing, truncated, a text file, an image model's: one line naming
  it) and the model it holds with ``--model-overrides``, and the ``speculative_translation``
  task's options (``--draft-levels``, ``--draft-tokens``, ``--static-decoding``,
  ``--compile-decoding``) against ``--beam`` and the model's decoder. fairseq has no hook
  between parsing and its first read; wrapping the function it calls there at run time
  (looked up in its module) is how the plugin gets one, as :mod:`~recurnmt.nmt.checkpoint_safety`
  wraps fairseq's loader.
* An error raised by recurnmt's code that ends a fairseq command (``sys.excepthook``) prints
  ``PROG: error: MESSAGE`` on one line of stderr and exits with 2, as
  :func:`recurnmt.cli.run_cli` ends recurnmt's commands: a :class:`~recurnmt.modules.ConfigError`,
  a :class:`~recurnmt.checkpoint_files.CheckpointError`, or a ``ValueError``, ``KeyError`` or
  ``OSError`` raised in a ``recurnmt`` module. ``RECURNMT_TRACEBACK=1`` shows the traceback
  instead; fairseq's and torch's own errors keep theirs.
"""

from __future__ import annotations

import ast
import copy
import functools
import os
import sys
from argparse import Namespace
from pathlib import Path
from types import TracebackType
from typing import Any

from recurnmt.checkpoint_files import FAIRSEQ, CheckpointError, read_checkpoint_file
from recurnmt.cli import EXIT_USER_ERROR, USER_ERRORS, error_message
from recurnmt.modules import ConfigError, RecurrentStack
from recurnmt.nmt.criterion import check_settings
from recurnmt.nmt.defaults import ARCHS, fill_arch_defaults
from recurnmt.nmt.model import check_model_args, check_run_flags
from recurnmt.nmt.registry import RECURRENT_CRITERION
from recurnmt.nmt.speculative import TASK, check_decoding_options

__all__ = ["check_command", "fairseq_command", "install"]


def fairseq_command() -> str | None:
    """The fairseq command this process runs (``fairseq-train``; ``python -m fairseq_cli.train``
    too), or None."""
    if not sys.argv or not sys.argv[0]:
        return None
    script = Path(sys.argv[0])
    if script.name.startswith("fairseq-"):
        return script.name
    if script.parent.name == "fairseq_cli" and script.suffix == ".py":
        return f"fairseq-{script.stem}"
    return None


def _recurnmt_args(args: Any) -> bool:
    """``args`` are the arguments of a recurnmt translation model."""
    if args is None:
        return False
    return (getattr(args, "arch", None) or getattr(args, "_name", None)) in ARCHS


def _saved_model_args(state: dict[str, Any]) -> Namespace | None:
    """The model arguments a fairseq checkpoint saved (a copy), as its loader finds them."""
    cfg = state.get("cfg")
    args = cfg.get("model") if isinstance(cfg, dict) else None
    if args is None:
        args = state.get("args")  # fairseq's older format
    if isinstance(args, dict):
        args = Namespace(**args)
    return copy.deepcopy(args) if isinstance(args, Namespace) else None


def checkpoint_stacks(
    path: str, overrides: dict[str, Any]
) -> tuple[RecurrentStack, RecurrentStack] | None:
    """Checks the checkpoint ``path`` as a command is about to load it: the file (one line
    naming a missing, truncated or foreign one) and, for a recurnmt model, its saved settings
    with ``overrides`` (``--model-overrides``). Returns its stacks on the meta device (None: not
    a recurnmt model, or saved arguments fairseq's loader upgrades first, which are left to it).

    Raises:
        FileNotFoundError, CheckpointError: the file cannot serve.
        ConfigError: an impossible setting, named by its flag.
    """
    args = _saved_model_args(read_checkpoint_file(path, FAIRSEQ, mmap=True))
    if not _recurnmt_args(args):
        return None
    for name, value in overrides.items():  # as fairseq's loader applies them to a Namespace
        setattr(args, name, value)
    try:
        fill_arch_defaults(args)
        return check_model_args(args)
    except ConfigError:
        raise
    except Exception:  # an argument an older fairseq saved otherwise: fairseq's loader decides
        return None


def _paths(cfg: Any) -> list[str]:
    """The checkpoints of ``--path`` as fairseq will open them (local files only)."""
    from fairseq import utils

    common_eval, checkpoint = cfg.get("common_eval"), cfg.get("checkpoint")
    if not common_eval or not common_eval.get("path"):
        return []
    if checkpoint is not None and checkpoint.get("checkpoint_shard_count", 1) != 1:
        return []  # shards: fairseq's own naming, left to its loader
    suffix = checkpoint.get("checkpoint_suffix", "") if checkpoint is not None else ""
    paths = utils.split_paths(common_eval.path)
    paths = [p.replace(".pt", suffix + ".pt") for p in paths] if suffix else paths
    return [p for p in paths if "://" not in p]


def check_command(cfg: Any) -> None:
    """Checks a fairseq command's configuration before the command reads any data.

    Args:
        cfg: fairseq's configuration of the command (``FairseqConfig``).

    Raises:
        ConfigError, ValueError: an impossible recurnmt setting, named by its flag.
        FileNotFoundError, CheckpointError: a checkpoint of ``--path`` or
            ``--teacher-checkpoint`` that cannot serve, named.
    """
    model = cfg.get("model")
    if _recurnmt_args(model):  # fairseq-train
        check_run_flags(model)
        check_model_args(model)
    criterion = cfg.get("criterion")
    if criterion is not None and getattr(criterion, "_name", None) == RECURRENT_CRITERION:
        check_settings(
            criterion.log_lrc,
            criterion.shallow_distill,
            criterion.teacher_checkpoint,
            criterion.teacher_distill,
        )
    common_eval = cfg.get("common_eval")
    overrides_text = common_eval.get("model_overrides", "{}") if common_eval else "{}"
    overrides = ast.literal_eval(overrides_text or "{}")  # as fairseq-generate reads it
    paths = _paths(cfg)  # fairseq-generate, -validate, -interactive
    stacks = [checkpoint_stacks(path, overrides) for path in paths]
    task = cfg.get("task")
    if paths and getattr(task, "_name", None) == TASK:  # the task's options: for decoding
        generation = cfg.get("generation") or {}
        check_decoding_options(
            task,
            generation.get("beam", 5),
            generation.get("print_alignment"),
            [decoder for _, decoder in filter(None, stacks)],
        )


def _command_config(common: Any) -> Any:
    """The whole configuration of a command whose ``cfg.common`` is ``common`` (None: not
    one)."""
    from omegaconf import OmegaConf

    if not OmegaConf.is_config(common):
        return None
    root = common._get_parent()  # OmegaConf keeps a node's parent: the command's config
    if root is None or "common_eval" not in root or "task" not in root:
        return None
    return root


def _check_at_main_start() -> None:
    """Wraps ``fairseq.utils.import_user_module`` (once) to run :func:`check_command` when a
    command's ``main`` calls it with its ``cfg.common``."""
    from fairseq import utils

    import_user_module = utils.import_user_module
    if getattr(import_user_module, "checks_recurnmt_settings", False):
        return

    @functools.wraps(import_user_module)
    def wrapped(args: Any) -> Any:
        result = import_user_module(args)
        cfg = _command_config(args)
        if cfg is not None:
            check_command(cfg)
        return result

    wrapped.checks_recurnmt_settings = True
    utils.import_user_module = wrapped


def _raised_by_recurnmt(tb: TracebackType | None) -> bool:
    """The innermost frame of ``tb`` is recurnmt's code."""
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    module = tb.tb_frame.f_globals.get("__name__", "")
    return module == "recurnmt" or module.startswith("recurnmt.")


def is_recurnmt_error(err: BaseException, tb: TracebackType | None) -> bool:
    """``err`` is a user error of recurnmt's: a setting or file its message names."""
    if isinstance(err, (ConfigError, CheckpointError)):
        return True
    return isinstance(err, USER_ERRORS) and _raised_by_recurnmt(tb)


def _excepthook(previous):
    def hook(kind: type[BaseException], err: BaseException, tb: TracebackType | None) -> None:
        prog = fairseq_command()
        traced = os.environ.get("RECURNMT_TRACEBACK")
        if prog is None or traced or not is_recurnmt_error(err, tb):
            previous(kind, err, tb)
            return
        print(f"{prog}: error: {error_message(err)}", file=sys.stderr)
        sys.exit(EXIT_USER_ERROR)  # (SystemExit from the hook: the interpreter exits with it)

    hook.ends_recurnmt_errors = True
    return hook


def install() -> None:
    """Runs the checks where fairseq's commands start and ends recurnmt's errors in one line
    (idempotent; the plugin's import calls it)."""
    _check_at_main_start()
    if not getattr(sys.excepthook, "ends_recurnmt_errors", False):
        sys.excepthook = _excepthook(sys.excepthook)
