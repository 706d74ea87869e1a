"""The isolated runner: cases run in worker subprocesses; nothing a kernel does can stop the sweep.

- A worker that dies (segfault, abort, OOM kill) is recorded as `crash` with its signal and the tail
  of its stderr, and replaced; a case that runs past its timeout is recorded as `timeout`, its worker
  killed (the whole process group) and replaced.
- Every record is appended to the `ResultStore` (flushed and fsynced) the moment it arrives, so a
  `kill -9` of the runner loses at most the cases in flight, and a re-run skips every recorded case.
- Workers can be pinned one per GPU (CUDA_VISIBLE_DEVICES) and capped in address space.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from attnmatrix.matrix.cases import Case, check_count, check_duration
from attnmatrix.matrix.records import Record, parse_record
from attnmatrix.matrix.storage import ResultStore

from .probe import ProbeConfig
from .timing import PEAK_ENV, gpu_lock_path, peak_env


@dataclass
class RunnerConfig:
    workers: int = 1
    timeout_s: float = 120.0  # per case, from the moment the worker starts it, less its waits for the GPU lock
    startup_timeout_s: float = 180.0  # for a fresh worker to import torch and say hello
    memory_limit_mb: int | None = None  # RLIMIT_AS per worker; never on GPUs (CUDA maps huge ranges)
    device: str = "cpu"
    gpus: list[int] | None = None  # workers are spread over these GPUs, round robin
    probe: ProbeConfig = field(default_factory=ProbeConfig)
    extra_env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # The same checks as the CLI's options (matrix/cases.py): a negative timeout would record every case
        # as `timeout`, evidence against a kernel that was never given a chance.
        self.workers = check_count(self.workers, "workers")
        self.timeout_s = check_duration(self.timeout_s, "timeout_s")
        self.startup_timeout_s = check_duration(self.startup_timeout_s, "startup_timeout_s")
        if self.memory_limit_mb is not None:
            self.memory_limit_mb = check_count(self.memory_limit_mb, "memory_limit_mb")


@dataclass
class RunSummary:
    """What one sweep did, the same for every executor (local runner, Ray fleet, cross-compile)."""

    total: int = 0
    skipped: int = 0  # already in the store (resumed)
    outcomes: Counter = field(default_factory=Counter)
    wall_s: float = 0.0
    workers_replaced: int = 0
    executor: str = "local"
    # Fleet executors only: Ray tasks started and lost, cases re-queued after a lost task, the lanes and
    # nodes used, and the cases left without a record (key -> why).
    tasks: int = 0
    tasks_lost: int = 0
    requeued: int = 0
    lanes: list[str] = field(default_factory=list)
    nodes: set = field(default_factory=set)
    unprobed: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def ran(self) -> int:
        return sum(self.outcomes.values())

    def to_json(self, file: str) -> dict:
        """The summary as `probe --json` prints it."""
        data = {"file": file, "executor": self.executor, "cases": self.total, "resumed": self.skipped,
                "probed": self.ran, "outcomes": dict(sorted(self.outcomes.items())), "wall_s": round(self.wall_s, 2),
                "cases_per_min": round(self.ran / self.wall_s * 60, 1) if self.wall_s else None,
                "workers_replaced": self.workers_replaced, "unprobed": len(self.unprobed)}
        if self.executor == "ray":
            data.update({"ray_tasks": self.tasks, "ray_tasks_lost": self.tasks_lost, "requeued": self.requeued,
                         "nodes": len(self.nodes)})
        return data


_PR_SET_PDEATHSIG = 1


def _libc() -> ctypes.CDLL | None:
    """libc where prctl(PR_SET_PDEATHSIG) exists (Linux), loaded in the parent, not in the forked child."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl  # noqa: B018 - AttributeError if absent
        return libc
    except (OSError, AttributeError):
        return None


class _Worker:
    def __init__(self, slot: int, cfg: RunnerConfig):
        self.slot = slot
        env = dict(os.environ)
        env.update(cfg.extra_env)
        env["ATTNMATRIX_DEVICE"] = cfg.device
        if cfg.device == "cpu" and "ATTNMATRIX_CPU_THREADS" not in env:
            # Split the cores between CPU workers: each torch defaults to all of them, and two workers
            # on two cores then run slower than one.
            env["ATTNMATRIX_CPU_THREADS"] = str(max(1, (os.cpu_count() or 1) // max(1, cfg.workers)))
        env["PYTHONUNBUFFERED"] = "1"
        if cfg.gpus:
            gpu = cfg.gpus[slot % len(cfg.gpus)]
            env["CUDA_VISIBLE_DEVICES"] = str(gpu)
            # Workers sharing a GPU compile in parallel but take turns for timed loops.
            env["ATTNMATRIX_GPU_LOCK"] = gpu_lock_path(gpu)
        limit = cfg.memory_limit_mb
        parent = os.getpid()
        libc = _libc()

        def preexec() -> None:
            # Die with the runner, even when it is killed with SIGKILL: a worker hung in a kernel must not
            # outlive the sweep (it would hold the device while the resumed sweep runs).
            if libc is not None:
                libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
                if os.getppid() != parent:
                    os._exit(1)
            if limit:
                b = limit * 2**20
                resource.setrlimit(resource.RLIMIT_AS, (b, b))

        self.stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "attnmatrix.kernels.worker"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self.stderr, env=env, preexec_fn=preexec, start_new_session=True,
        )
        self.buf = b""
        self.hello: dict | None = None
        self.case: Case | None = None
        self.case_prov: dict | None = None
        self.deadline = time.monotonic() + cfg.startup_timeout_s
        self.waiting_since: float | None = None  # waiting for the GPU's timing lock: the case's clock stops

    def effective_deadline(self) -> float:
        return float("inf") if self.waiting_since is not None else self.deadline

    def send(self, case: Case, cfg: RunnerConfig) -> None:
        self.case, self.case_prov, self.waiting_since = case, None, None
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps({"case": case.to_dict(), "config": cfg.probe.to_dict()}) + "\n").encode())
        self.proc.stdin.flush()
        if self.hello is not None:
            self.deadline = time.monotonic() + cfg.startup_timeout_s

    def read_events(self) -> tuple[list[dict], bool]:
        """Drain what the worker has written. Returns (events, eof)."""
        assert self.proc.stdout is not None
        chunk = os.read(self.proc.stdout.fileno(), 1 << 20)
        if not chunk:
            return [], True
        self.buf += chunk
        *lines, self.buf = self.buf.split(b"\n")
        return [json.loads(x) for x in lines if x.strip()], False

    def stderr_tail(self, n: int = 1500) -> str:
        self.stderr.seek(0, os.SEEK_END)
        size = self.stderr.tell()
        self.stderr.seek(max(0, size - n))
        return self.stderr.read().decode("utf-8", "replace").strip()

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                if f:
                    f.close()
            except OSError:
                pass
        self.stderr.close()


def _exit_description(returncode: int | None) -> str:
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return f"killed by signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with status {returncode}"


def _fallback_provenance(w: _Worker) -> dict:
    prov = dict(w.case_prov or w.hello or {})
    from .env import today

    prov.setdefault("date", today())
    for k in ("device", "torch", "kernel_version"):
        prov.setdefault(k, "unknown")
    return prov


def pending_cases(cases: Iterable[Case], store: ResultStore, summary: RunSummary) -> list[Case]:
    """The cases still to probe, in order, each once; counts every distinct case in `summary.total` and
    those already in `store` in `summary.skipped` (a resumed sweep skips them)."""
    todo: list[Case] = []
    seen: set[str] = set()
    for c in cases:
        if c.key in seen:
            continue
        seen.add(c.key)
        summary.total += 1
        if c.key in store:
            summary.skipped += 1
        else:
            todo.append(c)
    return todo


def run_cases(
    cases: Iterable[Case], store: ResultStore, cfg: RunnerConfig,
    progress: Callable[[Record], None] | None = None,
) -> RunSummary:
    """Probe every case not already in `store`; each result is in the store when `progress` sees it."""
    t0 = time.monotonic()
    summary = RunSummary()
    todo: deque[Case] = deque(pending_cases(cases, store, summary))
    if todo and cfg.device == "cuda" and cfg.probe.timing and PEAK_ENV not in {**os.environ, **cfg.extra_env}:
        # This run's matmul ceiling, measured once before any worker holds the GPU, so each record's
        # TFLOP/s reads as a fraction of what this GPU reached today (kernels.timing.matmul_peak).
        cfg = replace(cfg, extra_env={**cfg.extra_env, **peak_env(cfg.gpus[0] if cfg.gpus else None)})
    # Several workers may share a GPU (JIT compiles are CPU-bound); at least one per GPU.
    nslots = max(1, cfg.workers, len(cfg.gpus or ()))
    slots: list[_Worker | None] = [None] * nslots
    sel = selectors.DefaultSelector()

    def finish(w: _Worker, rec: Record) -> None:
        store.append(rec)
        summary.outcomes[rec.outcome] += 1
        w.case = None
        if progress:
            progress(rec)

    def drop(w: _Worker) -> None:
        sel.unregister(w.proc.stdout)
        w.kill()
        slots[w.slot] = None

    requeued: Counter = Counter()

    def requeue(w: _Worker) -> bool:
        """A worker that died before it said `start` never touched its case (it died of an earlier
        case, e.g. a sticky CUDA fault, or at start-up): give the case to a fresh worker instead of
        blaming it. Twice at most, so a worker that cannot start at all still ends the sweep."""
        assert w.case is not None
        if w.case_prov is not None or requeued[w.case.key] >= 2:
            return False
        requeued[w.case.key] += 1
        todo.appendleft(w.case)
        w.case = None
        drop(w)
        summary.workers_replaced += 1
        return True

    def retire(w: _Worker, outcome: str, reason: str) -> None:
        assert w.case is not None
        rec = Record(case=w.case, outcome=outcome, tier="validated", provenance=_fallback_provenance(w),
                     reason=reason, run_id=cfg.probe.run_id)
        drop(w)
        summary.workers_replaced += 1
        finish(w, rec)

    try:
        while todo or any(w and w.case for w in slots):
            for i in range(nslots):
                if todo and (slots[i] is None or slots[i].case is None):
                    if slots[i] is None:
                        slots[i] = _Worker(i, cfg)
                        sel.register(slots[i].proc.stdout, selectors.EVENT_READ, slots[i])
                    try:
                        slots[i].send(todo.popleft(), cfg)
                    except BrokenPipeError:
                        w = slots[i]
                        w.proc.wait()
                        if not requeue(w):
                            retire(w, "crash", f"worker {_exit_description(w.proc.returncode)} before taking "
                                   f"the case; stderr tail: {w.stderr_tail()}")
            busy = [w for w in slots if w and w.case]
            if not busy:
                continue
            wait = max(0.0, min(w.effective_deadline() for w in busy) - time.monotonic())
            for key, _ in sel.select(timeout=min(wait, 1.0)):
                w: _Worker = key.data
                events, eof = w.read_events()
                for ev in events:
                    if ev["event"] == "hello":
                        w.hello = ev["provenance"]
                    elif ev["event"] == "start":
                        w.case_prov = ev["provenance"]
                        w.deadline = time.monotonic() + cfg.timeout_s
                    elif ev["event"] == "gpu_lock":
                        # Waiting for other workers' timed loops is not this case's time: stop its clock,
                        # and add the wait to its deadline. A lock holder that hangs is killed at its own
                        # deadline, which frees the lock.
                        if ev["waiting"]:
                            w.waiting_since = time.monotonic()
                        elif w.waiting_since is not None:
                            w.deadline += time.monotonic() - w.waiting_since
                            w.waiting_since = None
                    elif ev["event"] == "result" and w.case is not None:
                        rec = parse_record(ev["record"])
                        finish(w, rec)
                        if rec.extra.get("device_fault"):
                            drop(w)  # it exits now (worker.py): it must not be handed the next case
                if eof and slots[w.slot] is w:
                    w.proc.wait()
                    if w.case is not None and not requeue(w):
                        tail = w.stderr_tail()
                        retire(w, "crash", f"worker {_exit_description(w.proc.returncode)} while running "
                               f"the case" + (f"; stderr tail: {tail}" if tail else ""))
                    elif slots[w.slot] is w:
                        drop(w)
            now = time.monotonic()
            for w in list(slots):
                if w and w.case is not None and now > w.effective_deadline():
                    phase = "case" if w.case_prov is not None else "worker start-up"
                    limit = cfg.timeout_s if w.case_prov is not None else cfg.startup_timeout_s
                    retire(w, "timeout", f"no result within {limit:g} s ({phase}); worker killed")
    finally:
        for w in slots:
            if w is not None:
                try:
                    sel.unregister(w.proc.stdout)
                except (KeyError, ValueError):
                    pass
                w.kill()
        sel.close()
    summary.wall_s = time.monotonic() - t0
    return summary
