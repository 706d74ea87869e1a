#!/usr/bin/env python3
"""Put vLLM's own FlashAttention builds (backends `vllm_fa2`, `vllm_fa3`) in a folder, without installing vLLM.

usage: python scripts/vllm-fa-site.py DEST [--version 0.26.0] [--wheel WHEEL] [--only fa2|fa3]

vLLM runs its own fork of FlashAttention (`vllm.vllm_flash_attn`, kernels/vllm_fa.py), shipped only inside the
vLLM wheel; installing vLLM would replace the machine's torch with the one vLLM pins. This takes from the wheel
only what `vllm.vllm_flash_attn.flash_attn_varlen_func` needs: the compiled extensions `_vllm_fa2_C` and
`_vllm_fa3_C`, the package's `__init__.py` and `flash_attn_interface.py`, and the wheel's `METADATA` and
license, so `importlib.metadata.version("vllm")` names the release the build came from and the records carry it
as the kernel version. It checks that those Python files import nothing else when imported (their deferred
imports, e.g. `vllm.platforms`, are never reached by `flash_attn_varlen_func(fa_version=2 or 3)`; they are
listed in DEST/manifest.json with the wheel's sha256). Then, on the GPU machine:

    PYTHONPATH=DEST bash scripts/gpu-probe.sh --check      # vllm_fa2, vllm_fa3: ok, or why not

The wheel is downloaded with pip (Linux x86-64) unless --wheel names one. On a machine without network, run
this where there is network and carry DEST over (it holds everything), or carry the wheel and pass --wheel.
vLLM 0.26.0 is built against torch 2.11 and CUDA 13, the versions the committed evidence used; a newer vLLM
needs the torch it was built against. DEST must not exist: nothing is overwritten. Standard library and pip
only (a GPU machine may lack `unzip`). Exit 0 done, 1 the wheel lacks a build or its files import more, 2 usage.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

DEFAULT_VERSION = "0.26.0"
PLATFORM = ["--only-binary=:all:", "--python-version", "3.12", "--platform", "manylinux_2_28_x86_64"]
PKG = "vllm/vllm_flash_attn"
PY_FILES = (f"{PKG}/__init__.py", f"{PKG}/flash_attn_interface.py")
BUILDS = ("fa2", "fa3")
# Imports the unpacked Python files may make when imported: the standard library, torch, and themselves.
ALLOWED_AT_IMPORT = {"os", "sys", "types", "importlib", "importlib.machinery", "torch",
                     "vllm.vllm_flash_attn.flash_attn_interface", ".flash_attn_interface",
                     *(f"._vllm_{b}_C" for b in BUILDS)}
# The folder's stand-in for the top-level package: only vllm.vllm_flash_attn is unpacked.
VLLM_INIT = b'"""A stand-in: only vllm.vllm_flash_attn is unpacked here (scripts/vllm-fa-site.py)."""\n'


class Refused(Exception):
    """The wheel cannot give what the folder needs; the message says what and why."""


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def download_wheel(version: str, dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", *PLATFORM, "-d", str(dest), f"vllm=={version}"]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    found = sorted(dest.glob(f"vllm-{version}-*.whl"))
    if not found:
        raise Refused(f"pip left no vllm-{version} wheel in {dest}")
    return found[-1]


def imports_at_import_time(source: str) -> tuple[set[str], set[str]]:
    """(modules imported when the file is imported, modules imported only inside functions).

    Relative imports are reported as `.name` (`from . import _vllm_fa2_C` -> `._vllm_fa2_C`).
    """
    top: set[str] = set()
    deferred: set[str] = set()

    def names(node: ast.AST) -> list[str]:
        if isinstance(node, ast.Import):
            return [a.name for a in node.names]
        if isinstance(node, ast.ImportFrom):
            if node.level:
                return ["." + (node.module or a.name) for a in node.names]
            return [node.module or ""]
        return []

    def walk(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            for n in names(child):
                (deferred if inside else top).add(n)
            walk(child, inside)

    walk(ast.parse(source), False)
    return top, deferred


def members(whl: zipfile.ZipFile, version: str, builds: tuple[str, ...]) -> tuple[list[str], dict[str, list[str]]]:
    """(the wheel's files to unpack, the deferred imports of its Python files); Refused when a build is missing
    or a Python file imports, when imported, something the folder does not hold."""
    names = set(whl.namelist())
    missing = [f"{PKG}/_vllm_{b}_C.abi3.so" for b in builds if f"{PKG}/_vllm_{b}_C.abi3.so" not in names]
    dist = f"vllm-{version}.dist-info"
    missing += [n for n in (*PY_FILES, f"{dist}/METADATA") if n not in names]
    if missing:
        raise Refused(f"the wheel has no {', '.join(missing)}")
    deferred = {}
    for name in PY_FILES:
        top, later = imports_at_import_time(whl.read(name).decode("utf-8"))
        unexpected = sorted(top - ALLOWED_AT_IMPORT)
        if unexpected:
            raise Refused(f"{name} imports {', '.join(unexpected)} when imported, which the folder would not hold "
                          "(extend PY_FILES, or check the release)")
        deferred[name] = sorted(later)
    licenses = sorted(n for n in names if n.startswith(f"{dist}/") and "LICENSE" in n.upper())
    return [*PY_FILES, *(f"{PKG}/_vllm_{b}_C.abi3.so" for b in builds), f"{dist}/METADATA", *licenses], deferred


def unpack(wheel: Path, version: str, builds: tuple[str, ...], dest: Path) -> dict:
    """Write the folder beside DEST and rename it into place once complete; returns its manifest."""
    with zipfile.ZipFile(wheel) as whl:
        files, deferred = members(whl, version, builds)
        partial = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
        try:
            (partial / "vllm").mkdir()
            (partial / "vllm" / "__init__.py").write_bytes(VLLM_INIT)
            for name in files:
                whl.extract(name, partial)
            manifest = {"vllm": version, "wheel": wheel.name, "wheel_sha256": sha256(wheel),
                        "backends": [f"vllm_{b}" for b in builds], "files": files,
                        "deferred_imports_not_unpacked": deferred}
            (partial / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
            partial.rename(dest)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
    return manifest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 2)[2],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dest", type=Path, help="the folder to create and put on PYTHONPATH (must not exist)")
    ap.add_argument("--version", default=DEFAULT_VERSION, help="the vLLM release (default %(default)s)")
    ap.add_argument("--wheel", type=Path, help="a downloaded vLLM wheel of that release (default: pip downloads it)")
    ap.add_argument("--only", choices=BUILDS, help="one build only (default: both)")
    args = ap.parse_args(argv)
    dest = args.dest.expanduser().resolve()
    if dest.exists():
        ap.error(f"{dest} exists: give a new folder (nothing is overwritten)")
    if args.wheel is not None and not args.wheel.is_file():
        ap.error(f"--wheel {args.wheel}: no such file")
    dest.parent.mkdir(parents=True, exist_ok=True)
    builds = (args.only,) if args.only else BUILDS
    try:
        with tempfile.TemporaryDirectory() as tmp:
            wheel = args.wheel or download_wheel(args.version, Path(tmp))
            manifest = unpack(wheel, args.version, builds, dest)
    except (Refused, zipfile.BadZipFile, subprocess.CalledProcessError) as e:
        print(f"vllm-fa-site: {e}", file=sys.stderr)
        return 1
    print(f"vLLM {manifest['vllm']}'s {', '.join(manifest['backends'])} from {manifest['wheel']} in {dest}\n"
          f"next: PYTHONPATH={dest} bash scripts/gpu-probe.sh --check")
    return 0


if __name__ == "__main__":
    sys.exit(main())
