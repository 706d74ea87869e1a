#!/usr/bin/env python3
"""Pack vLLM's own FlashAttention builds (backends `vllm_fa2`, `vllm_fa3`) for a GPU machine without network.

Run HERE, in the project root (needs PyPI):

    python3 scripts/pack-vllm-fa.py                 # vLLM 0.26.0, both builds
    python3 scripts/pack-vllm-fa.py --only fa3      # just the FA3 build

It downloads the vLLM wheel (`pip download --no-deps`, CPython 3.12 manylinux_2_28 x86-64) into `.whl/`,
takes from it only what `vllm.vllm_flash_attn.flash_attn_varlen_func` needs — the compiled extension
`_vllm_faN_C.abi3.so`, the package's `__init__.py` and `flash_attn_interface.py`, and the wheel's
`METADATA` and `LICENSE`, so `importlib.metadata.version("vllm")` names the release the build came
from — checks that those Python files import nothing else at import time, and writes zip bundles
under `.gpu/` (git-ignored), each under the per-call carry limit:

    .gpu/vllm-fa3/            vllm-fa3.zip (one part), manifest.json
    .gpu/vllm-fa2-1/ ... -N/  vllm-fa2.zip split into N parts, one folder per call, manifest.json each

On the GPU machine, `python3 scripts/stage-vllm-fa.py .gpu/vllm-faX[-n]` stages each carried part in
/root and, once every part is there, checks the zip's sha256 and unpacks it into /root/vllm-fa (put that
folder on PYTHONPATH). vLLM 0.26.0 is the release built against torch 2.11 + CUDA 13; a newer vLLM
needs a newer torch on the GPU machine (`--version`).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

DEFAULT_VERSION = "0.26.0"
PLATFORM = ["--only-binary=:all:", "--python-version", "3.12", "--platform", "manylinux_2_28_x86_64"]
PKG = "vllm/vllm_flash_attn"
PY_FILES = [f"{PKG}/__init__.py", f"{PKG}/flash_attn_interface.py"]
# Imports the packed Python files may make when imported: the standard library, torch, and themselves.
ALLOWED_AT_IMPORT = {"os", "sys", "types", "importlib", "importlib.machinery", "torch",
                     "vllm.vllm_flash_attn.flash_attn_interface"}
# The bundle's stand-in for the top-level package: only vllm.vllm_flash_attn is packed.
VLLM_INIT = b'"""A stand-in: only vllm.vllm_flash_attn is unpacked here (scripts/pack-vllm-fa.py)."""\n'
# One call carries the working tree (about 18 MB) and at most 64 MiB in all: parts stay well under.
DEFAULT_PART_BYTES = 40_000_000


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch_wheel(version: str, dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    found = sorted(dest.glob(f"vllm-{version}-*manylinux*x86_64.whl"))
    if not found:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", *PLATFORM, "-d", str(dest), f"vllm=={version}"]
        print("+", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
        found = sorted(dest.glob(f"vllm-{version}-*manylinux*x86_64.whl"))
    if not found:
        sys.exit(f"pack-vllm-fa: pip left no vllm-{version} manylinux x86-64 wheel in {dest}")
    return found[-1]


def imports_at_import_time(source: str) -> tuple[set[str], set[str]]:
    """(modules imported when the file is imported, modules imported only inside functions).

    Relative imports are reported as `.name` (`from . import _vllm_fa2_C` -> `._vllm_fa2_C`).
    """
    tree = ast.parse(source)
    top, deferred = set(), set()

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

    walk(tree, False)
    return top, deferred


def check_python_files(whl: zipfile.ZipFile, extensions: list[str]) -> dict[str, list[str]]:
    """Fail unless the packed Python files import only what is packed (or stdlib/torch) at import time."""
    allowed = ALLOWED_AT_IMPORT | {"." + e for e in ("_vllm_fa2_C", "_vllm_fa3_C")}
    deferred_all: dict[str, list[str]] = {}
    for name in PY_FILES:
        top, deferred = imports_at_import_time(whl.read(name).decode("utf-8"))
        unexpected = sorted(top - allowed)
        if unexpected:
            sys.exit(f"pack-vllm-fa: {name} imports {', '.join(unexpected)} when imported; the bundle does not "
                     "carry them (extend PY_FILES, or check the release)")
        deferred_all[name] = sorted(deferred)
    # The deferred imports (vllm.platforms in is_fa_version_supported, the FA4 CuTe interface) are never
    # reached by flash_attn_varlen_func(fa_version=2 or 3): recorded in the manifest, not packed.
    return deferred_all


def build_zip(whl: zipfile.ZipFile, version: str, ext: str, out: Path) -> None:
    dist = f"vllm-{version}.dist-info"
    members = [*PY_FILES, f"{PKG}/{ext}.abi3.so", f"{dist}/METADATA"]
    licenses = [n for n in whl.namelist() if n.startswith(f"{dist}/") and "LICENSE" in n.upper()]
    tmp = out.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=6) as z:
        z.writestr("vllm/__init__.py", VLLM_INIT)
        for name in members + licenses:
            z.writestr(name, whl.read(name))
    tmp.replace(out)


def split(path: Path, part_bytes: int) -> list[bytes]:
    """As few parts as `part_bytes` allows, of equal size (every call then carries about as much)."""
    data = path.read_bytes()
    n = -(-len(data) // part_bytes)
    size = -(-len(data) // n)
    return [data[i:i + size] for i in range(0, len(data), size)]


def write_manifest(folder: Path, manifest: dict) -> None:
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--version", default=DEFAULT_VERSION, help="vLLM release whose wheel to take the builds from")
    ap.add_argument("--only", choices=["fa2", "fa3"], help="pack one build only")
    ap.add_argument("--part-bytes", type=int, default=DEFAULT_PART_BYTES, help="largest part of a split bundle")
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent, help="project root")
    args = ap.parse_args()
    root: Path = args.root
    wheel = fetch_wheel(args.version, root / ".whl")
    wheel_sha = sha256(wheel)
    gpu = root / ".gpu"
    with zipfile.ZipFile(wheel) as whl:
        builds = ["fa2", "fa3"] if args.only is None else [args.only]
        exts = [f"_vllm_{b}_C" for b in builds]
        missing = [e for e in exts if f"{PKG}/{e}.abi3.so" not in whl.namelist()]
        if missing:
            sys.exit(f"pack-vllm-fa: {wheel.name} has no {', '.join(missing)}")
        deferred = check_python_files(whl, exts)
        for build, ext in zip(builds, exts, strict=True):
            staging = gpu / f"vllm-{build}.build"
            staging.mkdir(parents=True, exist_ok=True)
            bundle = staging / f"vllm-{build}.zip"
            print(f"packing {ext} from {wheel.name} ...", flush=True)
            build_zip(whl, args.version, ext, bundle)
            parts = split(bundle, args.part_bytes)
            base = {
                "backend": f"vllm_{build}", "extension": f"{PKG}/{ext}.abi3.so", "vllm": args.version,
                "wheel": wheel.name, "wheel_sha256": wheel_sha, "zip": bundle.name, "zip_sha256": sha256(bundle),
                "zip_bytes": bundle.stat().st_size, "parts": len(parts), "deferred_imports_not_packed": deferred,
            }
            folders = [gpu / f"vllm-{build}"] if len(parts) == 1 else \
                [gpu / f"vllm-{build}-{i + 1}" for i in range(len(parts))]
            for old in [gpu / f"vllm-{build}", *gpu.glob(f"vllm-{build}-*")]:  # a previous packing's folders
                if old.is_dir():
                    shutil.rmtree(old)
            for i, (folder, data) in enumerate(zip(folders, parts, strict=True)):
                folder.mkdir(parents=True)
                name = f"{bundle.name}.part{i + 1}of{len(parts)}"
                (folder / name).write_bytes(data)
                write_manifest(folder, {**base, "part": i + 1, "part_file": name,
                                        "part_sha256": hashlib.sha256(data).hexdigest()})
                print(f"  {folder.relative_to(root)}/{name}: {len(data) / 2**20:.1f} MiB")
            bundle.unlink()
            staging.rmdir()
    print("\nOn the GPU machine, one call per folder above, in order, on the same warm machine; the last "
          "call of a build stages it into /root/vllm-fa and can probe:\n"
          "  python3 scripts/stage-vllm-fa.py .gpu/<folder> && PYTHONPATH=/root/vllm-fa ... "
          "(see scripts/vllm-fa-sweep.sh)")


if __name__ == "__main__":
    main()
