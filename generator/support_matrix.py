"""The support matrix's backend rows: per backend, every arch at once, what it supports (dtypes, head sizes,
block sizes, each feature column) with the strongest evidence tier behind it and the archs where it holds.

Nothing here decides support: statuses and tiers come from the resolved matrix.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from attnmatrix.matrix.cases import page_size
from attnmatrix.matrix.policy import ResolvedCell, ResolvedMatrix

from attnmatrix.vocabulary import DTYPES, FEATURE_INFO, OPS, SUPPORTED, UNSUPPORTED, arch_sort_key, feature_name

from . import tables as T
from .page_format import dims_label, strongest, tier_mark


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
