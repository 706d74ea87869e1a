"""vLLM: its names in attnmatrix's vocabulary (`names.py`, derived from backends.json), the oracle that runs a
pinned release's selection code from its wheel (`release.py`, `namespace.py`, `oracle.py`), its recorded answers
(`answers.py`, committed under matrix/data/vllm/), the comparison page (`comparison.py`, `templates/`), the
generated vLLM-shaped module (`module.py` writes `selection.py`) and the patch that makes vLLM call it
(`patch.py`)."""

from __future__ import annotations

from attnmatrix.matrix.policy import ResolvedMatrix

from . import comparison, module
from .comparison import PAGE_PATH

__all__ = ["PAGE_PATH", "render_pages"]


def render_pages(m: ResolvedMatrix, meta: dict) -> dict[str, str]:
    """vLLM's generated files: the comparison page and the vLLM-shaped module."""
    return {**comparison.render_pages(m, meta), **module.render_module(m, meta)}
