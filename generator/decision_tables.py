"""The arch pages' decision tables: per op, head size x layer type -> the selector's first choice, its tier mark
and what put it first; and the queries behind them, which the query page publishes.

The order is not decided here: every answer comes from `generator.tables.query` (the one query path the CLI and
the selector share).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from attnmatrix.matrix.policy import ResolvedMatrix

from attnmatrix.vocabulary import OPS, arch_sort_key

from . import tables as T
from .page_format import feature_set_key, sig2, tier_mark

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
