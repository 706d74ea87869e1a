"""Fleet probing through Ray: one sweep over the GPUs of many machines, into one resumable store.

`attnmatrix probe --executor ray` runs here. Ray is imported lazily, only by the functions of this module
and of its two parts, `ray_cluster` (connecting, lanes) and `ray_task` (what a task runs on a node): the rest of
attnmatrix imports and works without Ray installed (`pip install 'attnmatrix[ray]'`).

Design (the decisions, and why):

- **The driver owns the store.** Cases are probed on the nodes; their records stream back to the
  driver, which appends each to the one `ResultStore` (fsynced JSONL) only if its key is not there yet.
  Resuming, de-duplication and a driver killed with `kill -9` behave exactly as with the local executor.
- **Lanes, one per GPU type.** A case's arch (part of its key) is the GPU type it must run on. The
  driver reads the live nodes' resources and forms *lanes*: (arch, the Ray resource that selects its
  nodes, how many tasks can run there at once). A node labelled with the custom resource
  `attnmatrix_arch_<arch>` (e.g. `ray start --resources '{"attnmatrix_arch_sm_90": 8}'`) belongs to that
  arch, whatever its GPU; an unlabelled GPU node is placed by Ray's own accelerator-type resource
  (`accelerator_type:H200` -> sm_90, table `ray_cluster.ACCELERATOR_ARCH`). A lane's capacity is its nodes' GPU
  count (one task per GPU); for arch `cpu` it is their CPUs divided by the CPUs a task takes. Tasks ask
  for 0.001 of the lane resource (a label, as Ray's own `accelerator_type=` option does) plus one GPU.
- **Chunks as streaming tasks.** Each arch's cases are cut into small chunks; a chunk is one Ray task
  (a streaming generator) that runs the *existing isolated runner* (`run_cases`: worker subprocesses, so
  a kernel's segfault or hang is still a `crash` / `timeout` record, and the provenance is the node's)
  into a temporary store on the node, and yields every record the moment it is written. The driver keeps
  at most `capacity` chunks in flight per lane and hands out the next chunk to whichever lane frees up,
  so faster nodes take more chunks.
- **A dying node loses only its cases in flight.** Tasks run with `max_retries=0`: when a task fails
  (its node died, its Ray worker was killed), the driver re-queues the cases of its chunk that have no
  record yet — finished ones are already in the store and are never re-run or duplicated. A case whose
  task is lost `max_attempts` times is left unrecorded and reported (a re-run resumes it): losing a node
  is not evidence about a kernel, so it is never recorded as a `crash`.
- **Lanes are re-read while the sweep runs** (every few seconds and after each lost task), so nodes that
  join are used; an arch that has no node left for `lane_grace_s` seconds is given up, its cases reported
  as not probed.
- **A mislabelled node stops the sweep.** A record whose measured GPU capability is not the arch of its
  case (a node labelled sm_90 that has an A100) is not stored; the sweep aborts and names the node.
- **Chunks bound the imbalance, not the loss** (records stream, so a lost task loses only its case in
  flight). Each chunk pays one worker start-up (importing torch, initialising CUDA), so chunks are not
  tiny: the default gives every slot about two chunks of at least `MIN_AUTO_CHUNK` cases, capped at
  `MAX_AUTO_CHUNK` (a big GPU sweep is then many chunks, handed out to whichever node is free).
  `benchmarks/bench_ray.py` measures the cost; runner workers are not reused across chunks (a possible
  improvement, which would need the runner to keep its workers between `run_cases` calls).
"""

from __future__ import annotations

import math
import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from attnmatrix.matrix.cases import Case, CaseError, normalize_arch
from attnmatrix.matrix.records import Record, parse_record
from attnmatrix.matrix.storage import ResultStore

from .ray_cluster import ARCH_RESOURCE_PREFIX, Lane, import_ray, live_lanes
from .ray_task import probe_chunk
from .runner import RunnerConfig, RunSummary, pending_cases

MIN_AUTO_CHUNK, MAX_AUTO_CHUNK = 16, 64
LABEL_AMOUNT = 0.001  # how much of a label resource a task asks for: any node that has the label fits


class FleetError(RuntimeError):
    """The fleet cannot run the sweep as asked (no node for an arch, a mislabelled node ...)."""


def auto_chunk_size(n_cases: int, capacity: int) -> int:
    """About two chunks per slot, so the last chunks even out the load; but at least MIN_AUTO_CHUNK cases
    (each chunk pays a worker start-up), unless that would leave a slot idle; at most MAX_AUTO_CHUNK, so
    a big sweep is spread in many chunks and a fast node takes more of them."""
    cap = max(1, capacity)
    size = max(MIN_AUTO_CHUNK, math.ceil(n_cases / (2 * cap)))
    return max(1, min(size, math.ceil(n_cases / cap), MAX_AUTO_CHUNK))


def check_arch(rec: Record) -> str | None:
    """Why `rec` cannot be evidence for its case's arch (the GPU that ran it is another arch), or None."""
    cap = rec.provenance.get("capability")
    if rec.case.arch == "cpu" or not cap:
        return None
    try:
        ran_on = normalize_arch(str(cap))
    except CaseError:
        return None
    if ran_on != rec.case.arch:
        return (f"case {rec.key} ran on a GPU of capability {cap} ({ran_on}, "
                f"{rec.provenance.get('device', 'unknown device')}), not {rec.case.arch}")
    return None


# --- the driver ------------------------------------------------------------------------------------------


@dataclass
class FleetConfig:
    chunk_size: int | None = None  # cases per task; None: auto_chunk_size
    cpus_per_task: int = 1  # CPU lanes: CPUs a task takes (and runner workers it starts)
    max_attempts: int = 3  # tasks lost (node died) per case before it is given up
    lane_grace_s: float = 60.0  # how long an arch may have no live node before its cases are given up
    refresh_s: float = 5.0  # how often the lanes are re-read from the cluster


# The fleet's summary is the runner's: one summary type for every executor (`executor="ray"`).
FleetSummary = RunSummary


@dataclass
class _Flight:
    lane: Lane
    chunk: list[Case]
    keys: set[str]
    node: str | None = None  # known from the task's first message


def _cancel(ray, gen: object) -> None:
    """Stop a task for good: force kills its Ray worker, and with it the runner's workers (PDEATHSIG)."""
    try:
        ray.cancel(gen, force=True)
    except Exception:  # noqa: BLE001 - best effort: the task may be gone already
        pass


def _settings(cfg: RunnerConfig, device: str, fleet: FleetConfig) -> dict:
    workers = fleet.cpus_per_task if device == "cpu" else max(1, cfg.workers)
    return {"device": device, "probe": cfg.probe.to_dict(), "extra_env": dict(cfg.extra_env),
            "workers": workers, "cpus": fleet.cpus_per_task, "timeout_s": cfg.timeout_s,
            "startup_timeout_s": cfg.startup_timeout_s, "memory_limit_mb": cfg.memory_limit_mb}


def run_cases_ray(
    cases: Iterable[Case], store: ResultStore, cfg: RunnerConfig, fleet: FleetConfig | None = None,
    progress: Callable[[Record], None] | None = None, *, ray=None,
    on_event: Callable[[str, dict], None] | None = None,
) -> FleetSummary:
    """Probe every case not already in `store` on the Ray cluster this process is connected to.

    `cfg` is the runner configuration a task uses on its node (`device`, `gpus` and `workers` are set per
    lane: one GPU per task, `cfg.workers` runner workers sharing it; on CPU lanes `fleet.cpus_per_task`).
    Each record is in the store when `progress` sees it. `on_event(kind, info)` hears about tasks:
    "task_started" (node, arch, keys) when a task starts on its node, "task_record" (node, key) for every
    record a task returns (before de-duplication), "task_lost" (node, arch, error, requeued, given_up)
    when one is lost.
    """
    ray = ray or import_ray()
    fleet = fleet or FleetConfig()
    t0 = time.monotonic()
    summary = RunSummary(executor="ray")
    todo: dict[str, list[Case]] = defaultdict(list)
    for c in pending_cases(cases, store, summary):
        todo[c.arch].append(c)

    lanes, notes = live_lanes(ray, cpus_per_task=fleet.cpus_per_task)
    summary.notes += notes
    summary.lanes = [lane.describe() for lane in lanes]
    pending: dict[str, deque[list[Case]]] = {}
    for arch, arch_cases in todo.items():
        cap = sum(lane.capacity for lane in lanes if lane.arch == arch)
        size = fleet.chunk_size or auto_chunk_size(len(arch_cases), cap)
        pending[arch] = deque(arch_cases[i:i + size] for i in range(0, len(arch_cases), size))
    attempts: Counter[str] = Counter()
    last_error: dict[str, str] = {}
    inflight: dict[object, _Flight] = {}
    load: Counter[tuple] = Counter()
    arch_gone_since: dict[str, float] = {}
    lane_gone_since: dict[tuple, float] = {}
    remote = ray.remote(probe_chunk)

    def submit(lane: Lane, chunk: list[Case]) -> None:
        settings = _settings(cfg, lane.device, fleet)
        opts: dict = {"num_returns": "streaming", "max_retries": 0, "name": f"attnmatrix-probe-{lane.arch}"}
        if lane.device == "cpu":
            opts["num_cpus"] = fleet.cpus_per_task
        else:
            opts["num_cpus"], opts["num_gpus"] = 1, 1
        if lane.resource:
            opts["resources"] = {lane.resource: LABEL_AMOUNT}
        gen = remote.options(**opts).remote([c.to_dict() for c in chunk], settings)
        inflight[gen] = _Flight(lane, chunk, {c.key for c in chunk})
        load[lane.key] += 1
        summary.tasks += 1

    def land(fl: _Flight, rec: Record) -> None:
        if on_event:
            on_event("task_record", {"node": fl.node, "key": rec.key})
        if rec.key not in fl.keys or rec.key in store:
            return  # not this chunk's, or already recorded (never twice)
        why = check_arch(rec)
        if why:
            raise FleetError(f"{why}: its node is in lane {fl.lane.describe()}; fix the node's "
                             f"{ARCH_RESOURCE_PREFIX}<arch> resource (or its accelerator type) and re-run")
        store.append(rec)
        summary.outcomes[rec.outcome] += 1
        if progress:
            progress(rec)

    def retire(gen: object, error: str | None) -> None:
        fl = inflight.pop(gen)
        load[fl.lane.key] -= 1
        left = [c for c in fl.chunk if c.key not in store]
        if not left:
            return
        if error is None:  # the task ended without a record for some of its cases: should not happen
            error = "the task ended without recording the case"
        summary.tasks_lost += 1
        retry = []
        for c in left:
            attempts[c.key] += 1
            last_error[c.key] = error
            if attempts[c.key] >= fleet.max_attempts:
                summary.unprobed[c.key] = f"its task was lost {attempts[c.key]} times; last: {error}"
            else:
                retry.append(c)
        if retry:
            summary.requeued += len(retry)
            pending[fl.lane.arch].appendleft(retry)
        if on_event:
            on_event("task_lost", {"node": fl.node, "arch": fl.lane.arch, "error": error, "requeued": len(retry),
                                   "given_up": len(left) - len(retry)})

    def refresh() -> None:
        nonlocal lanes
        fresh, _ = live_lanes(ray, cpus_per_task=fleet.cpus_per_task)
        lanes = fresh
        for lane in fresh:
            if lane.describe() not in summary.lanes:
                summary.lanes.append(lane.describe())

    last_refresh = time.monotonic()
    try:
        while any(pending.values()) or inflight:
            now = time.monotonic()
            if now - last_refresh > fleet.refresh_s:
                refresh()
                last_refresh = now
            for lane in lanes:
                q = pending.get(lane.arch)
                while q and load[lane.key] < lane.capacity:
                    submit(lane, q.popleft())
            # An arch with cases left and no live lane (none ever, or its nodes died): wait, then give up.
            for arch, q in pending.items():
                busy = any(fl.lane.arch == arch for fl in inflight.values())
                if not q or busy or any(lane.arch == arch and lane.capacity for lane in lanes):
                    arch_gone_since.pop(arch, None)
                    continue
                since = arch_gone_since.setdefault(arch, now)
                if now - since >= fleet.lane_grace_s:
                    why = f"no live node of arch {arch} in the cluster for {fleet.lane_grace_s:g} s"
                    while q:
                        for c in q.popleft():
                            lost = last_error.get(c.key)
                            summary.unprobed[c.key] = why + (f" (its last task was lost: {lost})" if lost else "")
            # A task on a lane that vanished may wait for its resources forever: give it the same grace.
            live = {lane.key for lane in lanes if lane.capacity}
            for gen, fl in list(inflight.items()):
                if fl.lane.key in live:
                    lane_gone_since.pop(fl.lane.key, None)
                elif now - lane_gone_since.setdefault(fl.lane.key, now) >= fleet.lane_grace_s:
                    _cancel(ray, gen)
                    retire(gen, f"lane {fl.lane.arch} via {fl.lane.resource or 'CPU'} has no live node")
            if not inflight:
                if any(pending.values()):
                    time.sleep(min(1.0, fleet.refresh_s))
                    refresh()
                    last_refresh = time.monotonic()
                continue
            gens = list(inflight)
            ready, _ = ray.wait(gens, num_returns=1, timeout=1.0)
            if ready:
                ready, _ = ray.wait(gens, num_returns=len(gens), timeout=0)
            for gen in ready:
                fl = inflight[gen]
                try:
                    ref = next(gen)
                    kind, payload = ray.get(ref)
                except StopIteration:
                    retire(gen, None)
                    continue
                except Exception as e:  # noqa: BLE001 - the task is lost: node died, worker killed, chunk failed
                    retire(gen, f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}")
                    refresh()
                    last_refresh = time.monotonic()
                    continue
                if kind == "record":
                    land(fl, parse_record(payload))
                elif kind == "start":
                    fl.node = payload.get("node")
                    summary.nodes.add(fl.node)
                    if on_event:
                        on_event("task_started", {"node": fl.node, "arch": fl.lane.arch,
                                                  "keys": [c.key for c in fl.chunk]})
                elif kind == "summary":
                    summary.workers_replaced += payload.get("workers_replaced", 0)
    finally:
        for gen in list(inflight):
            _cancel(ray, gen)
    summary.wall_s = time.monotonic() - t0
    return summary
