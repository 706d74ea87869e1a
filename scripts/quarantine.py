"""Split a device sweep's result file into evidence and quarantine, by documented artefact rules.

usage: python scripts/quarantine.py SWEEP.jsonl --keep OUT.jsonl --quarantine Q.jsonl [--exclude OLD.jsonl ...]
                                     [--timeouts-are-artefacts]

A record goes to quarantine when it says something about the run rather than the kernel
(matrix/data/quarantine/README.md explains each rule with the sweep that showed it):

- worker-died-before-start: a `crash` whose worker exited with the device-fault status (3) while or
  before taking the case: the worker was ending after an earlier case's sticky CUDA fault (the
  runner now re-queues such cases);
- shared-gpu-oom: a `crash` from out-of-memory on a GPU shared by many workers (their cached memory,
  not the kernel's need; GPU workers now retry);
- install-race: `unavailable`, or FA4's compiler failing ("module 'tvm_ffi' has no attribute ..."),
  because the shared `tvm_ffi` package was being reinstalled (with FlashInfer) into the same folder;
- killed-from-outside: a `crash` whose worker died of SIGKILL. Nothing in a kernel sends SIGKILL; the
  runner's own time limit is recorded as `timeout`, so this is the kernel's OOM killer (host memory
  shared with builds and compiles) or an operator;
- overloaded-timeout (only with --timeouts-are-artefacts, for a sweep whose machine was overloaded):
  a `timeout`, when the case's time went to waiting for CPUs and for the GPU's timing lock, which
  the case's time limit includes. Say in the quarantine README why the flag was used.

Records whose case is already in an --exclude file (evidence committed earlier) are dropped, so
--keep holds only what the sweep added. Prints what went where.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path


def artefact(rec: dict, timeouts_are_artefacts: bool = False) -> str | None:
    reason = rec.get("reason") or ""
    if rec["outcome"] == "crash" and reason.startswith("worker killed by signal SIGKILL"):
        return "killed-from-outside"
    if rec["outcome"] == "timeout" and timeouts_are_artefacts:
        return "overloaded-timeout"
    if rec["outcome"] == "crash" and reason.startswith("worker exited with status 3 "):
        return "worker-died-before-start"
    if rec["outcome"] == "crash" and "out of memory" in reason.lower():
        return "shared-gpu-oom"
    if "No module named 'tvm_ffi" in reason or "module 'tvm_ffi' has no attribute" in reason:
        return "install-race"
    return None


def case_id(rec: dict) -> str:
    return json.dumps(rec["case"], sort_keys=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweep", type=Path)
    ap.add_argument("--keep", type=Path, required=True)
    ap.add_argument("--quarantine", type=Path, required=True)
    ap.add_argument("--exclude", type=Path, action="append", default=[])
    ap.add_argument("--timeouts-are-artefacts", action="store_true",
                    help="the sweep's machine was overloaded: its timeouts say nothing about the kernels")
    args = ap.parse_args()
    old = {case_id(json.loads(line)) for p in args.exclude for line in p.open() if line.strip()}
    kept, quarantined, counts = [], [], Counter()
    for line in args.sweep.open():
        if not line.strip():
            continue
        rec = json.loads(line)
        if case_id(rec) in old:
            counts["already committed"] += 1
            continue
        why = artefact(rec, args.timeouts_are_artefacts)
        (quarantined if why else kept).append(line.rstrip("\n"))
        counts[why or "kept"] += 1
    args.keep.write_text("".join(line + "\n" for line in kept))
    args.quarantine.write_text("".join(line + "\n" for line in quarantined))
    for k, v in sorted(counts.items()):
        print(f"{k}: {v}")


if __name__ == "__main__":
    main()
