"""scripts/vllm-fa-site.py: vLLM's FlashAttention builds taken out of a vLLM wheel into a folder that imports without
vLLM, checked before anything is written; an existing folder is never touched."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "vllm-fa-site.py"
spec = importlib.util.spec_from_file_location("vllm_fa_site", SCRIPT)
site = importlib.util.module_from_spec(spec)
spec.loader.exec_module(site)

INIT = "import os\nfrom .flash_attn_interface import flash_attn_varlen_func\n"
INTERFACE = ("import torch\n\ndef is_fa_version_supported(v):\n    from vllm.platforms import current_platform\n"
             "    return True\n\ndef flash_attn_varlen_func(*a, fa_version=2, **k):\n    return fa_version\n")


def wheel(tmp_path: Path, *, interface: str = INTERFACE, builds: tuple[str, ...] = ("fa2", "fa3")) -> Path:
    """A vLLM wheel holding a fake vllm.vllm_flash_attn (the extensions are placeholder bytes)."""
    path = tmp_path / "vllm-9.9.9-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("vllm/__init__.py", "import vllm.platforms  # the real package imports everything\n")
        z.writestr("vllm/platforms/__init__.py", "")
        z.writestr("vllm/vllm_flash_attn/__init__.py", INIT)
        z.writestr("vllm/vllm_flash_attn/flash_attn_interface.py", interface)
        for b in builds:
            z.writestr(f"vllm/vllm_flash_attn/_vllm_{b}_C.abi3.so", b"\x7fELF")
        z.writestr("vllm-9.9.9.dist-info/METADATA", "Metadata-Version: 2.1\nName: vllm\nVersion: 9.9.9\n")
        z.writestr("vllm-9.9.9.dist-info/licenses/LICENSE", "Apache-2.0\n")
    return path


def test_the_folder_holds_the_builds_and_names_the_release(tmp_path):
    dest = tmp_path / "vllm-fa"
    assert site.main([str(dest), "--version", "9.9.9", "--wheel", str(wheel(tmp_path))]) == 0
    pkg = dest / "vllm" / "vllm_flash_attn"
    assert sorted(p.name for p in pkg.iterdir()) == ["__init__.py", "_vllm_fa2_C.abi3.so", "_vllm_fa3_C.abi3.so",
                                                      "flash_attn_interface.py"]
    assert not (dest / "vllm" / "platforms").exists()  # only the fork, and a stand-in for the package
    manifest = json.loads((dest / "manifest.json").read_text())
    assert manifest["backends"] == ["vllm_fa2", "vllm_fa3"] and len(manifest["wheel_sha256"]) == 64
    assert manifest["deferred_imports_not_unpacked"]["vllm/vllm_flash_attn/flash_attn_interface.py"] == [
        "vllm.platforms"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no partial folder left
    # it imports as vLLM's package, and the release is what importlib.metadata reads
    probe = ("import importlib.metadata as md, sys, types; sys.modules['torch'] = types.ModuleType('torch'); "
             "from vllm.vllm_flash_attn import flash_attn_varlen_func as f; print(md.version('vllm'), f(fa_version=3))")
    out = subprocess.run([sys.executable, "-c", probe], env={"PYTHONPATH": str(dest)}, capture_output=True, text=True)
    assert out.stdout.split() == ["9.9.9", "3"], out.stderr


def test_one_build_only(tmp_path):
    dest = tmp_path / "fa3"
    assert site.main([str(dest), "--version", "9.9.9", "--wheel", str(wheel(tmp_path)), "--only", "fa3"]) == 0
    assert not (dest / "vllm" / "vllm_flash_attn" / "_vllm_fa2_C.abi3.so").exists()


@pytest.mark.parametrize("change, says", [
    ({"builds": ("fa3",)}, "_vllm_fa2_C.abi3.so"),
    ({"interface": "import torch\nimport vllm.platforms\n"}, "imports vllm.platforms when imported"),
])
def test_a_wheel_that_cannot_give_the_builds_is_refused_and_nothing_is_written(tmp_path, capsys, change, says):
    dest = tmp_path / "vllm-fa"
    assert site.main([str(dest), "--version", "9.9.9", "--wheel", str(wheel(tmp_path, **change))]) == 1
    assert says in capsys.readouterr().err
    assert not dest.exists() and [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_an_existing_folder_is_never_overwritten(tmp_path, capsys):
    dest = tmp_path / "vllm-fa"
    dest.mkdir()
    (dest / "mine.txt").write_text("keep")
    with pytest.raises(SystemExit) as e:
        site.main([str(dest), "--wheel", str(wheel(tmp_path))])
    assert e.value.code == 2 and "nothing is overwritten" in capsys.readouterr().err
    assert [p.name for p in dest.iterdir()] == ["mine.txt"]


def test_help_says_how_the_recipe_uses_it():
    out = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "PYTHONPATH=DEST bash scripts/gpu-probe.sh --check" in out.stdout
