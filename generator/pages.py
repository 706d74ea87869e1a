"""The docs pages' tables for people: per-arch capability summaries, compact per-cell grids, the per-cell JSON.

What a reader of an arch page asks first is "which backends run here, for which head sizes, dtypes, ops and
features, and how sure are we": `capability_rows` answers that per backend, compressed the way xformers and
vLLM declare capabilities (a list of supported head sizes, the ops and features, each with the strongest
evidence tier behind it and, where it does not hold everywhere, where it holds). The per-cell detail follows as
one grid per backend (rows: op, dtype, head size; columns: probed feature sets), where a cell is its tier mark
plus its latency, or a reason id; reasons and sources are listed once per page, not per cell. The full
per-cell data (verbatim reasons, errors, every source) is a JSON file per (arch, backend) next to the pages.

Nothing here decides support or order: statuses come from the resolved matrix, and "which backend is fastest"
is answered by `generator.tables.query` (the one query path the CLI and selector share).

Stability: reason and source ids are derived from their text (a short hash), so one new record changes the
grid row and legend line it touches, not every id after it.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from attnmatrix.matrix.cases import page_size
from attnmatrix.matrix.policy import ResolvedCell, ResolvedMatrix

from attnmatrix.vocabulary import (
    DTYPES,
    FEATURE_INFO,
    FEATURES,
    MASK_FEATURES,
    OPS,
    SUPPORTED,
    UNKNOWN,
    UNSUPPORTED,
    arch_sort_key,
    feature_name,
)

from . import tables as T
from .gpus import load_gpus

CELLS_DIR = "site/data"  # the per-cell JSON files: site/data/<arch>/<backend>.json
CELLS_SCHEMA = "attnmatrix.cells/3"
REASON_PREVIEW = 240  # characters of a reason shown on a page; the JSON keeps the whole text
UNKNOWN_TIER_MARK = "?"


# --- formatting -------------------------------------------------------------------------------------

def sig2(x: float | None) -> str:
    """A measurement to 2 significant figures, never in exponent form: reruns of a timed cell vary by about
    ±10%, so a third digit would be noise (0.33715 -> "0.34", 7.47562 -> "7.5", 30.7 -> "31", 1234 -> "1200")."""
    if x is None:
        return ""
    if not math.isfinite(x):
        raise ValueError(f"{x!r} is not a finite measurement")
    if x == 0:
        return "0"
    mantissa, exp = f"{x:.1e}".split("e")  # correctly rounded to 2 significant figures
    e = int(exp)
    return f"{float(mantissa + 'e' + exp):.{max(0, 1 - e)}f}"


def tier_mark(tier: str | None) -> str:
    """The tier's mark as on the support matrix; a tier the pages have no mark for shows its name."""
    if tier in T.TIER_MARK:
        return T.TIER_MARK[tier]
    return f"{UNKNOWN_TIER_MARK} {tier}" if tier else T.UNKNOWN_MARK


def tier_order(tier: str | None) -> tuple:
    return (T.TIERS.index(tier), "") if tier in T.TIERS else (len(T.TIERS), tier or "")


def strongest(tiers: Iterable[str | None]) -> str | None:
    ts = [t for t in tiers if t]
    return min(ts, key=tier_order) if ts else None


def feature_token_key(token: str) -> tuple:
    """Features in the case space's order, a parameter numerically (paged_kv:16 < paged_kv:64 < paged_kv:128)."""
    name, _, arg = token.partition(":")
    idx = FEATURES.index(name) if name in FEATURES else len(FEATURES)
    return (idx, name, int(arg) if arg.isdigit() else -1, arg)


def feature_set_key(features: Sequence[str]) -> tuple:
    """Natural order of feature sets: fewer features first, then token by token (feature_token_key)."""
    return (len(features), tuple(feature_token_key(t) for t in sorted(features, key=feature_token_key)))


def feature_label(features: Sequence[str]) -> str:
    return " + ".join(sorted(features, key=feature_token_key)) or "none"


def dims_key(dims: tuple[int, int]) -> tuple:
    """Head sizes numerically, D×Dv pairs after the square ones."""
    return (dims[0] != dims[1], dims[0], dims[1])


def dims_label(dims: tuple[int, int]) -> str:
    return str(dims[0]) if dims[0] == dims[1] else f"{dims[0]}×{dims[1]}"


def cell_row_key(c: ResolvedCell) -> tuple:
    k = c.case
    return (OPS.index(k.op), DTYPES.index(k.dtype), dims_key((k.head_dim, k.head_dim_v)), feature_set_key(k.features))


def short_id(prefix: str, text: str, taken: dict[str, str]) -> str:
    """A stable id for `text` (a reason, a source set): `prefix` + the shortest sha1 prefix (>= 3 hex digits)
    no other text in `taken` (id -> text) has. Deterministic when texts are offered in a fixed order."""
    digest = hashlib.sha1(text.encode("utf-8")).hexdigest()
    for n in range(3, len(digest) + 1):
        cand = prefix + digest[:n]
        if taken.get(cand, text) == text:
            taken[cand] = text
            return cand
    raise AssertionError("sha1 collision")


def preview(text: str, limit: int = REASON_PREVIEW) -> str:
    """One line of at most `limit` characters: whitespace runs folded, the rest cut with an ellipsis."""
    s = " ".join(text.split())
    return s if len(s) <= limit else s[: limit - 1].rstrip() + "…"


# --- ids for reasons and sources --------------------------------------------------------------------

@dataclass
class Legend:
    """Reasons and source sets of one arch page, each once, with stable ids."""

    reasons: dict[str, str] = field(default_factory=dict)  # id -> full text
    sources: dict[str, list[str]] = field(default_factory=dict)  # id -> the source strings of a cell
    _reason_ids: dict[str, str] = field(default_factory=dict)
    _source_ids: dict[tuple[str, ...], str] = field(default_factory=dict)
    _taken: dict[str, str] = field(default_factory=dict)

    def reason(self, text: str | None) -> str | None:
        if not text:
            return None
        if text not in self._reason_ids:
            rid = short_id("r", text, self._taken)
            self._reason_ids[text] = rid
            self.reasons[rid] = text
        return self._reason_ids[text]

    def source(self, sources: Sequence[str]) -> str | None:
        key = tuple(sources)
        if not key:
            return None
        if key not in self._source_ids:
            sid = short_id("s", "\n".join(key), self._taken)
            self._source_ids[key] = sid
            self.sources[sid] = list(key)
        return self._source_ids[key]


def arch_legend(cells: Sequence[ResolvedCell]) -> Legend:
    """Ids for every reason and source set of these cells, assigned in sorted text order (deterministic)."""
    lg = Legend()
    for text in sorted({c.reason for c in cells if c.reason}):
        lg.reason(text)
    for srcs in sorted({tuple(c.sources) for c in cells if c.sources}):
        lg.source(srcs)
    return lg


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


# --- the support matrix's backend rows (every arch at once) -----------------------------------------

@dataclass(frozen=True)
class Claim:
    """One item of a support-matrix column (a dtype, a head size, a block size, or a whole feature)."""

    label: str
    mark: str
    archs: tuple[str, ...]  # where it holds; empty when it holds on all of the backend's archs


@dataclass
class BackendRow:
    backend: str
    label: str
    library: str
    versions: list[str]
    ops: list[str]
    dtypes: list[Claim]
    head_sizes: list[Claim]
    features: dict[str, list[Claim]]  # column -> claims grouped by mark
    block_sizes: list[Claim]
    archs: list[Claim]  # label = arch, mark = strongest tier of its supported cells


def _item_claims(cells: list[ResolvedCell], item_of, sort_key, all_archs: list[str]) -> list[Claim]:
    """Supported items (with the strongest tier of their supported cells), each with the archs where they hold
    (omitted when that is every arch the backend supports anything on)."""
    per: dict = defaultdict(lambda: defaultdict(list))
    for c in cells:
        if c.status == SUPPORTED:
            for item in item_of(c):
                per[item][c.case.arch].append(c.tier)
    out = []
    for item in sorted(per, key=sort_key):
        archs = sorted(per[item], key=arch_sort_key)
        mark = tier_mark(strongest(t for a in archs for t in per[item][a]))
        out.append(Claim(item if isinstance(item, str) else dims_label(item), mark,
                         () if archs == all_archs else tuple(archs)))
    return out


def _feature_claims(cells: list[ResolvedCell], feature: str, archs: list[str]) -> list[Claim]:
    """A feature column: per arch, the strongest tier of a supported cell with the feature, else X if one was
    unsupported, else ? if only unknown; archs without any such cell are left out. Grouped by mark."""
    by_arch: dict[str, list[ResolvedCell]] = defaultdict(list)
    for c in cells:
        if any(feature_name(t) == feature for t in c.case.features):
            by_arch[c.case.arch].append(c)
    marks: dict[str, str] = {}
    for a, cs in by_arch.items():
        sup = [c.tier for c in cs if c.status == SUPPORTED]
        if sup:
            marks[a] = tier_mark(strongest(sup))
        elif any(c.status == UNSUPPORTED for c in cs):
            marks[a] = T.UNSUPPORTED_MARK
        else:
            marks[a] = T.UNKNOWN_MARK
    if not marks:
        return [Claim("", T.UNKNOWN_MARK, ())]
    order = [T.TIER_MARK[t] for t in T.TIERS] + [T.UNSUPPORTED_MARK, T.UNKNOWN_MARK]
    groups = []
    for mk in order:
        got = sorted((a for a, x in marks.items() if x == mk), key=arch_sort_key)
        if got:
            groups.append(Claim("", mk, tuple(got)))
    if len(groups) == 1 and set(groups[0].archs) == set(archs):
        groups = [Claim("", groups[0].mark, ())]  # the same on every arch the backend has evidence for
    return groups


# The support table's feature columns: the vocabulary's features that name one.
FEATURE_COLUMNS = [(f.column, f.name) for f in FEATURE_INFO if f.column]


def backend_rows(m: ResolvedMatrix, kernel_versions: dict[str, list[str]]) -> list[BackendRow]:
    cells = T.public_cells(m)
    by_backend: dict[str, list[ResolvedCell]] = defaultdict(list)
    for c in cells:
        by_backend[c.case.backend].append(c)
    out = []
    for b in sorted(by_backend, key=lambda b: T.backend_order_key(m, b)):
        cs = by_backend[b]
        meta = m.backends.get(b, {})
        sup_archs = sorted({c.case.arch for c in cs if c.status == SUPPORTED}, key=arch_sort_key)
        all_archs = sorted({c.case.arch for c in cs}, key=arch_sort_key)
        versions = list(kernel_versions.get(b) or sorted({c.kernel_version for c in cs if c.kernel_version}))
        arch_claims = [Claim(a, tier_mark(strongest(c.tier for c in cs if c.case.arch == a and c.status == SUPPORTED)),
                             ()) for a in sup_archs]
        blocks = _item_claims(cs, lambda c: [str(p)] if (p := page_size(c.case.features)) else [], int, sup_archs)
        if not blocks:
            paged = any(page_size(c.case.features) for c in cs)
            blocks = [Claim("", T.UNSUPPORTED_MARK if paged else T.UNKNOWN_MARK, ())]
        out.append(BackendRow(
            backend=b, label=str(meta.get("label", b)), library=str(meta.get("library", "")), versions=versions,
            ops=[o for o in OPS if any(c.case.op == o and c.status == SUPPORTED for c in cs)],
            dtypes=_item_claims(cs, lambda c: [c.case.dtype], DTYPES.index, sup_archs),
            head_sizes=_item_claims(cs, lambda c: [(c.case.head_dim, c.case.head_dim_v)],
                                    lambda d: (d[0] != d[1], d), sup_archs),
            features={col: _feature_claims(cs, f, all_archs) for col, f in FEATURE_COLUMNS},
            block_sizes=blocks,
            archs=arch_claims,
        ))
    return out



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


# --- decision tables --------------------------------------------------------------------------------

# Without model presets, the layer types engines ask about most: full causal attention, sliding-window layers,
# Gemma 2's softcap, gpt-oss's banded layers with sinks; prefill and decode.
DECISION_LAYERS: tuple[tuple[str, str, tuple[str, ...]], ...] = tuple(
    (f"{op}, {label}", op, feats) for op in ("prefill", "decode") for label, feats in (
        ("causal", ("causal",)), ("sliding window", ("causal", "sliding_window")), ("softcap", ("causal", "softcap")),
        ("sliding window + sinks", ("causal", "sinks", "sliding_window"))))


def decision_layers(presets: Sequence[dict]) -> tuple[tuple[str, str, tuple[str, ...]], ...]:
    """The decision tables' columns: the model presets' layer types (op and feature set, MLA aside), most
    common first; DECISION_LAYERS when there are no presets."""
    counted = Counter((q["op"], tuple(q["features"])) for p in presets for q in p["queries"]
                      if q["op"] in ("prefill", "decode"))
    if not counted:
        return DECISION_LAYERS
    order = sorted(counted, key=lambda k: (OPS.index(k[0]), -counted[k], feature_set_key(k[1])))
    return tuple((f"{op}, {' + '.join(t for t in feats if t != 'causal') or 'causal'}", op, feats)
                 for op, feats in order)


DECISION_DTYPE = "bfloat16"


@dataclass
class DecisionTable:
    op: str
    columns: list[str]
    rows: list[tuple[str, list[str]]]  # (head size, ["backend mark basis" or "none known"])
    query_links: list[list[str]]  # per row and column: the query page's address for that question


def decision_dims(m: ResolvedMatrix, arch: str) -> list[int]:
    """The square head sizes probed for prefill on `arch`, ascending."""
    return sorted({c.case.head_dim for c in T.public_cells(m) if c.case.arch == arch and c.case.op == "prefill"
                   and c.case.head_dim == c.case.head_dim_v})


QueryKey = tuple[str, str, str, int, int, tuple[str, ...]]  # arch, op, dtype, head_dim, head_dim_v, features


def decision_queries(m: ResolvedMatrix, layers=DECISION_LAYERS) -> list[QueryKey]:
    """Every decision table's queries as (arch, op, dtype, hd, hdv, features): the query page publishes them."""
    archs = sorted({c.case.arch for c in T.public_cells(m)}, key=arch_sort_key)
    return [(a, op, DECISION_DTYPE, hd, hd, feats) for a in archs for hd in decision_dims(m, a)
            for _, op, feats in layers]


def _basis_short(a: T.Answer) -> str:
    if a.latency_ms is not None:
        return f"{sig2(a.latency_ms)} ms"
    if "declared ranking" in a.basis:
        return "declared ranking"
    return "default rank"


def decision_tables(m: ResolvedMatrix, arch: str, layers=DECISION_LAYERS) -> list[DecisionTable]:
    """Per op, head size x layer type -> the selector's first choice, its tier mark and what put it first."""
    dims = decision_dims(m, arch)
    out = []
    for op in OPS:
        cols = [(label, feats) for label, o, feats in layers if o == op]
        if not dims or not cols:
            continue
        rows, links = [], []
        for hd in dims:
            texts, row_links = [], []
            for _, feats in cols:
                ordered, _ = T.query(m, T.Query(arch, op, DECISION_DTYPE, hd, hd, feats))
                if ordered:
                    a = ordered[0]
                    more = f" (+{len(ordered) - 1})" if len(ordered) > 1 else ""
                    texts.append(f"{a.backend} {tier_mark(a.tier)} {_basis_short(a)}{more}")
                else:
                    texts.append("none known")
                row_links.append("query.md#" + "&".join(
                    [f"gpu={arch}", f"op={op}", f"dtype={DECISION_DTYPE}", f"hd={hd}", "f=" + "%2C".join(feats)]))
            rows.append((str(hd), texts))
            links.append(row_links)
        out.append(DecisionTable(op, [label.split(", ", 1)[1] for label, _ in cols], rows, links))
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
    if arch.startswith("sm_") and arch[3:].isdigit():
        n = arch[3:]
        return f"compute capability {n[:-1]}.{n[-1]}"
    return ""


def _by_arch_backend(m: ResolvedMatrix) -> dict[str, dict[str, list[ResolvedCell]]]:
    out: dict[str, dict[str, list[ResolvedCell]]] = defaultdict(lambda: defaultdict(list))
    for c in T.public_cells(m):
        out[c.case.arch][c.case.backend].append(c)
    return out


def arch_pages(m: ResolvedMatrix, layers=DECISION_LAYERS) -> list[ArchPage]:
    pages = []
    per = _by_arch_backend(m)
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


# --- the per-cell JSON ------------------------------------------------------------------------------

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
    for arch, per in _by_arch_backend(m).items():
        legend = arch_legend([c for cs in per.values() for c in cs])
        for backend, cs in per.items():
            out[f"{CELLS_DIR}/{arch}/{backend}.json"] = cells_json(m, arch, backend, cs, legend)
    return dict(sorted(out.items()))


def json_link(arch: str, backend: str) -> str:
    """The per-cell JSON of (arch, backend), relative to the arch page (site/archs/<arch>.md)."""
    return f"../{CELLS_DIR.removeprefix('site/')}/{arch}/{backend}.json"
