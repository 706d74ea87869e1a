"""mkdocs hooks for the attnmatrix site (mkdocs.yml `hooks:`). Standard library and mkdocs only.

- The generated per-arch pages (site/archs/*.md) join the nav as one section, in arch order, under the titles
  their front matter gives ("sm_100 — B200 / GB200"): a new arch in the matrix needs no hand edit here.
- The whole matrix as one JSON and one CSV (data/matrix.json, data/matrix.csv) is assembled at build time
  from the committed per-(arch, backend) downloads (site/data/<arch>/<backend>.json), so the repository keeps
  small files with readable diffs and the published site still offers one file each. `whole_matrix` is the
  one place that assembly is written; the data page's schema test calls it.
"""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

ARCH_SECTION = "GPU architectures"
WHOLE_SCHEMA = "attnmatrix.matrix/1"
CELLS_SCHEMA_PREFIX = "attnmatrix.cells/"
_TITLE = re.compile(r'^title:\s*"?(.*?)"?\s*$', re.M)


def arch_key(name: str) -> tuple:
    digits = name[3:] if name.startswith("sm_") else ""
    return (0, int(digits)) if digits.isdigit() else (1, 0)


def arch_nav(docs_dir: Path) -> list[dict[str, str]]:
    out = []
    for page in sorted((docs_dir / "archs").glob("*.md"), key=lambda p: arch_key(p.stem)):
        head = page.read_text(encoding="utf-8").split("\n---", 1)[0]
        found = _TITLE.search(head)
        out.append({found.group(1) if found else page.stem: f"archs/{page.name}"})
    return out


def on_config(config):
    nav = config.get("nav")
    if nav is not None and not any(isinstance(x, dict) and ARCH_SECTION in x for x in nav):
        archs = arch_nav(Path(config["docs_dir"]))
        if archs:
            at = next((i + 1 for i, x in enumerate(nav) if isinstance(x, dict) and "Support matrix" in x), len(nav))
            nav.insert(at, {ARCH_SECTION: archs})
    return config


# --- the whole matrix ------------------------------------------------------------------------------------

def _sig4(x):
    """A figure to 4 significant digits (measurements vary by a few per cent; the per-backend files keep all)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return x
    if isinstance(x, int) or x == 0:
        return x
    return float(f"{x:.4g}")


def whole_matrix(data_dir: Path) -> tuple[str, str]:
    """(JSON text, CSV text): every cell of every site/data/<arch>/<backend>.json, one row per cell, in file order
    (arch, backend), numbers to 4 significant digits. The JSON names reasons and source sets by an id qualified
    with the arch (`sm_90/r3fa`), given once in its `reasons` and `sources` tables; the CSV, one flat table,
    writes them out in full (lists as JSON)."""
    files = sorted(data_dir.glob("*/*.json"), key=lambda p: (arch_key(p.parent.name), p.parent.name, p.stem))
    columns: list[str] | None = None
    timing_columns: list[str] = []
    rows, flat = [], []
    reasons: dict[str, str] = {}
    sources: dict[str, list[str]] = {}
    for f in files:
        d = json.loads(f.read_text(encoding="utf-8"))
        if not str(d.get("schema", "")).startswith(CELLS_SCHEMA_PREFIX):
            continue  # not a per-backend download (the query page's answers live beside them)
        cols = d["columns"]
        if columns is None:
            columns, timing_columns = ["arch", "backend", *cols], d.get("timing_columns", [])
        elif columns[2:] != cols:
            raise ValueError(f"{f}: columns {cols} differ from the other downloads' {columns[2:]}")
        arch = d["arch"]
        for r in d["cells"]:
            cell = {c: _sig4(v) for c, v in zip(cols, r, strict=True)}
            full = dict(cell)
            if cell.get("reason"):
                reasons[f"{arch}/{cell['reason']}"] = full["reason"] = d["reasons"][cell["reason"]]
                cell["reason"] = f"{arch}/{cell['reason']}"
            if cell.get("sources"):
                sources[f"{arch}/{cell['sources']}"] = full["sources"] = d["sources"][cell["sources"]]
                cell["sources"] = f"{arch}/{cell['sources']}"
            rows.append([arch, d["backend"], *(cell[c] for c in cols)])
            flat.append([arch, d["backend"], *(full[c] for c in cols)])
    columns = columns or ["arch", "backend"]
    head = {"schema": WHOLE_SCHEMA, "columns": columns, "timing_columns": timing_columns, "cells": len(rows)}

    def table(d: dict) -> str:
        return "{\n" + ",\n".join(f"    {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}"
                                   for k, v in sorted(d.items())) + "\n  }"

    text = "{\n" + "".join(f"  {json.dumps(k)}: {json.dumps(v)},\n" for k, v in head.items())
    text += f'  "reasons": {table(reasons)},\n  "sources": {table(sources)},\n  "rows": [\n'
    text += ",\n".join("    " + json.dumps(r, ensure_ascii=False) for r in rows) + "\n  ]\n}\n"
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(columns)
    for r in flat:
        w.writerow([json.dumps(v, ensure_ascii=False) if isinstance(v, (list, dict)) else "" if v is None else v
                    for v in r])
    return text, buf.getvalue()


def on_files(files, config):
    from mkdocs.structure.files import File

    data_dir = Path(config["docs_dir"]) / "data"
    if data_dir.is_dir():
        js, cs = whole_matrix(data_dir)
        files.append(File.generated(config, "data/matrix.json", content=js))
        files.append(File.generated(config, "data/matrix.csv", content=cs))
    return files
