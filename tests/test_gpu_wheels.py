"""scripts/gpu_wheels.py: the wheel folder for a GPU machine without a package index."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.test_setup_env import load

gpu_wheels = load("gpu_wheels")
LOCK = Path(__file__).resolve().parents[1] / "requirements" / "lock.txt"


def test_the_folder_holds_the_lock_but_the_images_own_torch():
    pins = gpu_wheels.wanted(gpu_wheels.setup_env.read_lock(LOCK))
    names = {p.split("==")[0] for p in pins}
    assert {"fairseq-fixed", "numpy", "transformers", "timm", "antlr4-python3-runtime"} <= names
    assert not names & {"torch", "torchvision", "torchaudio", "triton", "pip", "uv"}
    assert not any(n.startswith(("nvidia-", "cuda-")) for n in names)


def test_wheels_are_asked_for_that_python_on_linux(tmp_path):
    cmd = gpu_wheels.download_command(["numpy==2.4.6"], tmp_path, "3.12")
    assert cmd[:3] == [sys.executable, "-m", "pip"] and cmd[-1] == "numpy==2.4.6"
    assert "--only-binary=:all:" in cmd and "--no-deps" in cmd
    assert cmd[cmd.index("--python-version") + 1] == "3.12"
    assert "manylinux_2_28_x86_64" in cmd and "manylinux2014_x86_64" in cmd


def test_bad_settings_are_named(tmp_path, capsys):
    assert gpu_wheels.main(["--python-version", "312", "--out", str(tmp_path)]) == 2
    assert "--python-version 312: say it as 3.12" in capsys.readouterr().err
    assert gpu_wheels.main(["--only", "no-such-package", "--out", str(tmp_path)]) == 2
    assert "--only no-such-package: not in the lock" in capsys.readouterr().err


@pytest.mark.e2e
def test_a_wheel_a_source_only_package_and_a_compiled_one_for_python_3_12(tmp_path):
    """From the index: mdurl's wheel, hydra's antlr4 runtime (no wheel anywhere: built here,
    pure Python) and bitarray's CPython 3.12 wheel, whatever this interpreter is."""
    only = ["mdurl", "antlr4-python3-runtime", "bitarray"]
    assert (
        gpu_wheels.main(["--out", str(tmp_path), "--python-version", "3.12", "--only", *only]) == 0
    )
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files[0].startswith("antlr4_python3_runtime-4.9.3-py3-none-any")
    assert files[1].startswith("bitarray-") and "-cp312-cp312-" in files[1]
    assert files[2].startswith("mdurl-") and files[2].endswith("-none-any.whl")
