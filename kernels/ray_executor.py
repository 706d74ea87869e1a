"""Fleet probing through Ray: one sweep over the GPUs of many machines, into one resumable store.

`attnmatrix probe --executor ray` runs here. Ray is imported lazily, only by this module's functions:
the rest of attnmatrix imports and works without Ray installed (`pip install 'attnmatrix[ray]'`).

Design (the decisions, and why):

- **The driver owns the store.** Cases are probed on the nodes; their records stream back to the
  driver, which appends each to the one `ResultStore` (fsynced JSONL) only if its key is not there yet.
  Resuming, de-duplication and a driver killed with `kill -9` behave exactly as with the local executor.
- **Lanes, one per GPU type.** A case's arch (part of its key) is the GPU type it must run on. The
  driver reads the live nodes' resources and forms *lanes*: (arch, the Ray resource that selects its
  nodes, how many tasks can run there at once). A node labelled with the custom resource
  `attnmatrix_arch_<arch>` (e.g. `ray start --resources '{"attnmatrix_arch_sm_90": 8}'`) belongs to that
  arch, whatever its GPU; an unlabelled GPU node is placed by Ray's own accelerator-type resource
  (`accelerator_type:H200` -> sm_90, table `ACCELERATOR_ARCH`). A lane's capacity is its nodes' GPU
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

import logging
import math
import os
import queue
import tempfile
import threading
import time
import traceback
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from attnmatrix.matrix.cases import Case, CaseError, normalize_arch
from attnmatrix.matrix.records import Record, parse_record
from attnmatrix.matrix.storage import ResultStore

from .probe import ProbeConfig
from .runner import RunnerConfig, RunSummary, pending_cases, run_cases
from .timing import PEAK_ENV, peak_env

ARCH_RESOURCE_PREFIX = "attnmatrix_arch_"
ACCELERATOR_RESOURCE_PREFIX = "accelerator_type:"
INSTALL_HINT = "pip install 'attnmatrix[ray]'"
MIN_AUTO_CHUNK, MAX_AUTO_CHUNK = 16, 64
LABEL_AMOUNT = 0.001  # how much of a label resource a task asks for: any node that has the label fits

# Ray's accelerator types (ray.util.accelerators) -> the matrix arch of that GPU. A GPU missing here is
# placed by labelling its nodes with `attnmatrix_arch_<arch>` instead.
ACCELERATOR_ARCH: dict[str, str] = {
    "V100": "sm_70",
    "T4": "sm_75",
    "A100": "sm_80", "A100-40G": "sm_80", "A100-80G": "sm_80",
    "A10G": "sm_86",
    "L4": "sm_89", "L40S": "sm_89",
    "H100": "sm_90", "H200": "sm_90", "H20": "sm_90", "GH200": "sm_90",
    "B200": "sm_100", "GB200": "sm_100",
    "B300": "sm_103", "GB300": "sm_103",
    "RTX-PRO-6000": "sm_120",
}


class RayMissing(RuntimeError):
    """Ray is not installed; the message says how to install it."""


class FleetError(RuntimeError):
    """The fleet cannot run the sweep as asked (no node for an arch, a mislabelled node ...)."""


def import_ray():
    """`import ray`, or RayMissing with the install command."""
    try:
        import ray
    except ImportError as e:
        raise RayMissing(f"the ray executor needs Ray, which is not installed ({e}): {INSTALL_HINT}") from None
    return ray


@contextmanager
def ray_session(address: str | None = None, **init_kwargs) -> Iterator[object]:
    """Connect to the Ray cluster at `address` (`auto`: the one `ray start --head` runs on this machine), or
    start a new local Ray instance without one. A Ray already initialised in this process is used as it is and
    left running; one started here is shut down on exit."""
    ray = import_ray()
    if ray.is_initialized():
        yield ray
        return
    kwargs = {"logging_level": logging.WARNING, "log_to_driver": False, **init_kwargs}
    if address:
        kwargs["address"] = address
    else:
        # "local": always a new instance. Without an address Ray would first look for a cluster that
        # `ray start` left on this machine, and wait for it, possibly forever, if it is gone.
        kwargs["address"] = "local"
        kwargs.setdefault("include_dashboard", False)
    ray.init(**kwargs)
    try:
        yield ray
    finally:
        ray.shutdown()


# --- lanes ------------------------------------------------------------------------------------------------


@dataclass
class Lane:
    """Where the cases of one arch can run: the nodes selected by `resource`, `capacity` tasks at once."""

    arch: str
    resource: str | None  # the label a task asks for (None: any node with CPUs, arch `cpu` only)
    capacity: int
    nodes: list[str] = field(default_factory=list)  # node ids (short)

    @property
    def key(self) -> tuple[str, str | None]:
        return (self.arch, self.resource)

    @property
    def device(self) -> str:
        return "cpu" if self.arch == "cpu" else "cuda"

    def describe(self) -> str:
        via = self.resource or "CPU"
        return f"{self.arch} via {via}: {self.capacity} slot(s) on {len(self.nodes)} node(s)"


def discover_lanes(nodes: Iterable[dict], *, cpus_per_task: int = 1) -> tuple[list[Lane], list[str]]:
    """The lanes that the live `nodes` (as `ray.nodes()` lists them) offer, and notes on nodes left out.

    Pure function of the node list, so the mapping is testable without a cluster.
    """
    nodes = [n for n in nodes if n.get("Alive", n.get("alive", False))]
    labelled_cpu = any(f"{ARCH_RESOURCE_PREFIX}cpu" in (n.get("Resources") or {}) for n in nodes)
    lanes: dict[tuple[str, str | None], Lane] = {}
    notes: list[str] = []

    def add(arch: str, resource: str | None, capacity: int, node: str) -> None:
        if capacity <= 0:
            return
        lane = lanes.setdefault((arch, resource), Lane(arch, resource, 0))
        lane.capacity += capacity
        lane.nodes.append(node)

    for n in nodes:
        res = n.get("Resources") or {}
        node = str(n.get("NodeID", "?"))[:8]
        gpus = int(res.get("GPU", 0))
        cpu_slots = int(res.get("CPU", 0) // max(1, cpus_per_task))
        labels = [k for k in res if k.startswith(ARCH_RESOURCE_PREFIX)]
        gpu_labelled = False
        for k in labels:
            try:
                arch = normalize_arch(k[len(ARCH_RESOURCE_PREFIX):])
            except CaseError:
                notes.append(f"node {node}: resource {k!r} names no arch (e.g. {ARCH_RESOURCE_PREFIX}sm_90); ignored")
                continue
            if arch == "cpu":
                add("cpu", k, cpu_slots, node)
            else:
                gpu_labelled = True
                add(arch, k, gpus, node)
                if not gpus:
                    notes.append(f"node {node}: labelled {k} but has no GPU resource; ignored")
        if not labelled_cpu:
            add("cpu", None, cpu_slots, node)
        if gpu_labelled or not gpus:
            continue
        types = [k[len(ACCELERATOR_RESOURCE_PREFIX):] for k in res if k.startswith(ACCELERATOR_RESOURCE_PREFIX)]
        known = [t for t in types if t in ACCELERATOR_ARCH]
        if known:
            add(ACCELERATOR_ARCH[known[0]], ACCELERATOR_RESOURCE_PREFIX + known[0], gpus, node)
        else:
            what = f"GPU type {', '.join(types)}" if types else "GPUs of no known type"
            notes.append(f"node {node}: {gpus} {what}; label it with --resources "
                         f"'{{\"{ARCH_RESOURCE_PREFIX}sm_XX\": {gpus}}}' to probe it")
    return sorted(lanes.values(), key=lambda lane: (lane.arch, lane.resource or "")), notes


def live_lanes(ray, *, cpus_per_task: int = 1) -> tuple[list[Lane], list[str]]:
    return discover_lanes(ray.nodes(), cpus_per_task=cpus_per_task)


def fleet_device(lanes: list[Lane], device: str) -> str:
    """`auto`: the GPUs if the fleet has any, else the CPUs."""
    if device != "auto":
        return device
    return "cuda" if any(lane.arch != "cpu" for lane in lanes) else "cpu"


def fleet_archs(lanes: list[Lane], device: str) -> list[str]:
    """The archs the fleet can probe on `device` (`cpu` or `cuda`)."""
    return sorted({lane.arch for lane in lanes if (lane.arch == "cpu") == (device == "cpu")})


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


# --- what a task runs on a node ---------------------------------------------------------------------------

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
