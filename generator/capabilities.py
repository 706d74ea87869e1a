"""A ResolvedMatrix as the query engine's plain data (`attnmatrix.selector_engine`), and the one engine per matrix.

Per (arch, backend) the resolved cells become a few rules: products of ops x dtypes x head sizes x feature
sets that share one verdict (outcome, tier, evidence id, short reason), the way xformers and vLLM declare
capabilities as supported lists. The rules are lossless (every resolved cell is covered by exactly one
rule, nothing else is), sorted, and keyed so that one new fact or record changes only the rules of the
verdicts it touches. Long raw reasons and full sources stay in the matrix (`attnmatrix show/explain`).
"""

from __future__ import annotations

import functools
import hashlib
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

from attnmatrix.matrix.backends import (
    DEFAULT_RANK_MISSING,
    default_rank,
    engine_names,
    power_of_two_paths,
    whole_tile_backends,
)
from attnmatrix.matrix.policy import ResolvedCell, ResolvedMatrix
from attnmatrix.matrix.records import Record
from attnmatrix.matrix.vllm_graphs import graph_batches

from attnmatrix.selector_engine import measured_latencies
from attnmatrix.selector_vllm import VllmEngine
from attnmatrix.vocabulary import DTYPES, OPS, SUPPORTED, arch_sort_key

# Head sizes get_flash_attn_version decides over when the caller gives none: the common ones; the last
# one orders the candidates.
FA_COMMON_HEAD_SIZES: tuple[tuple[int, int], ...] = ((64, 64), (128, 128))
FA_BACKEND_FIELD = "fa_version"
SHORT_REASON_CHARS = 120
LATENCY_DIGITS = 4  # significant digits kept: reruns vary by more than the fifth


def is_test_only(m: ResolvedMatrix, backend: str) -> bool:
    return bool(m.backends.get(backend, {}).get("test_only"))


def evidence_id(rec: Record | None) -> str:
    """A short, stable name for the evidence behind a cell: the declared fact's id, the run id, or for a
    record without one, what made it (tool, target, library and version, date)."""
    if rec is None:
        return "none"
    p = rec.provenance
    if p.get("declared_id"):
        eid = p["declared_id"]
    elif rec.run_id:
        eid = rec.run_id
    else:
        what = "xcompile" if rec.tier == "compiled" else rec.tier
        eid = ":".join(str(x) for x in (what, p.get("target") or rec.case.arch, p.get("library", "kernel"),
                                        rec.kernel_version or "?", p.get("date", "?")))
    eid = str(eid)
    if eid.isprintable() and " " not in eid:  # the common case, kept whole: " " is the one printable space
        return eid or "none"
    return "".join(ch if ch.isprintable() and not ch.isspace() else "_" for ch in eid) or "none"


def short_reason(reason: str | None) -> str:
    """The first line of a reason, cut to SHORT_REASON_CHARS."""
    line = next((x.strip() for x in (reason or "").splitlines() if x.strip()), "")
    if not line.isprintable():
        line = "".join(ch if ch.isprintable() else " " for ch in line)
    return line if len(line) <= SHORT_REASON_CHARS else line[:SHORT_REASON_CHARS - 3].rstrip() + "..."


def verdict(c: ResolvedCell) -> tuple[str, ...]:
    """(outcome, tier, evidence id[, short reason]): a supported cell carries no reason."""
    head = (c.outcome or "none", c.tier or "none", evidence_id(c.winner))
    reason = short_reason(c.reason) if c.status != SUPPORTED else ""
    return (*head, reason) if reason else head


def _dims_key(d: tuple[int, int]) -> tuple:
    return (d[0] != d[1], d)


def _fset_key(f: tuple[str, ...]) -> tuple:
    return (len(f), f)


def _head_size(d: tuple[int, int]) -> int | tuple[int, int]:
    """A head size as the rules write it: 128, or (192, 128) where the V head size differs."""
    return d[0] if d[0] == d[1] else d


def _heads_key(heads: tuple) -> tuple:
    return tuple(_dims_key(h if isinstance(h, tuple) else (h, h)) for h in heads)


Rule = tuple[tuple[str, ...], tuple[str, ...], tuple, tuple[tuple[str, ...], ...], tuple[str, ...]]


def rules(cells: Iterable[ResolvedCell]) -> tuple[Rule, ...]:
    """Lossless rules for one (arch, backend): per verdict, its cells factored into products (feature sets,
    then head sizes, then dtypes, then ops), sorted. A rule is (ops, dtypes, head sizes, feature sets, verdict)."""
    by_verdict: dict[tuple, dict] = defaultdict(lambda: defaultdict(set))
    for c in cells:
        k = c.case
        by_verdict[verdict(c)][(k.op, k.dtype, (k.head_dim, k.head_dim_v))].add(k.features)
    out = []
    for v, per_key in by_verdict.items():
        by_fsets: dict[frozenset, dict] = defaultdict(lambda: defaultdict(set))
        for (op, dtype, dims), fsets in per_key.items():
            by_fsets[frozenset(fsets)][(op, dtype)].add(dims)
        for fsets, per_od in by_fsets.items():
            by_dims: dict[frozenset, dict] = defaultdict(lambda: defaultdict(set))
            for (op, dtype), dims in per_od.items():
                by_dims[frozenset(dims)][op].add(dtype)
            for dims, per_op in by_dims.items():
                by_dtypes: dict[frozenset, set] = defaultdict(set)
                for op, dtypes in per_op.items():
                    by_dtypes[frozenset(dtypes)].add(op)
                for dtypes, ops in by_dtypes.items():
                    out.append((tuple(sorted(ops, key=OPS.index)), tuple(sorted(dtypes, key=DTYPES.index)),
                                tuple(_head_size(d) for d in sorted(dims, key=_dims_key)),
                                tuple(sorted(fsets, key=_fset_key)), v))
    return tuple(sorted(out, key=lambda r: (r[4], r[0], r[1], _heads_key(r[2]), r[3])))


def backend_rules(per_block: dict[tuple[str, str], list[ResolvedCell]], archs: list[str]) -> dict[str, tuple]:
    """backend -> its rules on every arch, a rule that holds on several archs written once with their tuple:
    (archs, ops, dtypes, head sizes, feature sets, verdict)."""
    where: dict[str, dict[Rule, list[str]]] = defaultdict(dict)
    for (arch, backend), cells in per_block.items():
        for r in rules(cells):
            where[backend].setdefault(r, []).append(arch)
    order = {a: i for i, a in enumerate(archs)}
    return {b: tuple(sorted(((tuple(sorted(a, key=order.__getitem__)), *r) for r, a in rs.items()),
                            key=lambda r: (r[5], r[1], r[2], _heads_key(r[3]), r[4], [order[a] for a in r[0]])))
            for b, rs in sorted(where.items())}


def measured(cells: Iterable[ResolvedCell]) -> dict[str, dict[tuple, tuple]]:
    """arch -> (op, dtype, head_dim, head_dim_v, feature set) -> like-for-like latencies of the measured
    backends, fastest first: one entry per query class."""
    timings: dict[tuple, dict[str, dict[str, float]]] = defaultdict(dict)
    for c in cells:
        if c.timings:
            k = c.case
            timings[(k.arch, k.op, k.dtype, k.head_dim, k.head_dim_v, k.features)][k.backend] = {
                t.shape: t.latency_ms for t in c.timings}
    out: dict[str, dict[tuple, tuple]] = defaultdict(dict)
    for key in sorted(timings, key=lambda k: (arch_sort_key(k[0]), OPS.index(k[1]), k[2], k[3] != k[4], k[3:5],
                                              len(k[5]), k[5])):
        lats = measured_latencies(timings[key])
        row = []
        for b, (ms, done, most) in lats.items():
            ms = float(f"{ms:.{LATENCY_DIGITS}g}")
            row.append((b, ms) if done == most else (b, ms, done, most))
        out[key[0]][key[1:]] = tuple(sorted(row, key=lambda r: (r[1], r[0])))
    return dict(out)


def selector_archs(m: ResolvedMatrix) -> list[str]:
    """Archs the selector knows: every GPU arch with evidence from a public backend (never `cpu`)."""
    return sorted({c.case.arch for c in m.cells.values() if c.case.arch != "cpu"
                   and not is_test_only(m, c.case.backend)}, key=arch_sort_key)


def engine_data(m: ResolvedMatrix, *, include_cpu: bool = False) -> dict:
    """The engine's data for a matrix: public backends only; GPU archs (and `cpu` with include_cpu)."""
    archs = selector_archs(m) + (["cpu"] if include_cpu and any(c.case.arch == "cpu" for c in m.cells.values())
                                 else [])
    cells = sorted((c for c in m.cells.values() if c.case.arch in archs and not is_test_only(m, c.case.backend)),
                   key=lambda c: c.case)
    per_block: dict[tuple[str, str], list[ResolvedCell]] = defaultdict(list)
    for c in cells:
        per_block[(c.case.arch, c.case.backend)].append(c)
    public = sorted(b for b in m.backends if not is_test_only(m, b))
    backends = {a: tuple(sorted({b for x, b in per_block if x == a})) for a in archs}
    timed, band, spread = workloads(archs)
    return {
        "archs": tuple(archs),
        "backends": backends,
        "default_rank": {a: {b: default_rank(m.backends, b, a) for b in backends[a]} for a in archs},
        "default_rank_missing": DEFAULT_RANK_MISSING,
        "fa_version": {b: int(m.backends[b][FA_BACKEND_FIELD]) for b in public
                       if m.backends[b].get(FA_BACKEND_FIELD) is not None},
        "engine_names": engine_names({b: m.backends[b] for b in public}, OPS),
        "fa_common_head_sizes": FA_COMMON_HEAD_SIZES,
        "declared_rankings": tuple((r.id, tuple(r.archs), r.op, r.dtype, tuple(r.head_dims), tuple(r.order),
                                    tuple(r.sources)) for r in m.rankings),
        "rules": backend_rules(per_block, archs),
        "measured": measured(cells),
        "workloads": timed,
        "workload_band": band,
        "workload_interpolation_band": spread,
        # backend -> vLLM's captured decode batch sizes, for the backends whose decode split follows them
        "graph_batches": graph_batches({b: m.backends[b] for b in public}),
        # the backends whose decode placement leaves out their power-of-two fast path
        "power_of_two_paths": power_of_two_paths({b: m.backends[b] for b in public}),
        # the backends whose prefill placement reads them at the end of the query's tile
        "whole_tiles": whole_tile_backends({b: m.backends[b] for b in public}),
    }


def workloads(archs) -> tuple[dict, float, float]:
    """(arch -> (op, dtype, head_dim, head_dim_v, feature set) -> bucket rows, the noise band within which two
    timings tie, the interpolation band within which two backends placed between timed points cannot be told
    apart) for selector_workloads.place, from the committed workload timings (matrix/data/workloads,
    matrix/workloads.py bucket_orders and interpolation_error)."""
    from attnmatrix.matrix import workloads as W

    files = tuple((str(f), hashlib.sha256(f.read_bytes()).hexdigest()) for f in sorted(W.WORKLOADS_DIR.glob("*.jsonl")))
    per_cell, band, spread = _workload_tables(files)
    out: dict = {}
    for (arch, *cell), rows in per_cell.items():
        if arch in archs:
            out.setdefault(arch, {})[tuple(cell)] = rows
    return {a: dict(sorted(rows.items())) for a, rows in sorted(out.items())}, band, spread


@functools.lru_cache(maxsize=2)
def _workload_tables(files: tuple[tuple[str, str], ...]) -> tuple[dict, float, float]:
    """`workloads` for every arch, from the workload files (path, digest of its bytes): every generation builds
    the engine's data twice (the selector's, the docs' with `cpu`), and reading the timings is most of it, so
    they are read once per content. The rows are tuples: callers share them."""
    from attnmatrix.matrix.workloads import bucket_orders, interpolation_error, load_rows, selector_rows

    noise, orders = bucket_orders(load_rows([Path(f) for f, _ in files]))
    per_cell = {key: tuple(rows) for key, rows in selector_rows(orders).items()}
    return per_cell, noise["p90"] or 1.0, interpolation_error(orders)["p90"] or 1.0


_T = TypeVar("_T")
# what -> (matrix identity, value): the pages ask one matrix the same things many times
_LAST: dict[str, tuple[tuple, object]] = {}


def per_matrix(m: ResolvedMatrix, what: str, build: Callable[[], _T]) -> _T:
    """build(), or the value it gave for `what` on the same matrix object, while its cells, backends and rankings
    are the same objects and its cell count unchanged: a matrix is not edited in place while files are generated
    from it (a command that changes one builds a new one). The references held keep the objects alive, so their
    identity cannot be reused by another matrix."""
    ident = (m, m.cells, m.backends, m.rankings, len(m.cells))
    hit = _LAST.get(what)
    if hit is not None and all(a is b for a, b in zip(hit[0][:4], ident[:4], strict=True)) and hit[0][4] == ident[4]:
        return hit[1]  # type: ignore[return-value]
    value = build()
    _LAST[what] = (ident, value)
    return value


def engine_for(m: ResolvedMatrix, *, include_cpu: bool = True) -> VllmEngine:
    """The engine over `m`, with vLLM's questions (built once per matrix object and reused while its cells are
    unchanged)."""
    return per_matrix(m, f"engine include_cpu={include_cpu}",
                      lambda: VllmEngine(engine_data(m, include_cpu=include_cpu)))
