"""What a Ray task of a fleet sweep runs on its node: one chunk of cases through the isolated runner, each
record streamed back to the driver (`kernels/ray_executor.py`) the moment it is written.
"""

from __future__ import annotations

import os
import queue
import tempfile
import threading
import traceback
from collections.abc import Iterator
from pathlib import Path

from attnmatrix.matrix.cases import Case
from attnmatrix.matrix.storage import ResultStore

from .probe import ProbeConfig
from .runner import RunnerConfig, run_cases
from .timing import PEAK_ENV, peak_env

_PEAK_CACHE: dict[tuple, dict[str, str]] = {}


def _peak_env(gpus: list[int] | None) -> dict[str, str]:
    """The task's GPU's matmul peak as the environment workers read (`kernels.timing.peak_env`), measured
    once per Ray worker process: in a subprocess, since the Ray worker must not hold a CUDA context (it
    is reused for tasks on other GPUs)."""
    key = tuple(gpus or ())
    if key not in _PEAK_CACHE:
        _PEAK_CACHE[key] = peak_env(gpus[0] if gpus else None)
    return _PEAK_CACHE[key]


def probe_chunk(case_dicts: list[dict], settings: dict) -> Iterator[tuple[str, dict]]:
    """A Ray task (streaming generator): probe a chunk with the isolated runner, yield each record as it lands.

    Yields ("start", {"node", "pid"}) first, then ("record", record dict) per case and finally
    ("summary", {...}). Runs on the node, so the runner's worker subprocesses and their provenance are
    the node's.
    """
    import ray

    cases = [Case.from_dict(d) for d in case_dicts]
    device = settings["device"]
    probe_cfg = ProbeConfig(**{**settings["probe"], "timed_dtypes": tuple(settings["probe"]["timed_dtypes"])})
    env = dict(settings.get("extra_env") or {})
    workers = max(1, int(settings.get("workers", 1)))
    gpus = None
    if device == "cuda":
        try:
            gpus = [int(g) for g in ray.get_gpu_ids()] or None
        except (TypeError, ValueError):  # UUIDs: leave CUDA_VISIBLE_DEVICES as Ray set it
            gpus = None
        if probe_cfg.timing and PEAK_ENV not in env:
            env.update(_peak_env(gpus))
    else:
        env.setdefault("ATTNMATRIX_CPU_THREADS", str(max(1, int(settings.get("cpus", 1)) // workers)))
    cfg = RunnerConfig(workers=workers, timeout_s=settings["timeout_s"],
                       startup_timeout_s=settings["startup_timeout_s"], memory_limit_mb=settings.get("memory_limit_mb"),
                       device=device, gpus=gpus, probe=probe_cfg, extra_env=env)
    q: queue.SimpleQueue = queue.SimpleQueue()
    node = ray.get_runtime_context().get_node_id()

    def work() -> None:
        try:
            with tempfile.TemporaryDirectory(prefix="attnmatrix-ray-") as d, ResultStore(Path(d) / "chunk.jsonl") as st:
                s = run_cases(cases, st, cfg, progress=lambda r: q.put(("record", r.to_dict())))
            q.put(("summary", {"node": node, "workers_replaced": s.workers_replaced, "wall_s": s.wall_s}))
        except BaseException:  # noqa: BLE001 - handed to the generator, which raises it in the task
            q.put(("error", traceback.format_exc()))

    # run_cases reports through a callback; a thread turns that into a stream. If the Ray worker dies, the
    # runner's worker subprocesses die with it (PR_SET_PDEATHSIG).
    yield "start", {"node": node, "pid": os.getpid()}
    t = threading.Thread(target=work, name="attnmatrix-chunk", daemon=True)
    t.start()
    while True:
        kind, payload = q.get()
        if kind == "error":
            raise RuntimeError(f"probing a chunk on node {node} failed:\n{payload}")
        yield kind, payload
        if kind == "summary":
            break
    t.join()
