"""The per-cell data behind the pages: one JSON file per (arch, backend) (site/data/<arch>/<backend>.json) with
every cell's verbatim reason, errors, timings and sources, and the schema the data page documents.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import defaultdict
from collections.abc import Sequence

from attnmatrix.matrix.policy import ResolvedCell, ResolvedMatrix

from . import tables as T
from .page_format import Legend, arch_legend, cell_row_key

CELLS_DIR = "site/data"  # the per-cell JSON files: site/data/<arch>/<backend>.json
CELLS_SCHEMA = "attnmatrix.cells/3"


def cells_by_arch_backend(m: ResolvedMatrix) -> dict[str, dict[str, list[ResolvedCell]]]:
    """The public cells per arch, then per backend (an arch page and an arch's JSON files hold the same cells)."""
    out: dict[str, dict[str, list[ResolvedCell]]] = defaultdict(lambda: defaultdict(list))
    for c in T.public_cells(m):
        out[c.case.arch][c.case.backend].append(c)
    return out


CELL_COLUMNS = ("op", "dtype", "head_dim", "head_dim_v", "features", "status", "outcome", "tier", "reason",
                "latency_ms", "host_ms", "tflops", "max_abs_err", "max_rel_err", "kernel_version", "sources",
                "conflicts", "timings")
TIMING_COLUMNS = ("shape", "latency_ms", "host_ms")  # one timed shape of a cell's `timings`
# The download schema, documented on the data page (site/data.md) and checked against the files by a test:
# column -> (JSON type(s), meaning).
COLUMN_DOCS = {
    "op": ("string", "`prefill`, `decode` (one query token per sequence) or `mla_prefill`"),
    "dtype": ("string", "`bfloat16` or `float16` (the inputs' dtype; `fp8` is a feature)"),
    "head_dim": ("integer", "head size of Q and K"),
    "head_dim_v": ("integer", "head size of V (equal to `head_dim` except for MLA)"),
    "features": ("array of strings", "the feature tokens of the case, sorted (`causal`, `sliding_window`, "
                 "`softcap`, `alibi`, `sinks`, `gqa`, `varlen`, `fp8`, `paged_kv:<block size>`, "
                 "`qk_rope:<n>`); empty for none"),
    "status": ("string", "`supported`, `unsupported` or `unknown`: the resolved answer"),
    "outcome": ("string or null", "the deciding record's outcome (`pass`, `rejected`, `crash`, `wrong`, ...)"),
    "tier": ("string or null", "the deciding evidence's tier: `validated`, `compiled`, `shipped`, `declared`"),
    "reason": ("string or null", "id of the reason (in the file's `reasons` table, in full) of a cell that is "
               "not supported"),
    "latency_ms": ("number or null", "GPU time per call in milliseconds (CPU: wall time), the median over the "
                   "timed shapes, 4 significant digits"),
    "host_ms": ("number or null", "the host's time per call (issuing it, back to back), median over the timed "
                "shapes; null where not recorded"),
    "tflops": ("number or null", "TFLOP/s counting only unmasked work, median over the timed shapes"),
    "max_abs_err": ("number or null", "largest absolute difference from the float32 reference"),
    "max_rel_err": ("number or null", "largest relative difference from the float32 reference"),
    "kernel_version": ("string or null", "the version of the library that produced the deciding record"),
    "sources": ("string or null", "id of the source set (in the file's `sources` table): provenance or citations"),
    "conflicts": ("array of strings", "evidence the deciding record overruled"),
    "timings": ("array of arrays", "one `[shape, latency_ms, host_ms]` per timed shape (`b64_kv4096`: batch 64, "
                "4096 keys; `b8_s2048`: batch 8, 2048 query and key tokens); empty when not timed"),
}


def _num(x: object) -> float | int | None:
    """A figure to 4 significant digits (reruns vary by a few per cent; more digits would be noise), or None."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    if not math.isfinite(x):
        return None
    if isinstance(x, int) or x == 0:
        return x
    return float(f"{x:.4g}")


def cells_json(m: ResolvedMatrix, arch: str, backend: str, cs: Sequence[ResolvedCell],
               legend: Legend | None = None) -> str:
    """One (arch, backend)'s cells as JSON: a header, then one line per cell in `columns` order, reasons and
    source sets by id into the `reasons`/`sources` tables (given in full; the ids are the arch page's when
    `legend` is the page's). Deterministic; one new record changes the lines of its cell and of any new reason
    or source."""
    cs = sorted(cs, key=cell_row_key)
    legend = legend or arch_legend(cs)
    reasons = {rid: legend.reasons[rid] for rid in {legend.reason(c.reason) for c in cs} if rid}
    sources = {sid: legend.sources[sid] for sid in {legend.source(c.sources) for c in cs} if sid}
    rows = []
    for c in cs:
        k = c.case
        err = (c.winner.error if c.winner else None) or {}
        row = [k.op, k.dtype, k.head_dim, k.head_dim_v, list(k.features), c.status, c.outcome, c.tier,
               legend.reason(c.reason), _num(c.latency_ms), _num(c.host_ms), _num(c.tflops),
               _num(err.get("max_abs_err")), _num(err.get("max_rel_err")), c.kernel_version,
               legend.source(c.sources), list(c.conflicts),
               [[t.shape, _num(t.latency_ms), _num(t.host_ms)] for t in c.timings]]
        rows.append(json.dumps(row, ensure_ascii=False))

    def block(d: dict) -> str:
        return "{\n" + ",\n".join(f"    {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}"
                                   for k, v in sorted(d.items())) + "\n  }" if d else "{}"

    label = str(m.backends.get(backend, {}).get("label", backend))
    body = [f'  "reasons": {block(reasons)},', f'  "sources": {block(sources)},', '  "cells": [']
    body += [f"    {r}," for r in rows[:-1]] + ([f"    {rows[-1]}"] if rows else [])
    body += ["  ]", "}"]
    # The header names this file's own content and kernel versions, not the whole matrix's: a new fact
    # about one backend changes that backend's file, not every download of the site.
    versions = sorted({c.kernel_version for c in cs if c.kernel_version})
    head = {"generated": f"Generated by attnmatrix from the {label} evidence for {arch}"
                         f"{' (' + ', '.join(versions) + ')' if versions else ''}. "
                         "Do not edit by hand; run `attnmatrix generate`.",
            "schema": CELLS_SCHEMA,
            "timing_columns": list(TIMING_COLUMNS),
            "content_id": hashlib.sha256("\n".join(body).encode()).hexdigest()[:12],
            "arch": arch, "backend": backend, "label": label, "columns": list(CELL_COLUMNS)}
    lines = ["{"] + [f"  {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}," for k, v in head.items()]
    return "\n".join(lines + body) + "\n"


def cells_files(m: ResolvedMatrix) -> dict[str, str]:
    """{site path: JSON text} for every (arch, backend) with cells."""
    out = {}
    for arch, per in cells_by_arch_backend(m).items():
        legend = arch_legend([c for cs in per.values() for c in cs])
        for backend, cs in per.items():
            out[f"{CELLS_DIR}/{arch}/{backend}.json"] = cells_json(m, arch, backend, cs, legend)
    return dict(sorted(out.items()))


def json_link(arch: str, backend: str) -> str:
    """The per-cell JSON of (arch, backend), relative to the arch page (site/archs/<arch>.md)."""
    return f"../{CELLS_DIR.removeprefix('site/')}/{arch}/{backend}.json"
