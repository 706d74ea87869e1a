"""A vLLM release on disk: its wheel (or the extracted tree), version, RECORD hashes and requirements.

The oracle (`oracle.py`) executes files from a Release; nothing here runs vLLM code.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import shutil
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from .answers import OracleError


@dataclass
class Release:
    """A vLLM release on disk: `root` holds `vllm/` and `vllm-<version>.dist-info/`."""

    root: Path
    version: str
    wheel_name: str | None  # the wheel file's name, None when given an extracted tree
    wheel_sha256: str | None
    record: dict[str, str]  # path -> sha256 hex, from the dist-info RECORD
    requires: list[str]  # Requires-Dist lines of METADATA

    def path(self, rel: str) -> Path:
        return self.root / rel

    def has(self, rel: str) -> bool:
        return (self.root / rel).exists()

    def glob(self, pattern: str) -> list[str]:
        return sorted(str(p.relative_to(self.root)) for p in self.root.glob(pattern))

    def requires_on_linux(self, dist: str) -> bool:
        """Whether `pip install vllm` on Linux x86_64 installs `dist` (a Requires-Dist with no extra)."""
        norm = re.sub(r"[-_.]+", "-", dist).lower()
        for line in self.requires:
            name = re.split(r"[\s;<>=!~\[(]", line.strip(), maxsplit=1)[0]
            if re.sub(r"[-_.]+", "-", name).lower() != norm:
                continue
            marker = line.partition(";")[2]
            if "extra ==" in marker:
                continue
            if "platform_system" in marker and "Linux" not in marker:
                continue
            return True
        return False


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _read_dist_info(root: Path) -> tuple[str, dict[str, str], list[str]]:
    infos = sorted(root.glob("vllm-*.dist-info"))
    if len(infos) != 1:
        raise OracleError(f"{root}: expected one vllm-<version>.dist-info folder, found {len(infos)}")
    meta = (infos[0] / "METADATA").read_text(encoding="utf-8")
    version = next((ln.split(":", 1)[1].strip() for ln in meta.splitlines() if ln.startswith("Version:")), None)
    if not version:
        raise OracleError(f"{infos[0]}/METADATA: no Version field")
    requires = [ln.split(":", 1)[1].strip() for ln in meta.splitlines() if ln.startswith("Requires-Dist:")]
    record: dict[str, str] = {}
    rec = infos[0] / "RECORD"
    if rec.exists():
        for line in rec.read_text(encoding="utf-8").splitlines():
            parts = line.rsplit(",", 2)
            if len(parts) == 3 and parts[1].startswith("sha256="):
                digest = parts[1][len("sha256="):]
                record[parts[0]] = base64.urlsafe_b64decode(digest + "=" * (-len(digest) % 4)).hex()
    return version, record, requires


@contextmanager
def open_release(path: str | os.PathLike) -> Iterator[Release]:
    """A vLLM wheel (`.whl`) or a folder holding its extracted `vllm/` and dist-info.

    A wheel's Python files, its dist-info and the names of its compiled extensions are extracted to a
    temporary folder (the extensions as empty files: only their presence is read), removed afterwards.
    """
    p = Path(path)
    if p.is_dir():
        if not (p / "vllm").is_dir():
            raise OracleError(f"{p}: no vllm/ package folder (expected an extracted vLLM wheel)")
        version, record, requires = _read_dist_info(p)
        yield Release(p, version, None, None, record, requires)
        return
    if not p.is_file() or not zipfile.is_zipfile(p):
        raise OracleError(f"{p}: not a vLLM wheel (.whl) nor an extracted wheel folder")
    tmp = Path(tempfile.mkdtemp(prefix="attnmatrix-vllm-"))
    try:
        with zipfile.ZipFile(p) as z:
            for name in z.namelist():
                if name.endswith("/") or ".." in name.split("/"):
                    continue
                top = name.split("/", 1)[0]
                if top == "vllm" and name.endswith(".py") or top.endswith(".dist-info"):
                    z.extract(name, tmp)
                elif top == "vllm" and name.endswith(".so"):
                    (tmp / name).parent.mkdir(parents=True, exist_ok=True)
                    (tmp / name).touch()  # presence only: a compiled extension cannot run here
        version, record, requires = _read_dist_info(tmp)
        yield Release(tmp, version, p.name, _sha256(p), record, requires)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
