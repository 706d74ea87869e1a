"""Which cells' first choice changed between two generated selectors (e.g. before and after a re-time).

    git show REV:attnmatrix/selector.py > /tmp/before_selector.py
    python benchmarks/ranking_shift.py /tmp/before_selector.py attnmatrix/selector.py [--arch sm_90] [--json OUT]

Every single-cell query that either selector holds a measurement for (op, dtype, head dims, feature set)
is asked of both, through the same query engine the selector ships (`attnmatrix/selector_engine.py`).
Counted: cells whose first choice changed, by (before -> after) backend pair, and how each first choice
was decided (measured GPU time, or a default rank where nothing was timed, as float16 was before it
was timed). Prints a summary; `--json` writes every changed cell with both latencies.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from collections import Counter
from pathlib import Path

from attnmatrix.selector_engine import Engine


def load_data(path: str) -> dict:
    # Loaded as a module of the attnmatrix package: the selector imports its engine relatively.
    spec = importlib.util.spec_from_file_location(f"attnmatrix._selector_{abs(hash(path))}", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"{path}: not a Python file")
    mod = importlib.util.module_from_spec(spec)
    mod.__package__ = "attnmatrix"
    spec.loader.exec_module(mod)
    return mod.DATA


def first_choice(engine: Engine, arch: str, key: tuple, fset: str) -> tuple[str, float | None] | None:
    op, dtype, hd, hdv = key
    feats = () if fset == "none" else tuple(fset.split("+"))
    supported, _, _ = engine.query(arch, op, dtype, hd, hdv, feats)
    return (supported[0].backend, supported[0].latency_ms) if supported else None


def shift(before: dict, after: dict, arch: str) -> dict:
    old, new = Engine(before), Engine(after)
    cells = set()
    for data in (before, after):
        for key, rows in data["measured"].get(arch, {}).items():
            cells.update((key, fset) for fset in rows)
    changed, how = [], Counter()
    pairs: Counter = Counter()
    compared = 0
    for key, fset in sorted(cells):
        a, b = first_choice(old, arch, key, fset), first_choice(new, arch, key, fset)
        if a is None or b is None:
            continue
        compared += 1
        how[tuple("measured" if x[1] is not None else "default rank" for x in (a, b))] += 1
        if a[0] != b[0]:
            pairs[(a[0], b[0])] += 1
            op, dtype, hd, hdv = key
            changed.append({"op": op, "dtype": dtype, "head_dim": hd, "head_dim_v": hdv, "features": fset,
                            "before": {"backend": a[0], "latency_ms": a[1]},
                            "after": {"backend": b[0], "latency_ms": b[1]}})
    by_dtype = Counter(c["dtype"] for c in changed)
    return {"arch": arch, "cells_compared": compared, "first_choice_changed": len(changed),
            "changed_by_dtype": dict(sorted(by_dtype.items())),
            "decided_by": {f"{x} -> {y}": n for (x, y), n in sorted(how.items())},
            "changed_pairs": {f"{x} -> {y}": n for (x, y), n in pairs.most_common()},
            "changed": changed}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("before", help="a generated selector module (attnmatrix/selector.py of some revision)")
    ap.add_argument("after", help="another one")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--json", dest="json_out", help="write the full result here")
    args = ap.parse_args(argv)
    out = shift(load_data(args.before), load_data(args.after), args.arch)
    summary = {k: v for k, v in out.items() if k != "changed"}
    print(json.dumps(summary, indent=1))
    for c in out["changed"][:15]:
        b, a = c["before"], c["after"]
        print(f"  {c['op']} {c['dtype']} {c['head_dim']}x{c['head_dim_v']} {c['features']}: "
              f"{b['backend']} ({b['latency_ms']}) -> {a['backend']} ({a['latency_ms']})")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(out, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
