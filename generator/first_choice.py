"""Which query classes' first choice changed between two matrices (`attnmatrix diff --first-choice`).

Every single-cell query that either matrix holds a measurement for (arch, op, dtype, head sizes, feature set) is
asked of both through the query engine (`attnmatrix.selector_engine`) over each matrix's engine data, the data the
generated selector ships. Counted: classes whose first choice changed, by (before -> after) backend pair, and how
each first choice was decided (measured latency, or an order without a measurement: a declared ranking or the
default rank).
"""

from __future__ import annotations

from collections import Counter

from attnmatrix.selector_engine import Engine, fset_label
from attnmatrix.vocabulary import arch_sort_key


def _first(engine: Engine, arch: str, cls: tuple) -> tuple[str, float | None] | None:
    op, dtype, hd, hdv, feats = cls
    supported = engine.query(arch, op, dtype, hd, hdv, feats)[0]
    return (supported[0].backend, supported[0].latency_ms) if supported else None


def first_choice_shift(before: dict, after: dict, arch: str) -> dict:
    """The first-choice changes on `arch` between two engine datas (generator.capabilities.engine_data)."""
    old, new = Engine(before), Engine(after)
    classes = set(before["measured"].get(arch, {})) | set(after["measured"].get(arch, {}))
    changed, how, pairs, compared = [], Counter(), Counter(), 0
    for cls in sorted(classes, key=lambda c: (c[:4], len(c[4]), c[4])):
        a, b = _first(old, arch, cls), _first(new, arch, cls)
        if a is None or b is None:
            continue
        compared += 1
        how[tuple("measured" if x[1] is not None else "unmeasured" for x in (a, b))] += 1
        if a[0] != b[0]:
            pairs[(a[0], b[0])] += 1
            op, dtype, hd, hdv, feats = cls
            changed.append({"arch": arch, "op": op, "dtype": dtype, "head_dim": hd, "head_dim_v": hdv,
                            "features": fset_label(feats), "before": {"backend": a[0], "latency_ms": a[1]},
                            "after": {"backend": b[0], "latency_ms": b[1]}})
    return {"arch": arch, "classes_compared": compared, "first_choice_changed": len(changed),
            "changed_by_dtype": dict(sorted(Counter(c["dtype"] for c in changed).items())),
            "decided_by": {f"{x} -> {y}": n for (x, y), n in sorted(how.items())},
            "changed_pairs": {f"{x} -> {y}": n for (x, y), n in pairs.most_common()},
            "changed": changed}


def shifts(before: dict, after: dict) -> list[dict]:
    """`first_choice_shift` for every arch either side measured, in arch order."""
    archs = set(before["measured"]) | set(after["measured"])
    return [first_choice_shift(before, after, a) for a in sorted(archs, key=arch_sort_key)]
