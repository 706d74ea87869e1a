"""Where a workload sweep's wall time goes: `benchmarks/regret.py sweep` with its phases timed.

    python benchmarks/sweep_phases.py -o PHASES.json -- sweep --backends B1,B2 --ops decode --points ... -o RUN.jsonl

The sweep runs as `regret.py sweep` runs it (same arguments, same output); around it this script times, in seconds
of wall time summed over the run: each layer call's whole workload (`time_workload`: the backends' checks, building
every point's inputs and calls, and timing them), each backend's check against the reference on the layer (`check`),
building the inputs of every point (`copies_of`: the problem in as many copies as keep back-to-back calls out of L2),
timing the calls in turns (`measure_interleaved`), within that sizing and capturing each backend's CUDA graph
(`plan`, of which `capture` is the captures themselves, per backend too), and how many calls each capture held;
each backend's calls made on every copy of a point's problem (`prepare_calls`: its `prepare`) and their first calls
(`first_calls`: FA4's compile among them, waited for on the GPU), both per backend too; and giving the point's memory
back (`release`). What `time_workload` holds beyond these is the loop itself. On a CPU the calls are not captured (no
`plan` or `capture`). It wraps functions of benchmarks/workload_timing.py and kernels/interleaved_timing.py, private
ones among them, so it follows them: a renamed one fails here loudly rather than going untimed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import regret  # noqa: E402  (benchmarks/ is a folder of scripts, not a package)
import workload_timing  # noqa: E402
from attnmatrix.kernels import interleaved_timing  # noqa: E402
from attnmatrix.matrix.storage import atomic_write_text  # noqa: E402


def synchronize() -> None:
    """Wait for the GPU's queued work, where a CUDA device is in use."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


class Phases:
    """Seconds and counts per phase, per backend for the graphs, and captures by size."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.count: dict[str, int] = defaultdict(int)
        self.per_backend: dict[str, float] = defaultdict(float)
        self.captured_calls: dict[int, int] = defaultdict(int)
        self._names: list[str] = []  # the backends of the point being timed, in the order their graphs are planned
        self._planned = 0

    def timed(self, phase: str, fn: Callable) -> Callable:
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[phase] += time.perf_counter() - t0
                self.count[phase] += 1
        return wrapper

    def install(self) -> Callable[[], None]:
        """Wrap the sweep's phases (their modules' globals, which the sweep looks up when it calls them); returns
        the function that puts the originals back."""
        capture, plan, measure = (interleaved_timing._capture, interleaved_timing._plan,
                                  interleaved_timing.measure_interleaved)
        copies, check, workload = workload_timing.copies_of, workload_timing._check, regret.time_workload
        prepare, first, release = workload_timing.prepare_calls, workload_timing.first_calls, workload_timing.release

        def timed_capture(fn, calls):
            t0 = time.perf_counter()
            try:
                return capture(fn, calls)
            finally:
                dt = time.perf_counter() - t0
                self.seconds["capture"] += dt
                self.count["capture"] += 1
                self.captured_calls[calls] += 1
                if self._names:
                    self.per_backend[f"capture:{self._names[min(self._planned, len(self._names) - 1)]}"] += dt

        def timed_plan(fns, replay_ms, max_calls):
            t0 = time.perf_counter()
            try:
                return plan(fns, replay_ms, max_calls)
            finally:
                dt = time.perf_counter() - t0
                self.seconds["plan"] += dt
                self.count["plan"] += 1
                self.per_backend[f"plan:{self._names[self._planned]}"] += dt
                self._planned += 1

        def timed_measure(fns, **kwargs):
            self._names, self._planned = list(fns), 0
            return measure(fns, **kwargs)

        def per_backend(phase: str, fn: Callable, name_of: Callable, sync: bool = False) -> Callable:
            def wrapper(*args):
                t0 = time.perf_counter()
                try:
                    return fn(*args)
                finally:
                    if sync:  # the calls' GPU time is theirs, not that of whatever runs next
                        synchronize()
                    dt = time.perf_counter() - t0
                    self.seconds[phase] += dt
                    self.count[phase] += 1
                    self.per_backend[f"{phase}:{name_of(*args)}"] += dt
            return wrapper

        # first_calls is handed the calls prepare_calls made, so the backend of those calls is the one just prepared
        prepared: list[str] = [""]

        def timed_prepare(backend, case, layer, problems):
            prepared[0] = backend.name
            return prepare(backend, case, layer, problems)

        interleaved_timing._capture = timed_capture
        interleaved_timing._plan = timed_plan
        interleaved_timing.measure_interleaved = self.timed("measure_interleaved", timed_measure)
        workload_timing.copies_of = self.timed("copies_of", copies)
        workload_timing._check = self.timed("check", check)
        regret.time_workload = self.timed("time_workload", workload)
        workload_timing.prepare_calls = per_backend("prepare_calls", timed_prepare, lambda backend, *_: backend.name)
        workload_timing.first_calls = per_backend("first_calls", first, lambda _: prepared[0], sync=True)
        workload_timing.release = self.timed("release", release)

        def undo() -> None:
            interleaved_timing._capture, interleaved_timing._plan = capture, plan
            interleaved_timing.measure_interleaved = measure
            workload_timing.copies_of, workload_timing._check, regret.time_workload = copies, check, workload
            workload_timing.prepare_calls, workload_timing.first_calls = prepare, first
            workload_timing.release = release

        return undo

    def summary(self) -> dict:
        return {"seconds": {k: round(v, 2) for k, v in sorted(self.seconds.items())},
                "count": dict(sorted(self.count.items())),
                "per_backend_seconds": {k: round(v, 2) for k, v in sorted(self.per_backend.items())},
                "captured_calls": dict(sorted(self.captured_calls.items()))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-o", "--output", help="the phases as JSON (also printed)")
    ap.add_argument("sweep", nargs=argparse.REMAINDER, help="-- then regret.py's arguments, `sweep` first")
    args = ap.parse_args(argv)
    sweep = args.sweep[1:] if args.sweep[:1] == ["--"] else args.sweep
    if sweep[:1] != ["sweep"]:
        ap.error("give regret.py's sweep arguments after --, `sweep` first")
    phases = Phases()
    undo = phases.install()
    try:
        status = regret.main(sweep)
    finally:
        undo()
    result = {"sweep": sweep, "status": status, **phases.summary()}
    if args.output:
        atomic_write_text(Path(args.output), json.dumps(result, indent=1, sort_keys=True) + "\n")
    print(json.dumps(result, sort_keys=True))
    return status


if __name__ == "__main__":
    sys.exit(main())
