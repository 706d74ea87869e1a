"""The worker subprocess: reads cases on stdin, probes each, answers on a private pipe.

Protocol (one JSON object per line):
  -> {"case": {...}, "config": {...}}
  <- {"event": "hello", "provenance": {...}}            once, at start
  <- {"event": "start", "key": ..., "provenance": {...}}  before touching the kernel
  <- {"event": "gpu_lock", "waiting": true|false}          around a wait for the GPU's timing lock
  <- {"event": "result", "record": {...}}
The `start` message lets the runner write a complete record even if the kernel then kills the
process. Libraries that print to stdout cannot corrupt the protocol: fd 1 is pointed at stderr and
answers go to a duplicate of the original stdout.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace


def main() -> int:
    proto = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    from attnmatrix.matrix.cases import Case

    from attnmatrix.vocabulary import DTYPES

    from .base import load_backend
    from .env import device_provenance
    from .probe import ProbeConfig, kernel_provenance, probe_case
    from .timing import set_lock_listener

    run_case = probe_case
    if os.environ.get("ATTNMATRIX_MODE") == "xcompile":  # compile-only probes for an absent arch
        from .xcompile import worker_record as run_case
    device = os.environ.get("ATTNMATRIX_DEVICE", "cpu")
    threads = os.environ.get("ATTNMATRIX_CPU_THREADS")
    if device == "cpu" and threads:
        import torch

        torch.set_num_threads(int(threads))
    base = device_provenance(device)

    def send(obj: dict) -> None:
        proto.write(json.dumps(obj, sort_keys=True) + "\n")
        proto.flush()

    send({"event": "hello", "provenance": base, "pid": os.getpid()})
    # The runner stops the case's clock while we wait for the GPU's timing lock.
    set_lock_listener(lambda waiting: send({"event": "gpu_lock", "waiting": waiting}))
    for line in sys.stdin:
        if not line.strip():
            continue
        task = json.loads(line)
        case = Case.from_dict(task["case"])
        cfg = task.get("config", {})
        config = ProbeConfig(**{**cfg, "timed_dtypes": tuple(cfg.get("timed_dtypes", DTYPES))})
        backend = load_backend(case.backend)
        send({"event": "start", "key": case.key, "provenance": kernel_provenance(backend, base)})
        record = _run_with_memory_retry(run_case, case, config, base, backend, device)
        send({"event": "result", "record": record.to_dict()})
        if record.extra.get("device_fault"):
            return 3  # a faulted CUDA context poisons every later case: let the runner start a fresh worker
    return 0


def _run_with_memory_retry(run_case, case, config, base, backend, device: str):
    """Run a case; on a GPU shared by several workers, an out-of-memory error is usually another
    process's cached memory, not the kernel's need: hand our cache back, wait, try again (3 tries)."""
    if device != "cuda":
        return run_case(case, config, base, backend)
    import time

    import torch

    for attempt in range(3):
        try:
            record = run_case(case, config, base, backend)
            if not (record.outcome == "crash" and (record.reason or "").startswith("out of memory")) or attempt == 2:
                return _released(record)
        except torch.OutOfMemoryError:
            if attempt == 2:
                raise
        _released(None)
        time.sleep(5 * (attempt + 1))
    raise AssertionError("unreachable")


def _released(record):
    """Empty this worker's CUDA cache (every worker keeps only what its current case needs).

    A kernel fault can surface here, after the case returned: CUDA reports errors at the next
    synchronising call. It belongs to the case that just ran, not to the next one, so its record
    becomes a `crash` that says so (FA4 4.0.0b36 at head dims 160/224 with paged KV does this on an H200).
    What the record said before stays in its reason, the CUDA error's first line before it (the rest
    is CUDA's generic advice): FlashInfer 0.7.4's prefill at head dims 80/96/160 refuses in its own words
    and leaves such a fault behind.
    """
    import torch

    from .probe import MESSAGE_CHARS, device_fault

    try:
        torch.cuda.empty_cache()
    except Exception as e:  # noqa: BLE001 - only a device fault is ours to report
        if record is None or not device_fault(e):
            raise
        if record.extra.get("device_fault"):
            return record  # the probe already caught this fault, in the kernel's own call
        fault = (str(e).strip() or repr(e)).splitlines()[0]
        note = f"kernel fault reported after the case: {type(e).__name__}: {fault}; its record said {record.outcome!r}"
        if record.reason:
            note += f": {record.reason}"
        return replace(record, outcome="crash", reason=note[:MESSAGE_CHARS], timings=(),
                       extra={**record.extra, "device_fault": True, "outcome_before_fault": record.outcome})
    return record


if __name__ == "__main__":
    sys.exit(main())
