"""Counts and times read from records: what a matrix or a set of result files holds, and where a sweep's time went.

The pure part of `attnmatrix stats` (attnmatrix/cli/stats.py). Each section is a function of records (or of a
resolved matrix) that returns JSON values in a fixed order; the command prints them as tables or one JSON object.

- `cells` (`cell_counts`): per (arch, backend), the resolved cells by status and by the tier of the record that
  decided each.
- `files` (`file_counts`): per result file, its records by tier and by outcome.
- `time` (`sweep_time`): per backend, where a sweep's worker time went, from each record's `extra.seconds`
  (kernels/probe.py): first calls (a JIT compile, or a load from a compile cache), checks against the reference,
  and the timing phase (drawing the timed shapes' inputs, and the wait for the GPU's timing lock, which concurrent
  workers share: `gpu_lock_wait_s`, part of `timing_s`). A first call over `SLOW_FIRST_CALL_S` is counted as
  slow: for FA4, FlashInfer and XQA that is a compile (a kernel loaded from their caches returns in
  milliseconds); for FA2 and SDPA, which compile nothing at run time, it is CUDA's lazy module loading on a busy
  machine. Sums are over workers: with W workers a sweep's wall time is at least the largest sum divided by W.
  Records without seconds (refusals, and records written before seconds were kept) are counted as
  `without_seconds`. Also the backend's best TFLOP/s, with the bf16 matmul peak the same run recorded
  (`provenance.matmul_peak_tflops`).
- `compile` (`compile_counts`): per (compile target, backend), the cross-compile records (tier `compiled`):
  outcomes, kernels built (`extra.kernels`: 0 where the same worker had built that kernel before), wall and CPU
  seconds per compile (`extra.compile_s`, `extra.compile_cpu_s`; wall includes waiting for a CPU on a shared
  machine, so CPU seconds measure the compile itself), and outcomes per head dims.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence

from attnmatrix.vocabulary import STATUSES, TIERS, arch_sort_key

from .policy import ResolvedMatrix
from .records import Record

SECTIONS: tuple[str, ...] = ("cells", "files", "time", "compile")
SLOW_FIRST_CALL_S = 1.0
PHASES = ("first_call", "check", "timing", "gpu_lock_wait")  # the keys of a record's extra.seconds


def _r(x: float, digits: int = 1) -> float:
    return round(x, digits)


def _spread(xs: Sequence[float], *keys: str) -> dict:
    """{"cases": n, and each of min/median/max/sum asked for}, rounded; None figures for no values."""
    fns = {"min": min, "median": statistics.median, "max": max, "sum": sum}
    return {"cases": len(xs), **{k: (_r(fns[k](xs), 2) if xs else None) for k in keys}}


# --- cells -------------------------------------------------------------------------------------------------------


def cell_counts(m: ResolvedMatrix) -> list[dict]:
    """One row per (arch, backend): its cells, by status and by the deciding record's tier, in arch order."""
    acc: dict[tuple[str, str], dict[str, Counter]] = defaultdict(lambda: {"status": Counter(), "tier": Counter()})
    for cell in m.cells.values():
        a = acc[(cell.case.arch, cell.case.backend)]
        a["status"][cell.status] += 1
        a["tier"][cell.tier or "none"] += 1
    rows = []
    for (arch, backend), a in sorted(acc.items(), key=lambda kv: (arch_sort_key(kv[0][0]), kv[0][1])):
        rows.append({"arch": arch, "backend": backend, "cells": sum(a["status"].values()),
                     "status": {s: a["status"][s] for s in STATUSES},
                     "tier": {t: a["tier"][t] for t in (*TIERS, "none") if t in TIERS or a["tier"][t]}})
    return rows


# --- files -------------------------------------------------------------------------------------------------------


def source_file(where: str) -> str:
    """The file of an Evidence.where entry: "path:line" or "path#fact-id" -> path."""
    if "#" in where:
        return where.rsplit("#", 1)[0]
    head, _, line = where.rpartition(":")
    return head if head and line.isdigit() else where


def file_counts(records: Sequence[Record], where: Sequence[str],
                name: Callable[[str], str] = str) -> list[dict]:
    """One row per file the records came from (Evidence.where), in order of the names shown: records by tier and
    outcome. `name` turns a path into the name shown (e.g. relative to the checkout)."""
    acc: dict[str, dict[str, Counter]] = defaultdict(lambda: {"tier": Counter(), "outcome": Counter()})
    for rec, w in zip(records, where, strict=True):
        a = acc[source_file(w)]
        a["tier"][rec.tier] += 1
        a["outcome"][rec.outcome] += 1
    rows = [{"file": name(f), "records": sum(a["tier"].values()),
             "tier": dict(sorted(a["tier"].items(), key=lambda kv: TIERS.index(kv[0]))),
             "outcome": dict(sorted(a["outcome"].items()))} for f, a in acc.items()]
    return sorted(rows, key=lambda row: row["file"])


# --- time --------------------------------------------------------------------------------------------------------


def _cell_name(rec: Record) -> str:
    c = rec.case
    return f"{c.op} {c.dtype} {c.head_dim}x{c.head_dim_v} {'+'.join(c.features) or 'none'}"


def sweep_time(records: Iterable[Record]) -> dict[str, dict]:
    """Per backend (sorted): where its sweeps' worker time went, and its best TFLOP/s (module docstring)."""
    acc: dict[str, dict] = defaultdict(lambda: {"records": 0, "without_seconds": 0, "seconds": Counter(),
                                                "slow": defaultdict(list), "timing": defaultdict(list),
                                                "best": None})
    for rec in records:
        a = acc[rec.case.backend]
        a["records"] += 1
        _keep_best(a, rec)
        secs = (rec.extra or {}).get("seconds")
        if not isinstance(secs, dict) or not secs:
            a["without_seconds"] += 1
            continue
        for phase in PHASES:
            a["seconds"][phase] += float(secs.get(phase, 0.0))
        first = float(secs.get("first_call", 0.0))
        if first > SLOW_FIRST_CALL_S:
            a["slow"][rec.case.op].append(first)
        if "timing" in secs:
            a["timing"][rec.case.op].append(float(secs["timing"]))
    out = {}
    for backend, a in sorted(acc.items()):
        slow = [s for by_op in a["slow"].values() for s in by_op]
        out[backend] = {
            "records": a["records"], "without_seconds": a["without_seconds"],
            **{f"{p}_s": _r(a["seconds"][p]) for p in PHASES},
            "slow_first_calls": len(slow), "slow_first_call_s": _r(sum(slow)),
            "median_slow_first_call_s": _r(statistics.median(slow)) if slow else None,
            "timing_s_per_case": {op: _spread(v, "median", "max") for op, v in sorted(a["timing"].items())},
            "slow_first_call_s_per_case": {op: _spread(v, "min", "median", "max")
                                           for op, v in sorted(a["slow"].items())},
            "best_tflops": a["best"],
        }
    return out


def _keep_best(a: dict, rec: Record) -> None:
    """Keep the record's fastest timed shape if it beats the backend's best so far."""
    try:  # kept as a string in provenance, like every provenance value
        peak: float | None = float((rec.provenance or {})["matmul_peak_tflops"])
    except (KeyError, TypeError, ValueError):
        peak = None
    for t in rec.timings:
        if t.tflops is not None and (a["best"] is None or t.tflops > a["best"]["tflops"]):
            a["best"] = {"tflops": t.tflops, "shape": t.shape, "cell": _cell_name(rec), "arch": rec.case.arch,
                         "peak_tflops": peak, "fraction_of_peak": round(t.tflops / peak, 2) if peak else None}


# --- compile -----------------------------------------------------------------------------------------------------


def _head_dims_key(hd: str) -> list[int]:
    return [int(x) for x in hd.split("x")]


def compile_counts(records: Iterable[Record]) -> list[dict]:
    """One row per (compile target, backend) of the cross-compile records (tier `compiled`), sorted."""
    acc: dict[tuple[str, str], dict] = {}
    for rec in records:
        if rec.tier != "compiled":
            continue
        c, prov, ex = rec.case, rec.provenance or {}, rec.extra or {}
        key = (str(prov.get("target", c.arch)), c.backend)
        a = acc.setdefault(key, {"library": f"{prov.get('library')} {rec.kernel_version}",
                                 "cutlass_dsl": prov.get("cutlass_dsl"), "outcome": Counter(), "wall": [],
                                 "cpu": [], "kernels": 0, "by_head_dims": defaultdict(Counter)})
        a["outcome"][rec.outcome] += 1
        a["by_head_dims"][f"{c.head_dim}x{c.head_dim_v}"][rec.outcome] += 1
        if rec.outcome == "compiled" and isinstance(ex.get("compile_s"), (int, float)):
            a["wall"].append(float(ex["compile_s"]))
            a["cpu"].append(float(ex.get("compile_cpu_s", 0.0)))
            a["kernels"] += ex["kernels"] if isinstance(ex.get("kernels"), int) else 0
    rows = []
    for (target, backend), a in sorted(acc.items(), key=lambda kv: (arch_sort_key(kv[0][0]), kv[0])):
        rows.append({"target": target, "backend": backend, "library": a["library"], "cutlass_dsl": a["cutlass_dsl"],
                     "outcome": dict(sorted(a["outcome"].items())), "kernels_built": a["kernels"],
                     "compile_wall_s": _spread(a["wall"], "sum", "median", "max"),
                     "compile_cpu_s": _spread(a["cpu"], "sum", "median", "max"),
                     "by_head_dims": {hd: dict(sorted(v.items()))
                                      for hd, v in sorted(a["by_head_dims"].items(),
                                                          key=lambda kv: _head_dims_key(kv[0]))}})
    return rows
