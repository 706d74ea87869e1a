"""Re-probe what the committed matrix cannot vouch for, and re-time a sample of it, on a GPU.

    python scripts/reprobe.py blind  [--arch sm_90] [--device cuda] [-o FILE]  # which passes are blind
    python scripts/reprobe.py run    --cases FILE -o OUT.jsonl [...]     # GPU: probe those cases again
    python scripts/reprobe.py retime [--sample N | --stale | --dtype-pairs] -o OUT.jsonl [...]  # GPU: re-time

`blind` reads the committed records (matrix/data/results), takes every validated `pass` for the arch
whose validation problem predates version 2 (kernels/problem.py RECIPE_V1), rebuilds that problem and
measures, feature by feature, whether a kernel that ignored the feature would have failed the check
(kernels/sensitivity.py, bar: 10x the tolerance). The passes whose check could not tell are listed,
one case per line (JSON), with the features it was blind to; counts by backend and feature go to stderr.

`run` probes the listed cases again with the current validation problem and timing (kernels/probe.py),
in isolated workers on this machine's GPUs, resumable, into OUT.jsonl; cases whose backend is not
installed here are left out and counted (`--backends` narrows further). `retime` does the same for a
deterministic sample of the arch's timed passes (every backend and op present, both dtypes), so the
new GPU-time figures and host times can be compared with the committed ones; `--stale` takes instead
every pass whose latency is not yet GPU time, cell by cell; `--dtype-pairs` every bfloat16/float16 pair of
one kernel whose timings disagree beyond matrix/validate.py DTYPE_TIMING_FACTOR, both dtypes one after the
other (run id `dtype-pairs-...`, which tells the check the pair was re-timed together; run it as the only
sweep on the GPU); `--blind-first FILE` puts blind cases
first. Both stop starting new cases after `--limit-s` seconds (a call on the GPU machine has 10
minutes) and print a JSON summary; a later call with the same OUT resumes.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from collections import Counter
from pathlib import Path

from attnmatrix.kernels.problem import RECIPE, RECIPES
from attnmatrix.matrix.cases import Case
from attnmatrix.matrix.evidence import RESULTS_DIR
from attnmatrix.matrix.records import Record
from attnmatrix.matrix.storage import iter_result_files, read_records
from attnmatrix.matrix.validate import DTYPE_PAIR_RUN, dtype_timing_disagreements

from attnmatrix.vocabulary import DTYPES


def committed_passes(arch: str, results: Path = RESULTS_DIR) -> dict[str, Record]:
    """The newest validated pass per case of `arch` in the committed result files."""
    out: dict[str, Record] = {}
    for path in iter_result_files([results]):
        for _, rec in read_records(path):
            if rec.case.arch != arch or rec.tier != "validated" or rec.outcome != "pass":
                continue
            old = out.get(rec.key)
            if old is None or rec.provenance.get("date", "") >= old.provenance.get("date", ""):
                out[rec.key] = rec
    return out


def problem_version(rec: Record) -> int:
    v = rec.extra.get("problem", 1)
    return v if isinstance(v, int) and v in RECIPES else 1


def blind_cases(arch: str, results: Path = RESULTS_DIR, progress=None, device: str = "cpu") -> list[dict]:
    """One entry per committed pass whose validation could not discriminate some feature."""
    import torch
    from attnmatrix.kernels.sensitivity import blind_features

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    passes = committed_passes(arch, results)
    cache: dict[tuple, list] = {}  # the effects depend on the problem, not on the backend
    out = []
    for i, (key, rec) in enumerate(sorted(passes.items())):
        version = problem_version(rec)
        if version >= RECIPE.version:
            continue
        c = rec.case
        sig = (c.op, c.dtype, c.head_dim, c.head_dim_v, c.features, version)
        if sig not in cache:
            cache[sig] = blind_features(c, recipe=RECIPES[version], device=device)
        if progress:
            progress(i + 1, len(passes))
        if cache[sig]:
            out.append({"case": c.to_dict(), "key": key, "problem": version,
                        "blind": [e.to_dict() for e in cache[sig]]})
    return out


def _installed(backends: list[str]) -> dict[str, str | None]:
    from attnmatrix.kernels.base import load_backend

    return {b: load_backend(b).availability() for b in backends}


def _probe(cases: list[Case], out: Path, args: argparse.Namespace) -> dict:
    import torch
    from attnmatrix.kernels.probe import ProbeConfig
    from attnmatrix.kernels.runner import RunnerConfig, run_cases
    from attnmatrix.kernels.timing import PEAK_ENV, PEAK_METHOD_ENV, peak_env
    from attnmatrix.matrix.storage import ResultStore

    if not torch.cuda.is_available():
        print("reprobe: needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        raise SystemExit(2)
    names = sorted({c.backend for c in cases})
    why = _installed(names)
    skipped = Counter(c.backend for c in cases if why[c.backend])
    todo = [c for c in cases if not why[c.backend]]
    ngpu = torch.cuda.device_count()
    # The run's matmul ceiling, once (the runner would measure it again for every slice); one measured for
    # the same machine earlier is taken from the environment (PEAK_ENV, PEAK_METHOD_ENV).
    if PEAK_ENV in os.environ:
        peak = {k: os.environ[k] for k in (PEAK_ENV, PEAK_METHOD_ENV) if k in os.environ}
    else:
        peak = peak_env(0) if todo else {}
    cfg = RunnerConfig(workers=args.workers or 4 * ngpu, timeout_s=args.timeout, device="cuda",
                       gpus=list(range(ngpu)), probe=ProbeConfig(run_id=args.run_id), extra_env=peak)
    deadline = time.monotonic() + args.limit_s
    started = time.monotonic()
    done = Counter()
    with ResultStore(out) as store:
        # In slices, so no new case starts after the deadline; each slice resumes the same store.
        for i in range(0, len(todo), args.slice):
            if time.monotonic() > deadline:
                break
            summary = run_cases(todo[i:i + args.slice], store, cfg,
                                progress=lambda r: print(f"{r.outcome:8} {r.key}", file=sys.stderr, flush=True))
            done.update(summary.outcomes)
        left = sum(1 for c in todo if c.key not in store)
    return {"cases": len(cases), "probed_now": dict(done), "matmul_peak": peak,
            "left": left, "wall_s": round(time.monotonic() - started, 1),
            "not_installed": {b: n for b, n in skipped.items()}, "why_not_installed": {b: why[b] for b in skipped},
            "out": str(out)}


def _sample(passes: dict[str, Record], n: int, seed: int) -> list[Case]:
    """`n` timed passes, spread over (backend, op, dtype) groups round robin, reproducibly."""
    groups: dict[tuple, list[Record]] = {}
    for rec in sorted(passes.values(), key=lambda r: r.key):
        if rec.timings:
            groups.setdefault((rec.case.backend, rec.case.op, rec.case.dtype), []).append(rec)
    rng = random.Random(seed)
    for recs in groups.values():
        rng.shuffle(recs)
    picked: list[Case] = []
    while len(picked) < n and any(groups.values()):
        for g in sorted(groups):
            if groups[g] and len(picked) < n:
                picked.append(groups[g].pop().case)
    return picked


def stale_cases(passes: dict[str, Record]) -> list[Case]:
    """Every pass whose latency is not GPU time: timed before the method was recorded (one event pair
    and a synchronize per call, the host's launch cost included) or never timed (float16 passes were
    not). Cell by cell, so a cell's backends are re-timed together and its ranking can be compared as
    soon as the cell is done: bfloat16 first (the rankings rest on those figures), then the cells with
    the most backends to compare."""
    cells: dict[tuple, list[Case]] = {}
    for rec in passes.values():
        if rec.timings and all(t.method for t in rec.timings):
            continue
        c = rec.case
        cells.setdefault((c.arch, c.op, c.dtype, c.head_dim, c.head_dim_v, c.features), []).append(c)
    order = sorted(cells, key=lambda cell: (cell[2] != "bfloat16", -len(cells[cell]), cell))
    return [c for cell in order for c in sorted(cells[cell], key=lambda c: c.backend)]


def dtype_pair_cases(arch: str) -> list[Case]:
    """Both dtypes of every pair whose timings disagree, pair by pair (bfloat16 first)."""
    from attnmatrix.matrix.evidence import load_evidence

    pairs = [d for d in dtype_timing_disagreements(load_evidence([]).records) if d["cell"].startswith(arch + "/")]
    return [Case.from_key(d[dt]) for d in pairs for dt in DTYPES]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("blind", help="list the committed passes whose validation could not discriminate")
    b.add_argument("--arch", default="sm_90")
    b.add_argument("--results", type=Path, default=RESULTS_DIR, help="committed result files (default: %(default)s)")
    b.add_argument("-o", "--output", help="write the list here (JSON Lines; default: stdout)")
    b.add_argument("--device", default="cpu", help="where the references are computed (cuda is faster; "
                   "the problems' values are drawn on the CPU either way)")
    for name in ("run", "retime"):
        p = sub.add_parser(name)
        p.add_argument("-o", "--output", help="result file (JSON Lines, resumable; required unless --list)")
        p.add_argument("--backends", help="only these backends (comma-separated)")
        p.add_argument("--workers", type=int, default=0, help="worker processes (default 4 per GPU)")
        p.add_argument("--timeout", type=float, default=300.0, help="seconds per case (first calls JIT-compile)")
        p.add_argument("--limit-s", type=float, default=480.0, help="start no case after this many seconds")
        p.add_argument("--slice", type=int, default=32, help="cases per runner pass between deadline checks")
        p.add_argument("--run-id", default=None)
    sub.choices["run"].add_argument("--cases", required=True, help="a list written by `blind`")
    rt = sub.choices["retime"]
    rt.add_argument("--arch", default="sm_90")
    rt.add_argument("--sample", type=int, default=48)
    rt.add_argument("--stale", action="store_true", help="every pass whose latency is not GPU time (timed "
                    "per call with host time, or never timed), cell by cell, instead of a sample")
    rt.add_argument("--dtype-pairs", action="store_true", help="the bfloat16/float16 pairs whose timings "
                    "disagree (matrix/validate.py dtype_timing_disagreements), both dtypes of each")
    rt.add_argument("--seed", type=int, default=0)
    rt.add_argument("--blind-first", help="a list written by `blind`: those cases go first")
    rt.add_argument("--list", action="store_true", help="print the cases it would take, counted by backend and "
                    "dtype, and probe nothing (no GPU needed)")
    args = ap.parse_args(argv)

    if args.cmd == "blind":
        t0 = time.monotonic()

        def progress(i: int, n: int) -> None:
            print(f"\r{i}/{n} passes checked", end="", file=sys.stderr, flush=True)

        rows = blind_cases(args.arch, args.results, device=args.device, progress=progress)
        print(file=sys.stderr)
        text = "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows)
        if args.output:
            Path(args.output).write_text(text, encoding="utf-8")
        else:
            sys.stdout.write(text)
        by_backend = Counter(r["case"]["backend"] for r in rows)
        by_feature = Counter(e["feature"] for r in rows for e in r["blind"])
        print(json.dumps({"blind_passes": len(rows), "by_backend": dict(sorted(by_backend.items())),
                          "by_feature": dict(sorted(by_feature.items())),
                          "seconds": round(time.monotonic() - t0, 1)}, indent=1), file=sys.stderr)
        return 0

    only = set(args.backends.split(",")) if args.backends else None
    if args.cmd == "run":
        rows = [json.loads(line) for line in Path(args.cases).read_text(encoding="utf-8").splitlines() if line.strip()]
        cases = [Case.from_dict(r["case"]) for r in rows]
    else:
        cases = []
        if args.blind_first:
            cases = [Case.from_dict(json.loads(line)["case"])
                     for line in Path(args.blind_first).read_text(encoding="utf-8").splitlines() if line.strip()]
        passes = committed_passes(args.arch)
        if only:
            passes = {k: r for k, r in passes.items() if r.case.backend in only}
        if args.dtype_pairs:
            cases += dtype_pair_cases(args.arch)
            args.run_id = args.run_id or f"{DTYPE_PAIR_RUN}-{time.strftime('%Y%m%d')}"
        else:
            cases += stale_cases(passes) if args.stale else _sample(passes, args.sample, args.seed)
    if only:
        cases = [c for c in cases if c.backend in only]
    cases = list({c.key: c for c in cases}.values())
    if args.cmd == "retime" and args.list:
        counts = Counter(f"{c.backend} {c.dtype}" for c in cases)
        print(json.dumps({"cases": len(cases), "by_backend_dtype": dict(sorted(counts.items()))}, indent=1))
        return 0
    if not args.output:
        ap.error("-o/--output is required")
    summary = _probe(cases, Path(args.output), args)
    print(json.dumps(summary, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
