"""`generate` + `check` time for a matrix of about 10,000 cells.

Builds a synthetic evidence set (validated records with timings over real case axes, plus the
embedded declared facts; synthetic records the project's own validation refuses, such as an MLA prefill
case without its causal mask, are left out and counted, and further candidates taken in their place),
then times: resolving, rendering every generated file (what `generate` does), and comparing with files on
disk (what `check` does), in a temporary checkout copy.
Prints a table and writes benchmarks/results/generate.json.

usage: python benchmarks/bench_generate.py [--cells N]
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import tempfile
import time
from pathlib import Path

from attnmatrix.matrix.cases import FEATURE_SETS, HEAD_DIMS, case_space
from attnmatrix.matrix.records import Record, Timing
from attnmatrix.matrix.storage import write_records
from click.testing import CliRunner

from attnmatrix.cli import main as cli

ROOT = Path(__file__).resolve().parent.parent


def synthetic(n: int) -> list[Record]:
    archs = ["sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120"]
    backends = ["fa2", "fa4", "sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "sdpa_math"]
    cases = itertools.islice(case_space(archs, backends, head_dims=HEAD_DIMS, feature_sets=FEATURE_SETS), n)
    out = []
    for i, c in enumerate(cases):
        prov = {"device": f"bench-{c.arch}", "kernel_version": "1.0", "torch": "2.13.0", "date": "2026-11-30",
                "library": "bench"}
        if i % 5 == 4:
            out.append(Record(c, "rejected", "validated", prov, reason=f"bench refusal {i % 7}"))
        else:
            t = tuple(Timing(s, 0.1 + (i % 97) / 100 + k, 100.0 + i % 300) for k, s in enumerate(("a", "b", "c")))
            out.append(Record(c, "pass", "validated", prov, error={"max_abs_err": 0.001}, timings=t))
    return out


def valid_only(records: list[Record], path: Path, data_dir: Path) -> tuple[list[Record], int]:
    """`records` less those `validate_evidence` finds a problem with (read back from `path`, where they are
    written); and how many it left out."""
    from attnmatrix.matrix.evidence import load_evidence
    from attnmatrix.matrix.validate import validate_evidence

    write_records(path, records)
    problems: list = []
    ev = load_evidence([path], problems=problems, data_dir=data_dir)
    bad = {p.record for p in problems + validate_evidence(ev) if p.record}
    kept = [r for r in records if r.case.key not in bad]
    return kept, len(records) - len(kept)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cells", type=int, default=10_000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        root = Path(d) / "checkout"
        root.mkdir()
        for name in ("mkdocs.yml", "site", "matrix", "attnmatrix"):
            src = ROOT / name
            (shutil.copytree if src.is_dir() else shutil.copy)(src, root / name)
        evidence = Path(d) / "bench.jsonl"
        # candidates past --cells, so that --cells remain once those validation refuses are left out
        records, refused = valid_only(synthetic(args.cells * 3 // 2), evidence, root / "matrix" / "data")
        records = records[:args.cells]
        write_records(evidence, records)
        runner = CliRunner()
        t0 = time.perf_counter()
        gen = runner.invoke(cli, ["generate", "--root", str(root), "--results", str(evidence)])
        t_gen = time.perf_counter() - t0
        assert gen.exit_code == 0, gen.output
        # `check` reads only the embedded matrix; time the same comparison it does on this matrix.
        t0 = time.perf_counter()
        again = runner.invoke(cli, ["generate", "--root", str(root), "--results", str(evidence)])
        t_check = time.perf_counter() - t0
        assert again.exit_code == 0 and "0 changed" in again.output, again.output
    cells = len({r.case.cell for r in records})
    out = {"synthetic_records": len(records), "synthetic_cells": cells, "candidates_refused_by_validation": refused,
           "generate_s": round(t_gen, 2), "regenerate_unchanged_s": round(t_check, 2),
           "note": "synthetic cells come on top of the embedded matrix; the second run renders and compares "
                   "every file, as `check` does, and writes nothing"}
    print(json.dumps(out, indent=2))
    (ROOT / "benchmarks" / "results" / "generate.json").write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
