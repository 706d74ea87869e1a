"""Compile counts and times of cross-compile records (tier `compiled`), per target and backend.

usage: python benchmarks/xcompile_stats.py RESULTS.jsonl [...] [--json]

For each (target, backend): records by outcome; the compiled cases' wall seconds (`extra.compile_s`:
sum, median, max) and CPU seconds (`extra.compile_cpu_s`, this process only), and the number of kernels
built (`extra.kernels`; 0 where the same worker had already built that kernel); per head dims, how many
cases compiled and were refused. Wall seconds include waiting for the CPU on a shared machine, so the
CPU seconds are the better measure of the compile itself; the host and its thread count are in each
record's provenance.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path


def stats(paths: list[Path]) -> dict[str, dict]:
    acc: dict[str, dict] = {}
    for path in paths:
        for line in path.open(encoding="utf-8"):
            if not line.strip():
                continue
            rec = json.loads(line)
            if rec.get("tier") != "compiled":
                continue
            c, prov, ex = rec["case"], rec.get("provenance", {}), rec.get("extra", {})
            key = f"{prov.get('target', c['arch'])} {c['backend']}"
            a = acc.setdefault(key, {"library": f"{prov.get('library')} {prov.get('kernel_version')}",
                                     "cutlass_dsl": prov.get("cutlass_dsl"), "outcomes": defaultdict(int),
                                     "wall": [], "cpu": [], "kernels": 0,
                                     "by_head_dims": defaultdict(lambda: defaultdict(int))})
            a["outcomes"][rec["outcome"]] += 1
            a["by_head_dims"][f"{c['head_dim']}x{c['head_dim_v']}"][rec["outcome"]] += 1
            if rec["outcome"] == "compiled" and "compile_s" in ex:
                a["wall"].append(float(ex["compile_s"]))
                a["cpu"].append(float(ex.get("compile_cpu_s", 0.0)))
                a["kernels"] += int(ex.get("kernels", 0))
    out = {}
    for key, a in sorted(acc.items()):
        def summ(xs: list[float]) -> dict:
            return {"sum": round(sum(xs), 1), "median": round(statistics.median(xs), 2) if xs else None,
                    "max": round(max(xs), 2) if xs else None}
        dims = sorted(a["by_head_dims"].items(), key=lambda kv: [int(x) for x in kv[0].split("x")])
        out[key] = {"library": a["library"], "cutlass_dsl": a["cutlass_dsl"],
                    "outcomes": dict(sorted(a["outcomes"].items())), "kernels_built": a["kernels"],
                    "compile_wall_s": summ(a["wall"]), "compile_cpu_s": summ(a["cpu"]),
                    "by_head_dims": {hd: dict(sorted(v.items())) for hd, v in dims}}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    out = stats(args.files)
    if args.json:
        print(json.dumps(out, indent=1, sort_keys=True))
        return
    for key, s in out.items():
        w, c = s["compile_wall_s"], s["compile_cpu_s"]
        print(f"{key} ({s['library']}, cutlass-dsl {s['cutlass_dsl']}): {s['outcomes']}; "
              f"{s['kernels_built']} kernels; compile wall {w['sum']} s (median {w['median']}, max {w['max']}), "
              f"cpu {c['sum']} s (median {c['median']})")
        for hd, v in s["by_head_dims"].items():
            print(f"  {hd:>8}: {v}")


if __name__ == "__main__":
    main()
