"""The arch pages' tables for people: per-arch capability summaries, compact per-cell grids, the fastest backend
per measured cell, and what was run where (coverage).

What a reader of an arch page asks first is "which backends run here, for which head sizes, dtypes, ops and
features, and how sure are we": `capability_rows` answers that per backend, compressed the way xformers and
vLLM declare capabilities (a list of supported head sizes, the ops and features, each with the strongest
evidence tier behind it and, where it does not hold everywhere, where it holds). The per-cell detail follows as
one grid per backend (rows: op, dtype, head size; columns: probed feature sets), where a cell is its tier mark
plus its latency, or a reason id; reasons and sources are listed once per page, not per cell. The page's other
parts live beside this module: how values are written and reasons get ids (`page_format`), the decision tables
(`decision_tables`), the per-cell JSON next to the pages (`cell_data`); the support matrix's rows over every
arch are `support_matrix`.

Nothing here decides support or order: statuses come from the resolved matrix, and "which backend is fastest"
is answered by `generator.tables.query` (the one query path the CLI and selector share).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from attnmatrix.matrix.policy import ResolvedCell, ResolvedMatrix

from attnmatrix.vocabulary import (
    DTYPES,
    MASK_FEATURES,
    OPS,
    SUPPORTED,
    UNKNOWN,
    UNSUPPORTED,
    arch_sort_key,
    capability_label,
    feature_name,
)

from . import tables as T
from .cell_data import cells_by_arch_backend, json_link
from .decision_tables import DECISION_LAYERS, DecisionTable, decision_tables
from .gpus import load_gpus
from .page_format import (
    Legend,
    arch_legend,
    cell_row_key,
    dims_key,
    dims_label,
    feature_label,
    feature_set_key,
    feature_token_key,
    preview,
    sig2,
    strongest,
    tier_mark,
    tier_order,
)

# --- capability summary -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Item:
    """One entry of a summary column: a label, its mark, and where it holds ("" = wherever the backend works)."""

    label: str
    mark: str
    where: str = ""
    reason: str | None = None  # reason id (for not-supported items)


@dataclass
class CapabilityRow:
    backend: str
    label: str
    evidence: list[tuple[str, int]]  # (mark, cell count), strongest first, then X and ?
    ops: list[str]
    dtypes: list[Item]
    head_sizes: list[Item]
    features: list[Item]
    not_supported: list[Item]
    block_sizes: list[Item]
    cells: int


def _scope(per_op: dict[str, set], universe: dict[str, set], label: Callable[[object], str],
           probed: dict[str, set], allow_not: bool = True) -> str:
    """Where an item holds, relative to where the backend works and the item was probed (`universe`: per op,
    the head sizes with a supported cell; `probed`: per op, the head sizes the item was probed on): "" when
    wherever both hold, else per op the subset (`decode`, `prefill: 64, 128`); ops with the same subset share
    one entry. The shorter `prefill: not 512` form is used only where every left-out head size was probed with
    the item (`missing` is taken within `probed`), so "not" never stands for "never tried"; `allow_not=False`
    always lists (for refusals, where "not 64" would read as a double negative)."""
    ops = [o for o in OPS if universe.get(o) and probed.get(o)]
    if all(per_op.get(o, set()) >= universe[o] & probed[o] for o in ops):
        return ""
    texts: dict[str, list[str]] = {}
    for o in ops:
        got = per_op.get(o, set()) & universe[o]
        if not got:
            continue
        missing = (universe[o] & probed[o]) - got
        if not missing:
            text = ""
        elif allow_not and len(missing) < len(got):
            text = "not " + ", ".join(label(x) for x in sorted(missing, key=dims_key))
        else:
            text = ", ".join(label(x) for x in sorted(got, key=dims_key))
        texts.setdefault(text, []).append(o)
    whole = ", ".join(o for o in texts.pop("", []))
    parts = ([whole] if whole else []) + [f"{', '.join(os)}: {t}" for t, os in texts.items()]
    return "; ".join(parts)


def _dims(c: ResolvedCell) -> tuple[int, int]:
    return (c.case.head_dim, c.case.head_dim_v)


def _most_common(reasons: Iterable[str | None]) -> str | None:
    counted = Counter(r for r in reasons if r)
    return min(counted, key=lambda r: (-counted[r], r)) if counted else None


def feature_cells(cs: Iterable[ResolvedCell], name: str) -> list[ResolvedCell]:
    """The cells that probe feature `name`: those carrying it, except that the mask feature (causal) is probed
    by the cells with no other feature (causal+softcap says nothing about causal if softcap is refused)."""
    if name in MASK_FEATURES:
        return [c for c in cs if any(feature_name(t) == name for t in c.case.features)
                and all(feature_name(t) in MASK_FEATURES for t in c.case.features)]
    return [c for c in cs if any(feature_name(t) == name for t in c.case.features)]


def _per_op_dims(cs: Iterable[ResolvedCell]) -> dict[str, set]:
    out: dict[str, set] = defaultdict(set)
    for c in cs:
        out[c.case.op].add(_dims(c))
    return out


def capability_row(m: ResolvedMatrix, backend: str, cs: Sequence[ResolvedCell], legend: Legend) -> CapabilityRow:
    sup = [c for c in cs if c.status == SUPPORTED]
    ops = [o for o in OPS if any(c.case.op == o for c in sup)]
    universe = _per_op_dims(sup)  # where the backend works at all: per op, the head sizes with a supported cell

    def items(key_of: Callable[[ResolvedCell], Iterable], sort_key, label) -> list[Item]:
        """Supported values of one axis; small print names the ops where a value holds, when it was probed on
        more ops (that the backend supports) than it holds on."""
        per: dict = defaultdict(list)
        tried: dict = defaultdict(set)
        for c in cs:
            for k in key_of(c):
                if c.status == SUPPORTED:
                    per[k].append(c)
                if c.case.op in ops:
                    tried[k].add(c.case.op)
        out = []
        for k in sorted(per, key=sort_key):
            held = {c.case.op for c in per[k]}
            where = "" if held >= tried[k] else ", ".join(o for o in OPS if o in held)
            out.append(Item(label(k), tier_mark(strongest(c.tier for c in per[k])), where))
        return out

    evidence = [(tier_mark(t), n) for t, n in sorted(Counter(c.tier for c in sup).items(),
                                                     key=lambda x: tier_order(x[0]))]
    for status, mark in ((UNSUPPORTED, T.UNSUPPORTED_MARK), (UNKNOWN, T.UNKNOWN_MARK)):
        n = sum(c.status == status for c in cs)
        if n:
            evidence.append((mark, n))

    features, not_supported = [], []
    names = sorted({feature_name(t) for c in cs for t in c.case.features} - {"paged_kv"}, key=feature_token_key)
    for name in names:
        with_f = feature_cells(cs, name)
        probed = _per_op_dims(with_f)
        ok = [c for c in with_f if c.status == SUPPORTED]
        if ok:
            features.append(Item(name, tier_mark(strongest(c.tier for c in ok)),
                                 _scope(_per_op_dims(ok), universe, dims_label, probed)))
        # refused (or unknown) where the backend otherwise works: a feature on a head size nothing runs is no news
        for status, mark in ((UNSUPPORTED, T.UNSUPPORTED_MARK), (UNKNOWN, T.UNKNOWN_MARK)):
            bad = [c for c in with_f if c.status == status and _dims(c) in universe.get(c.case.op, ())]
            if bad:
                not_supported.append(Item(name, mark, _scope(_per_op_dims(bad), universe, dims_label, probed,
                                                                  allow_not=False),
                                          legend.reason(_most_common(c.reason for c in bad))))
    if not sup:  # nothing runs here: say why, once per status
        for status, mark in ((UNSUPPORTED, T.UNSUPPORTED_MARK), (UNKNOWN, T.UNKNOWN_MARK)):
            bad = [c for c in cs if c.status == status]
            if bad:
                not_supported.append(Item(f"{len(bad)} cells", mark, "",
                                          legend.reason(_most_common(c.reason for c in bad))))

    def block_sizes(c: ResolvedCell) -> list[int]:
        return [int(t.split(":")[1]) for t in c.case.features if feature_name(t) == "paged_kv"]

    blocks = items(block_sizes, int, str)
    paged = [c for c in cs if block_sizes(c)]
    if not blocks and paged:
        refused = [c for c in paged if c.status == UNSUPPORTED]
        mark = T.UNSUPPORTED_MARK if refused else T.UNKNOWN_MARK
        blocks = [Item("", mark, "", legend.reason(_most_common(c.reason for c in refused or paged)))]
    return CapabilityRow(
        backend=backend, label=str(m.backends.get(backend, {}).get("label", backend)), evidence=evidence, ops=ops,
        dtypes=items(lambda c: [c.case.dtype], DTYPES.index, str),
        head_sizes=items(lambda c: [_dims(c)], dims_key, dims_label),
        features=features, not_supported=not_supported, block_sizes=blocks, cells=len(cs))


# --- per-cell grids ---------------------------------------------------------------------------------

@dataclass
class Grid:
    """One backend's cells on one arch: rows (op, dtype, head size) x columns (probed feature sets)."""

    backend: str
    label: str
    columns: list[str]
    rows: list[tuple[str, list[str]]]  # (row label, cell texts)
    conflicts: list[tuple[str, list[str]]]  # (cell label, conflict texts)
    json_file: str  # path relative to the arch page
    default_source: str | None  # the source set id most cells share; cells show only a different one
    counts: tuple[int, int, int]  # supported, unsupported, unknown
    parts: list[tuple[str, list[str], list[tuple[str, list[str]]]]] = field(default_factory=list)
    # per op: (op, its feature-set columns, rows "dtype head size" -> cell texts): the grid as the page shows it,
    # one table per op, so no op carries another's columns


def cell_text(c: ResolvedCell, legend: Legend, default_source: str | None = None) -> str:
    """A grid cell: the tier mark and latency (ms, 2 significant figures) of a supported cell, or X/? and the
    reason id; then the source set id unless it is `default_source`; † when the cell overruled other evidence."""
    if c.status == SUPPORTED:
        bits = [tier_mark(c.tier)]
        if c.latency_ms is not None:
            bits.append(sig2(c.latency_ms))
    else:
        bits = [T.UNSUPPORTED_MARK if c.status == UNSUPPORTED else T.UNKNOWN_MARK]
        rid = legend.reason(c.reason)
        if rid:
            bits.append(rid)
    sid = legend.source(c.sources)
    if sid and sid != default_source:
        bits.append(sid)
    if c.conflicts:
        bits.append("†")
    return " ".join(bits)


def grid(m: ResolvedMatrix, arch: str, backend: str, cs: Sequence[ResolvedCell], legend: Legend) -> Grid:
    cs = sorted(cs, key=cell_row_key)
    cols = sorted({c.case.features for c in cs}, key=feature_set_key)
    col_idx = {f: i for i, f in enumerate(cols)}
    rows: dict[tuple, list[str]] = {}
    labels: dict[tuple, str] = {}
    conflicts = []
    default_source = _most_common(legend.source(c.sources) for c in cs)
    for c in cs:
        k = c.case
        rk = (OPS.index(k.op), DTYPES.index(k.dtype), dims_key(_dims(c)))
        labels[rk] = f"{k.op} {k.dtype} {dims_label(_dims(c))}"
        rows.setdefault(rk, [""] * len(cols))[col_idx[k.features]] = cell_text(c, legend, default_source)
        if c.conflicts:
            conflicts.append((f"{labels[rk]} {feature_label(k.features)}", list(c.conflicts)))
    parts = []
    for op_index, op in enumerate(OPS):
        keys = sorted(k for k in rows if k[0] == op_index)
        if not keys:
            continue
        used = [i for i in range(len(cols)) if any(rows[k][i] for k in keys)]
        parts.append((op, [feature_label(cols[i]) for i in used],
                      [(labels[k].removeprefix(op + " "), [rows[k][i] for i in used]) for k in keys]))
    return Grid(
        backend=backend, label=str(m.backends.get(backend, {}).get("label", backend)),
        columns=[feature_label(f) for f in cols], rows=[(labels[k], rows[k]) for k in sorted(rows)],
        conflicts=conflicts, json_file=json_link(arch, backend), default_source=default_source,
        counts=tuple(sum(c.status == s for c in cs) for s in (SUPPORTED, UNSUPPORTED, UNKNOWN)),  # type: ignore[arg-type]
        parts=parts)


# --- fastest backend per cell -----------------------------------------------------------------------

@dataclass
class FastestGrid:
    arch: str
    columns: list[str]  # feature set labels
    rows: list[tuple[str, list[str]]]  # (op dtype dims label, [cell text per column])


def fastest_grid(m: ResolvedMatrix, arch: str) -> FastestGrid | None:
    """For each measured (op, dtype, head size) x feature set on `arch`, the first backend in query order
    (generator.tables.query) that has a measured latency, with that latency; None when nothing is measured."""
    measured = [c for c in T.public_cells(m) if c.case.arch == arch and c.latency_ms is not None]
    if not measured:
        return None
    cols = sorted({c.case.features for c in measured}, key=feature_set_key)
    keys = sorted({(c.case.op, c.case.dtype, _dims(c)) for c in measured},
                  key=lambda k: (OPS.index(k[0]), DTYPES.index(k[1]), dims_key(k[2])))
    rows = []
    for op, dtype, dims in keys:
        texts = []
        for f in cols:
            ordered, _ = T.query(m, T.Query(arch, op, dtype, dims[0], dims[1], f))
            best = next((a for a in ordered if a.latency_ms is not None), None)
            texts.append(f"{best.backend} {sig2(best.latency_ms)}" if best else "–")
        rows.append((f"{op} {dtype} {dims_label(dims)}", texts))
    return FastestGrid(arch, [feature_label(f) for f in cols], rows)


# --- coverage ---------------------------------------------------------------------------------------

@dataclass
class Coverage:
    """What was actually run on one arch: cells per deciding tier, timed cells, where and when."""

    arch: str
    title: str
    tiers: list[tuple[str, int]]  # (tier, cells it decided), strongest first, every tier listed
    unknown: int  # cells without informative evidence
    timed: int  # supported cells with a measured latency
    devices: list[str]  # device models that ran the validated cells
    dates: tuple[str, str] | None  # oldest and newest date of the deciding records
    versions: list[str]  # "backend version" of the deciding records, one per backend

    @property
    def headline(self) -> str:
        n = dict(self.tiers)
        if n.get("validated"):
            return f"validated on {', '.join(self.devices) or 'a recorded device'}"
        kinds = [t for t, k in self.tiers if k]
        if not kinds:
            return "no evidence"
        return f"nothing run here: {', '.join(kinds[:-1]) + ' and ' if len(kinds) > 1 else ''}{kinds[-1]} evidence"


def coverage(m: ResolvedMatrix) -> list[Coverage]:
    per: dict[str, list[ResolvedCell]] = defaultdict(list)
    for c in T.public_cells(m):
        per[c.case.arch].append(c)
    out = []
    for arch in sorted(per, key=arch_sort_key):
        cs = per[arch]
        tiers = Counter(c.tier for c in cs if c.status != UNKNOWN and c.tier)
        devices = sorted({str(c.winner.provenance.get("device")) for c in cs
                          if c.winner and c.tier == "validated" and c.winner.provenance.get("device")})
        dates = sorted({str(c.winner.provenance.get("date")) for c in cs
                        if c.winner and c.winner.provenance.get("date")})
        versions: dict[str, set[str]] = defaultdict(set)
        for c in cs:
            if c.kernel_version and c.tier in ("validated", "compiled", "shipped"):
                versions[c.case.backend].add(c.kernel_version)
        out.append(Coverage(
            arch, arch_title(arch), [(t, tiers.get(t, 0)) for t in T.TIERS], sum(c.status == UNKNOWN for c in cs),
            sum(c.latency_ms is not None for c in cs), devices, (dates[0], dates[-1]) if dates else None,
            [f"{b} {', '.join(sorted(vs))}" for b, vs in sorted(versions.items(),
                                                                 key=lambda kv: T.backend_order_key(m, kv[0]))]))
    return out


# --- the arch page ----------------------------------------------------------------------------------

@dataclass
class ArchPage:
    arch: str
    title: str
    capabilities: list[CapabilityRow]
    fastest: FastestGrid | None
    grids: list[Grid]
    decisions: list[DecisionTable]
    reasons: list[tuple[str, str, list[str], int]]  # (id, preview, backends, cells), in order of first use
    sources: list[tuple[str, list[str], int]]  # (id, source strings, cells), in order of first use


def arch_title(arch: str) -> str:
    """The page's title, with the GPU product names a reader searches for: "sm_100 — B200 / GB200"."""
    return load_gpus().title(arch)


def arch_capability(arch: str) -> str:
    label = capability_label(arch)
    return f"compute capability {label}" if label != arch else ""


def arch_pages(m: ResolvedMatrix, layers=DECISION_LAYERS) -> list[ArchPage]:
    pages = []
    per = cells_by_arch_backend(m)
    for arch in sorted(per, key=arch_sort_key):
        backends = sorted(per[arch], key=lambda b: T.backend_order_key(m, b, arch))
        legend = arch_legend([c for b in backends for c in per[arch][b]])
        caps = [capability_row(m, b, per[arch][b], legend) for b in backends]
        grids = [grid(m, arch, b, per[arch][b], legend) for b in backends]
        used: dict[str, int] = {}
        reasons: dict[str, tuple[list[str], list[int]]] = {}
        for b in backends:
            for c in sorted(per[arch][b], key=cell_row_key):
                sid = legend.source(c.sources)
                if sid:
                    used[sid] = used.get(sid, 0) + 1
                rid = legend.reason(c.reason) if c.status != SUPPORTED else None
                if rid:
                    bs, n = reasons.setdefault(rid, ([], [0]))
                    if b not in bs:
                        bs.append(b)
                    n[0] += 1
        pages.append(ArchPage(
            arch, arch_title(arch), caps, fastest_grid(m, arch), grids, decision_tables(m, arch, layers),
            [(rid, preview(legend.reasons[rid]), bs, n[0]) for rid, (bs, n) in reasons.items()],
            [(sid, legend.sources[sid], n) for sid, n in used.items()]))
    return pages
