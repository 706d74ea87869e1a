"""Engines: one folder per inference engine whose decisions attnmatrix answers for (`attnmatrix/engines/<engine>/`).

An engine's folder holds everything about that engine and nothing else does:

- its name mapping, derived from `matrix/data/backends.json` (each backend declares the engine names that run
  exactly its entry point; the engine's module inverts those declarations, never a hand-written inverse);
- its oracle: the code that runs a pinned release's own selection functions and records their answers as
  committed data under `matrix/data/<engine>/` (the only place engine code executes; the generator never does);
- its comparison: the engine's recorded answers next to attnmatrix's (through the one query engine), and the
  pages that show it, with their templates in the folder's `templates/`.

Layering: an engine reads the matrix and asks the generator's query seam (`generator.tables`); the generator
does not import engines. `render_all` is every generated file: the generator's and each engine's pages.
Adding an engine is adding a folder whose package exposes `render_pages(m, meta) -> {path: text}`.
"""

from __future__ import annotations

import importlib
import pkgutil

from attnmatrix.generator import render_all as render_generator_files
from attnmatrix.matrix.policy import ResolvedMatrix


def engine_names() -> list[str]:
    """The engine folders under attnmatrix/engines, sorted."""
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if m.ispkg)


def render_pages(m: ResolvedMatrix, meta: dict) -> dict[str, str]:
    """Every engine's generated pages: {repo-relative path: text}."""
    out: dict[str, str] = {}
    for name in engine_names():
        engine = importlib.import_module(f"{__name__}.{name}")
        for path, text in engine.render_pages(m, meta).items():
            if path in out:
                raise ValueError(f"engines: {name} renders {path}, which another engine renders too")
            out[path] = text
    return out


def render_all(m: ResolvedMatrix, meta: dict) -> dict[str, str]:
    """Every generated file: the generator's (selector, docs, plots) and the engines' pages, sorted by path."""
    out = render_generator_files(m, meta)
    for path, text in render_pages(m, meta).items():
        if path in out:
            raise ValueError(f"engines: {path} is also a generator file")
        out[path] = text
    return dict(sorted(out.items()))
