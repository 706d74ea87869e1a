"""Fault injection at scale: a sweep of `fake_chaos` cases survives crashing kernels and a runner killed with -9.

`fake_chaos` (kernels/fakes.py) computes most cases correctly and, for ~10% of them (chosen by a hash of
the case key, so every run agrees), segfaults, hangs, exhausts memory up to the worker's address-space
limit, raises a library-style refusal, returns NaN, or returns plausible but wrong values.

The sweep runs as the real command line (`attnmatrix probe ... -o FILE`, i.e. `kernels.runner.run_cases`
with a memory limit and a short per-case timeout) in a subprocess. This script SIGKILLs that subprocess at
random points (a seeded random delay after the attempt's first new record), starts the same command again,
and repeats until the sweep completes. Then it checks, from the result file alone:

- every case of the sweep has exactly one record: none lost, none duplicated, none foreign;
- every injected fault got the outcome it must get (segfault -> crash, hang -> timeout, oom -> crash
  "out of memory", raise -> rejected, nan/wrong -> wrong) and every correct case passed;
- the file is valid (`attnmatrix validate FILE --no-embedded` exits 0), and no worker outlived a killed runner.

It prints a table and writes the figures to benchmarks/results/reliability.json.

usage: python benchmarks/reliability.py [--kills 5] [--seed 0] [--out benchmarks/results/reliability.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from attnmatrix.kernels.fakes import CHAOS_EXPECTED, CHAOS_FAULTS, chaos_fault
from attnmatrix.matrix.cases import Case, case_space, parse_head_dims
from attnmatrix.matrix.storage import read_records

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "results" / "reliability.json"

# >= 1,000 cases: 20 head-dim pairs x 2 dtypes x the 13 standard feature sets x (prefill, decode), plus MLA
# prefill at its two dims. Head dims stop at 256 so a correct case stays cheap on a CPU.
HEAD_DIMS = "32,40,48,56,64,72,80,88,96,104,112,120,128,144,160,176,192,224,256,192x128"
DTYPES = "bfloat16,float16"


def sweep_cases(head_dims: str, dtypes: str) -> list[Case]:
    """The same case list `attnmatrix probe --head-dims ... --dtypes ...` builds (default feature sets/ops)."""
    return list(case_space(["cpu"], ["fake_chaos"], head_dims=parse_head_dims(head_dims), dtypes=dtypes.split(",")))


def probe_command(out: Path, *, head_dims: str, dtypes: str, timeout_s: float, memory_limit_mb: int,
                  workers: int) -> list[str]:
    return [sys.executable, "-m", "attnmatrix.cli", "probe", "--device", "cpu", "--backends", "fake_chaos",
            "--head-dims", head_dims, "--dtypes", dtypes, "--no-timing", "--timeout", f"{timeout_s:g}",
            "--memory-limit", str(memory_limit_mb), "--workers", str(workers), "--json", "-o", str(out)]


def _line_count(path: Path) -> int:
    try:
        with open(path, "rb") as f:
            return f.read().count(b"\n")
    except OSError:
        return 0


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return -1


def _children(pid: int) -> list[int]:
    """Direct children of `pid` (Linux /proc), to check none outlives a killed runner."""
    kids: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children", encoding="ascii") as f:
                kids += [int(x) for x in f.read().split()]
    except OSError:
        pass
    return kids


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def run_with_kills(cmd: list[str], out: Path, *, kills: int, seed: int, max_delay_s: float,
                   deadline_s: float, env: dict[str, str] | None = None, log=print) -> dict:
    """Run `cmd` (which appends to `out`) to completion, SIGKILLing it `kills` times at random points.

    Each kill comes a random delay (uniform in [0, max_delay_s], seeded) after the attempt's first new
    record, so every attempt makes progress and the kill lands anywhere: mid-case, mid-write, while a worker
    is being replaced. Returns the attempts, their time to resume and the kill facts.
    """
    rng = random.Random(seed)
    t_start = time.monotonic()
    attempts: list[dict] = []
    orphans: list[int] = []
    killed = 0
    stderr_tail = ""
    while True:
        if time.monotonic() - t_start > deadline_s:
            raise RuntimeError(f"sweep not finished after {deadline_s:g} s ({len(attempts)} attempts)")
        kill_after = rng.uniform(0.0, max_delay_s) if killed < kills else None
        before = _line_count(out)
        with tempfile.TemporaryFile() as err:
            t0 = time.monotonic()
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, env=env)
            first_new: float | None = None
            kill_at: float | None = None
            workers_seen: set[int] = set()
            last_size = _size(out)
            while proc.poll() is None:
                time.sleep(0.02)
                workers_seen.update(_children(proc.pid))
                now = time.monotonic()
                size = _size(out)
                if first_new is None and size != last_size and _line_count(out) > before:
                    first_new = now
                    if kill_after is not None:
                        kill_at = now + kill_after
                last_size = size
                if kill_at is not None and now >= kill_at:
                    workers_seen.update(_children(proc.pid))
                    proc.send_signal(signal.SIGKILL)
                    proc.wait()
                    break
                if now - t_start > deadline_s:
                    proc.kill()
                    proc.wait()
                    raise RuntimeError(f"sweep not finished after {deadline_s:g} s")
            stdout = proc.stdout.read().decode("utf-8", "replace") if proc.stdout else ""
            if proc.stdout:
                proc.stdout.close()
            err.seek(0)
            stderr = err.read().decode("utf-8", "replace")
        after = _line_count(out)
        was_killed = proc.returncode == -signal.SIGKILL
        att = {"attempt": len(attempts) + 1, "killed": was_killed, "returncode": proc.returncode,
               "seconds": round(time.monotonic() - t0, 2), "new_records": after - before,
               "time_to_first_new_record_s": round(first_new - t0, 2) if first_new is not None else None,
               "torn_line_repaired": "cut a torn last line" in stderr}
        attempts.append(att)
        if was_killed:
            killed += 1
            # Workers must die with their runner (PR_SET_PDEATHSIG); give the kernel a moment to deliver it.
            limit = time.monotonic() + 5.0
            left = [p for p in workers_seen if _alive(p)]
            while left and time.monotonic() < limit:
                time.sleep(0.05)
                left = [p for p in left if _alive(p)]
            for p in left:  # a leak is reported, then cleaned up so it cannot disturb the next attempt
                orphans.append(p)
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            log(f"attempt {att['attempt']}: killed (SIGKILL) after {att['seconds']} s, "
                f"{att['new_records']} new records, {len(left)} orphaned worker(s)")
            continue
        stderr_tail = stderr[-2000:]
        log(f"attempt {att['attempt']}: exited {proc.returncode} after {att['seconds']} s, "
            f"{att['new_records']} new records")
        if proc.returncode != 0:
            raise RuntimeError(f"probe exited {proc.returncode}: {stderr_tail}")
        try:
            final = json.loads(stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            final = {}
        return {"attempts": attempts, "kills": killed, "orphaned_workers": len(orphans), "final_summary": final,
                "wall_s": round(time.monotonic() - t_start, 2)}


def verify(out: Path, cases: list[Case]) -> dict:
    """Check the result file against the sweep: one record per case, outcomes as injected."""
    expected = {c.key: chaos_fault(c.key) for c in cases}
    records = read_records(out)  # strict: any malformed line raises
    per_key = Counter(r.key for _, r in records)
    lost = sorted(set(expected) - set(per_key))
    foreign = sorted(set(per_key) - set(expected))
    duplicates = sum(n - 1 for n in per_key.values() if n > 1)
    by_fault: dict[str, Counter] = {str(f): Counter() for f in (None, *CHAOS_FAULTS)}
    mismatches = []
    for _, rec in records:
        if rec.key not in expected:
            continue
        fault = expected[rec.key]
        want = CHAOS_EXPECTED[fault]
        ok = rec.outcome == want
        if ok and fault == "oom":
            ok = (rec.reason or "").startswith("out of memory")
        by_fault[str(fault)]["survived" if ok else "mismatched"] += 1
        by_fault[str(fault)][rec.outcome] += 1
        if not ok:
            mismatches.append({"case": rec.key, "fault": fault, "expected": want, "got": rec.outcome,
                               "reason": (rec.reason or "")[:300]})
    injected = Counter(f for f in expected.values() if f is not None)
    return {
        "cases": len(expected), "records": len(records),
        "faults_injected": {f: injected.get(f, 0) for f in CHAOS_FAULTS},
        "faults_injected_total": sum(injected.values()),
        "faults_survived": sum(by_fault[f]["survived"] for f in CHAOS_FAULTS),
        "correct_cases": sum(1 for f in expected.values() if f is None),
        "correct_passed": by_fault["None"]["survived"],
        "outcomes_by_fault": {("none" if f == "None" else f): dict(sorted(c.items())) for f, c in by_fault.items()},
        "results_lost": len(lost), "duplicates": duplicates, "foreign_records": len(foreign),
        "outcome_mismatches": len(mismatches),
        "lost_cases": lost[:20], "mismatch_examples": mismatches[:20],
    }


def validate_file(out: Path, env: dict[str, str] | None = None) -> int:
    return subprocess.run([sys.executable, "-m", "attnmatrix.cli", "validate", str(out), "--no-embedded"],
                          capture_output=True, env=env).returncode


def chaos_env() -> dict[str, str]:
    env = dict(os.environ)
    # Several workers on two cores: one intra-op thread each, or they fight over the cores.
    env.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    # fake_chaos is a test fake, not a product backend: registered through the plugin variable.
    plugins = [p for p in env.get("ATTNMATRIX_BACKEND_PLUGINS", "").split(",") if p]
    env["ATTNMATRIX_BACKEND_PLUGINS"] = ",".join(dict.fromkeys([*plugins, "attnmatrix.kernels.fakes"]))
    return env


def run_reliability(workdir: Path, *, head_dims: str = HEAD_DIMS, dtypes: str = DTYPES, kills: int = 5,
                    seed: int = 0, timeout_s: float = 5.0, memory_limit_mb: int = 1024, workers: int = 3,
                    max_kill_delay_s: float = 30.0, deadline_s: float = 540.0, log=print) -> dict:
    """The whole experiment in `workdir`; returns the figures (see the module docstring)."""
    cases = sweep_cases(head_dims, dtypes)
    out = workdir / "chaos.jsonl"
    cmd = probe_command(out, head_dims=head_dims, dtypes=dtypes, timeout_s=timeout_s,
                        memory_limit_mb=memory_limit_mb, workers=workers)
    env = chaos_env()
    run = run_with_kills(cmd, out, kills=kills, seed=seed, max_delay_s=max_kill_delay_s, deadline_s=deadline_s,
                         env=env, log=log)
    figures = verify(out, cases)
    resumes = [a["time_to_first_new_record_s"] for a in run["attempts"][1:]
               if a["time_to_first_new_record_s"] is not None]
    shown = [Path(c).name if c.endswith(".jsonl") else c for c in cmd[1:]]
    return {
        **figures,
        "kills": run["kills"],
        "attempts": len(run["attempts"]),
        "time_to_resume_s": {"median": round(statistics.median(resumes), 2) if resumes else None,
                             "max": max(resumes) if resumes else None, "each": resumes},
        "torn_lines_repaired": sum(a["torn_line_repaired"] for a in run["attempts"]),
        "orphaned_workers": run["orphaned_workers"],
        "validate_exit_code": validate_file(out, env),
        "wall_s": run["wall_s"],
        "attempt_log": run["attempts"],
        "config": {"head_dims": head_dims, "dtypes": dtypes, "kills": kills, "seed": seed, "timeout_s": timeout_s,
                   "memory_limit_mb": memory_limit_mb, "workers": workers, "max_kill_delay_s": max_kill_delay_s,
                   "probe_command": "python " + shlex.join(shown), "env": {"OMP_NUM_THREADS": "1"}},
    }


def table(res: dict) -> str:
    inj = res["faults_injected"]
    by = res["outcomes_by_fault"]
    rows = [("cases", res["cases"]), ("records", res["records"])]
    rows += [("  correct -> pass", f"{res['correct_passed']} / {res['correct_cases']}")]
    for f in CHAOS_FAULTS:
        want = CHAOS_EXPECTED[f]
        rows.append((f"  fault {f} -> {want}", f"{by[f].get('survived', 0)} / {inj[f]}"))
    rows += [
        ("faults injected", res["faults_injected_total"]),
        ("faults survived (expected outcome)", res["faults_survived"]),
        ("results lost", res["results_lost"]),
        ("duplicates", res["duplicates"]),
        ("foreign records", res["foreign_records"]),
        ("outcome mismatches", res["outcome_mismatches"]),
        ("kills (SIGKILL of the runner)", res["kills"]),
        ("torn lines repaired on resume", res["torn_lines_repaired"]),
        ("orphaned workers after a kill", res["orphaned_workers"]),
        ("time to resume, median / max (s)",
         f"{res['time_to_resume_s']['median']} / {res['time_to_resume_s']['max']}"),
        ("validate exit code", res["validate_exit_code"]),
        ("total wall time (s)", res["wall_s"]),
    ]
    w = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{w}}  {v}" for k, v in rows)


def passed(res: dict) -> bool:
    return (res["results_lost"] == 0 and res["duplicates"] == 0 and res["foreign_records"] == 0
            and res["outcome_mismatches"] == 0 and res["orphaned_workers"] == 0 and res["validate_exit_code"] == 0
            and res["records"] == res["cases"] and res["kills"] == res["config"]["kills"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kills", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=5.0, help="per-case timeout of the runner, seconds")
    ap.add_argument("--memory-limit", type=int, default=1024, help="address-space cap per worker, MiB")
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--head-dims", default=HEAD_DIMS)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="attnmatrix-reliability-") as d:
        res = run_reliability(Path(d), head_dims=args.head_dims, kills=args.kills, seed=args.seed,
                              timeout_s=args.timeout, memory_limit_mb=args.memory_limit, workers=args.workers,
                              log=lambda s: print(s, file=sys.stderr, flush=True))
    import torch
    from attnmatrix.kernels.env import device_provenance

    res = {"command": shlex.join(["python", "benchmarks/reliability.py", *sys.argv[1:]]),
           "date": time.strftime("%Y-%m-%d"),
           "machine": {"cpu": device_provenance("cpu")["device"], "cores": os.cpu_count(),
                       "python": platform.python_version(), "torch": torch.__version__,
                       # Other work on the machine stretches every wall-clock figure: say how busy it was.
                       "load_average_1m": {"start": round(load_start, 2), "end": round(os.getloadavg()[0], 2)}},
           "passed": passed(res), **res}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    print(table(res))
    print(f"\n{'PASSED' if res['passed'] else 'FAILED'}; figures written to {args.out}")
    return 0 if res["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
