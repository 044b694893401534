"""fairseq's own deprecation noise is silenced by the plugin; other warnings still show."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# what fairseq-train does before training: parse the command line (importing the plugin),
# compose the Hydra config, build a data loader, enter the autocast context of a train step
# `import fairseq` itself scripts helpers with torch.jit.script, deprecated since torch 2.14: that
# warning fires before fairseq-train loads any plugin, so no plugin can silence it (FAIRSEQ_NOISE
# covers it where recurnmt is imported first); the test imports fairseq past it.
SCRIPT = """
import logging, warnings
logging.basicConfig(handlers=[logging.NullHandler()])
import torch
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="`torch.jit.script` is deprecated")
    import fairseq
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from recurnmt.nmt.build import arch_train_args
convert_namespace_to_omegaconf(arch_train_args("ringformer_tiny"))
list(torch.utils.data.DataLoader([1, 2], pin_memory=True))
with torch.cuda.amp.autocast(enabled=False):
    pass
warnings.warn("a warning of the user's own")
"""


def warnings_of(script: str, env: dict[str, str] | None = None) -> list[str]:
    """The warning lines a fresh interpreter prints running ``script`` (default filters, as
    in fairseq-train); fails if it fails."""
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
        check=False, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    return [line for line in out.stderr.splitlines() if "Warning" in line]


def test_fairseq_noise_is_silenced_and_other_warnings_show():
    warned = warnings_of(SCRIPT)
    assert len(warned) == 1 and "a warning of the user's own" in warned[0], warned


def test_launched_fairseq_commands_import_fairseq_quietly_and_keep_user_filters():
    import os

    from recurnmt.nmt.quiet import IMPORT_TIME_FILTER, quiet_env

    env = quiet_env(dict(os.environ, PYTHONWARNINGS="error::DeprecationWarning"))
    assert env["PYTHONWARNINGS"] == f"{IMPORT_TIME_FILTER},error::DeprecationWarning"
    assert quiet_env(env) == env  # idempotent
    script = "import fairseq, warnings; warnings.warn('a warning of the user', FutureWarning)"
    # as fairseq-train starts: fairseq first, no plugin yet
    warned = warnings_of(
        script, quiet_env({k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"})
    )
    assert len(warned) == 1 and "a warning of the user" in warned[0], warned


def test_importing_the_plugin_leaves_logging_unconfigured():
    # fairseq's speech tasks call logging.basicConfig(level=INFO) when imported: a script that
    # imported recurnmt printed "Please install tensorboardX" and every INFO record after it
    script = (
        "import logging, recurnmt.nmt; root = logging.getLogger(); "
        "assert not root.handlers and root.level == logging.WARNING, root.handlers; "
        "logging.getLogger('fairseq').info('an INFO record'); "
        "logging.getLogger('user').warning('a warning of the user')"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stderr.strip() == "a warning of the user", out.stderr
