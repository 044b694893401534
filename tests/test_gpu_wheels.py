"""scripts/gpu_wheels.py: the wheel folder for a GPU machine without a package index."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.test_setup_env import load

gpu_wheels = load("gpu_wheels")
ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements" / "lock.txt"


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


def _wheel(folder: Path, name: str, version: str, requires: list[str], tag="py3-none-any"):
    """A wheel file holding only the METADATA that names its requirements."""
    import zipfile

    path = folder / f"{name.replace('-', '_')}-{version}-{tag}.whl"
    meta = [f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}"]
    meta += [f"Requires-Dist: {r}" for r in requires]
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{name.replace('-', '_')}-{version}.dist-info/METADATA", "\n".join(meta))
    return path


def test_a_wheels_requirements_are_read_for_the_target_python(tmp_path):
    wheel = _wheel(tmp_path, "datasets", "5.2.0", [
        "dill<0.4.2,>=0.3.0", "Huggingface_Hub<3.0,>=1.31.0",
        'importlib-resources; python_version < "3.9"', 'pywin32; sys_platform == "win32"',
        'pytest; extra == "tests"', 'tomli; python_version < "3.13"',
    ])  # fmt: skip
    assert gpu_wheels.wheel_requires(wheel, "3.12") == ["dill", "huggingface-hub", "tomli"]
    assert gpu_wheels.wheel_requires(wheel, "3.13") == ["dill", "huggingface-hub"]


def test_an_images_folder_holds_what_the_image_lacks_and_what_that_needs(tmp_path, monkeypatch):
    """The roots the image lacks, their requirements the image lacks (read from the wheels,
    recursively), pure-Python wheels of the image's packages those require, nothing of a root
    the image holds nor of an image package's own requirements."""
    meta = {  # name: (requirements, pure Python)
        "fairseq-fixed": (["hydra-core", "numpy", "torch"], False),
        "hydra-core": (["omegaconf", "packaging"], True),
        "omegaconf": (["antlr4-python3-runtime", "pyyaml"], True),
        "antlr4-python3-runtime": ([], True),
        "numpy": ([], False), "pyyaml": ([], False), "packaging": (["never-read"], True),
        "timm": (["never-read"], True),
    }  # fmt: skip
    lock = {n: "1.0" for n in meta} | {"torch": "2.14.1", "never-read": "1.0"}
    out = tmp_path / "wheels"
    out.mkdir()
    asked = {"fill": [], "pure": []}

    def fill(folder, python_version, pins):
        asked["fill"] += pins
        for pin in pins:
            name = pin.split("==")[0]
            _wheel(folder, name, "1.0", meta[name][0], "py3-none-any" if meta[name][1] else "cp312")
        return {"wheels": pins, "built": [], "sources": []}

    def pip(cmd):
        name = cmd[-1].split("==")[0]
        if "--platform" in cmd and cmd[cmd.index("--platform") + 1] == "any":
            asked["pure"].append(name)
            if meta[name][1]:
                _wheel(out, name, "1.0", meta[name][0])
                return True
        return False

    monkeypatch.setattr(gpu_wheels, "fill", fill)
    monkeypatch.setattr(gpu_wheels, "pip", pip)
    image = {"numpy", "pyyaml", "packaging", "timm", "torch"}
    done = gpu_wheels.image_wanted(["fairseq-fixed", "timm", "numpy"], lock, image, out, "3.12")
    assert sorted(asked["fill"]) == [
        "antlr4-python3-runtime==1.0", "fairseq-fixed==1.0", "hydra-core==1.0", "omegaconf==1.0"
    ]  # fmt: skip
    assert sorted(asked["pure"]) == ["packaging", "pyyaml"]  # required, held by the image
    assert done["image"] == ["packaging==1.0"]  # pyyaml has no pure-Python wheel: the image's
    assert "never-read" not in str(asked)


def test_an_image_file_is_read_and_a_missing_one_named(tmp_path, capsys):
    image = tmp_path / "image.txt"
    image.write_text("# comment\nNumPy\nhuggingface_hub  # the hub\n\n", encoding="utf-8")
    assert gpu_wheels.read_image(image) == {"numpy", "huggingface-hub"}
    missing = tmp_path / "none.txt"
    assert gpu_wheels.main(["--image", str(missing), "--out", str(tmp_path / "w")]) == 2
    assert f"--image {missing}: no such file" in capsys.readouterr().err


def test_the_h200_image_lacks_fairseq_and_holds_the_torch_family():
    image = gpu_wheels.read_image(ROOT / "scripts" / "gpu_check" / "images" / "nvidia-h200.txt")
    assert {"torch", "torchvision", "timm", "transformers", "numpy", "pyarrow"} <= image
    assert not image & {"fairseq-fixed", "hydra-core", "omegaconf", "datasets"}
