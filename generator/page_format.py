"""How the docs pages write what they show: a measurement, a tier mark, a feature set, a head size, a grid row's
order, and the ids of reasons and source sets (`Legend`) that a page lists once instead of per cell.

Stability: reason and source ids are derived from their text (a short hash), so one new record changes the
grid row and legend line it touches, not every id after it.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from attnmatrix.matrix.policy import ResolvedCell

from attnmatrix.vocabulary import DTYPES, FEATURES, OPS, TIERS

from . import tables as T

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
    return (TIERS.index(tier), "") if tier in TIERS else (len(TIERS), tier or "")


def strongest(tiers: Iterable[str | None]) -> str | None:
    ts = [t for t in tiers if t]
    return min(ts, key=tier_order) if ts else None


def feature_token_key(token: str) -> tuple:
    """Features in the case space's order, a parameter numerically (paged_kv:16 < paged_kv:64 < paged_kv:128)."""
    name, _, arg = token.partition(":")
    idx = FEATURES.index(name) if name in FEATURES else len(FEATURES)
    return (idx, name, int(arg) if arg.isdigit() else -1, arg)


@functools.lru_cache(maxsize=4096)  # a page sorts every cell by its feature set: a few hundred distinct sets
def feature_set_key(features: tuple[str, ...]) -> tuple:
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
