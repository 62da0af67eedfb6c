"""An installed (non-editable) wheel finds its presets and shipped heads as package data, fetches into the user's
cache, and carries nothing from weights/ but the shipped heads' tracked files.

The wheel is built from a copy of the checkout's tracked files (so the build leaves nothing in the checkout), with
stray weights planted beside them, and installed with --no-deps into a temporary venv that sees this
interpreter's packages (jax, ...) through a .pth file: `venv --system-site-packages` would give the base
interpreter's site-packages, not this venv's.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BUILD_INPUTS = ("pyproject.toml", "README.md", "jaxspec/", "models/", "weights/")
STRAYS = ("weights/smollm2-135m-instruct/ckpt/weights/big.bin", "weights/eagle-smollm2-135m-instruct/extra.bin",
          "weights/eagle-my-head/config.json", "weights/eagle-my-head/model.safetensors", "weights/.cache/x.whl")
CHECK = """
import json, jaxspec, jaxspec.paths as paths, jaxspec.presets as presets
p = presets.load_preset("smollm2-135m-instruct")
print(json.dumps({"package": jaxspec.__file__, "tree": str(paths.source_tree()), "presets": presets.list_presets(),
                  "head": p.eagle["model"], "weights_dir": str(p.weights_dir),
                  "override": str(presets.load_preset(p.name, "/elsewhere").weights_dir)}))
"""


def tracked_files() -> list[str]:
    run = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=False)
    if run.returncode:
        pytest.skip(f"not a git checkout: {run.stderr.strip()}")
    return [f for f in run.stdout.splitlines() if f.startswith(BUILD_INPUTS)]


def test_wheel_ships_presets_and_heads_and_no_weights(tmp_path):
    files = tracked_files()
    src = tmp_path / "src"
    for f in files:
        (src / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, src / f)
    for f in STRAYS:
        (src / f).parent.mkdir(parents=True, exist_ok=True)
        (src / f).write_bytes(b"\0" * (1 << 20))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", str(src), "-w",
                    str(tmp_path / "dist")], check=True, capture_output=True, timeout=120)
    (wheel,) = (tmp_path / "dist").glob("jaxspec-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())

    modules = {f for f in files if f.startswith("jaxspec/") and f.endswith(".py")}
    assert modules <= names, f"packages missing from pyproject.toml's list: {sorted(modules - names)}"
    heads = {f.replace("weights/", "jaxspec/shipped_heads/", 1) for f in files
             if f.startswith("weights/eagle")}
    assert {n for n in names if n.startswith("jaxspec/shipped_heads/")} == heads  # the tracked head files only
    assert {n for n in names if n.startswith("jaxspec/model_presets/")} == {
        f.replace("models/", "jaxspec/model_presets/", 1) for f in files if f.startswith("models/")}
    assert not [n for n in names if n.endswith(".bin") or "smollm2-135m-instruct/ckpt" in n or "my-head" in n]
    assert wheel.stat().st_size < 30 << 20

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    python = venv / "bin" / "python"
    subprocess.run([*pip, "--python", str(python), "install", "--no-deps", "--no-index", str(wheel)], check=True,
                   capture_output=True, timeout=120)
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    (site / "parent_env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")  # after the install: pip ignores it

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path / "home"), "JAX_PLATFORMS": "cpu"}
    run = subprocess.run([str(python), "-c", CHECK], cwd=elsewhere, env=env, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert Path(got["package"]).is_relative_to(site) and got["tree"] == "None"
    assert got["presets"] == ["smollm2-135m-instruct"]
    head = Path(got["head"])
    assert head.is_relative_to(site) and (head / "model.safetensors").is_file() and (head / "config.json").is_file()
    assert got["weights_dir"] == str(tmp_path / "home" / ".cache" / "jaxspec" / "weights" / "smollm2-135m-instruct")
    assert got["override"] == "/elsewhere/smollm2-135m-instruct"
