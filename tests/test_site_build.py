"""The real site builds with `mkdocs build --strict`: every page in the nav, no broken link, no warning."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None,
    reason="mkdocs and mkdocs-material are not installed (pip install 'attnmatrix[docs]')")


@pytest.mark.slow
def test_mkdocs_build_strict(tmp_path: Path) -> None:
    out = tmp_path / "site-build"
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(REPO / "mkdocs.yml"),
                        "-d", str(out)], capture_output=True, text=True, cwd=tmp_path,
                       env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    for page in ("index.html", "quickstart/index.html", "support-matrix/index.html", "policy/index.html",
                 "mla-prefill/index.html", "fa-version/index.html", "contributing/index.html", "ci/index.html",
                 "selector-api/index.html", "changelog/index.html", "vllm-comparison/index.html"):
        assert (out / page).is_file(), page
    for arch_page in sorted((REPO / "site" / "archs").glob("*.md")):
        assert (out / "archs" / arch_page.stem / "index.html").is_file(), arch_page.name
    # the CI page includes the committed workflow example verbatim (pymdownx.snippets)
    ci = (out / "ci" / "index.html").read_text(encoding="utf-8")
    assert "attnmatrix check --reprobe" in ci and "--8&lt;--" not in ci
