"""vLLM: its names in attnmatrix's vocabulary (`names.py`, derived from backends.json), the oracle that runs a
pinned release's selection code from its wheel (`release.py`, `namespace.py`, `oracle.py`), its recorded answers
(`answers.py`, committed under matrix/data/vllm/), and the comparison page (`comparison.py`, `templates/`)."""

from __future__ import annotations

from .comparison import PAGE_PATH, render_pages

__all__ = ["PAGE_PATH", "render_pages"]
