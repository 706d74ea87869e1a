"""The workflows behind the command line: what to probe, where, and what a result means for the matrix.

The CLI parses options and prints; the decisions live here, each once:

- which backends can be probed on this machine (installed, and for this device): `plan_backends`;
- which cases a `run` skips because the matrix already has them from this hardware: `recorded_here`;
- which claims `check --reprobe` re-checks (installed backends only, optionally a stratified sample), and
  whether each still holds: `reprobe_claims`, `stratified_sample`, `broken_claims`;
- how a sweep runs: one `Executor` interface with a local and a Ray implementation, both returning the
  one summary type (`RunSummary`), through `probe_into`; how its workers are configured (`runner_config`);
- what a Ray cluster offers a sweep (`read_fleet`), which cross-compile targets and backends `xcompile` takes
  (`compile_targets`, `cross_compile`), what a flashinfer-cubin wheel ships (`read_cubin_wheel`).

The command line reaches the kernels (kernels/) through this module only (tests/test_import_direction.py). The
kernels' modules import torch: every function here imports them when called, so a command that does not probe
does not pay for them; the kernels' errors that a command catches are looked up the same way (`__getattr__`).
"""

from __future__ import annotations

import hashlib
import os
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from attnmatrix.matrix import backends as registry
from attnmatrix.matrix.cases import DTYPES, Case, CaseError, normalize_arch
from attnmatrix.matrix.evidence import Evidence
from attnmatrix.matrix.policy import SUPPORTED, ResolvedCell, ResolvedMatrix
from attnmatrix.matrix.records import Record
from attnmatrix.matrix.storage import ResultStore

if TYPE_CHECKING:  # the runner imports torch: only the commands that probe pay for it
    from contextlib import AbstractContextManager

    from attnmatrix.kernels.ray_cluster import Lane
    from attnmatrix.kernels.runner import RunnerConfig, RunSummary
    from attnmatrix.kernels.trtllm_cubins import KernelTable

__all__ = ["Executor", "LocalExecutor", "RayExecutor", "BackendPlan", "plan_backends",
           "recorded_here", "reprobe_claims", "stratified_sample", "broken_claims", "new_run_id", "probe_into",
           "default_workers", "local_arch", "device_provenance", "runner_config", "matmul_peak", "require_ray",
           "ray_session", "Fleet", "read_fleet", "not_cross_compilable", "cross_compilable_backends",
           "compile_targets", "cross_compile", "ShippedCubins", "read_cubin_wheel"]


def __getattr__(name: str) -> type[Exception]:
    """The kernels' errors a command catches (`except workflow.FleetError`), imported when first asked for
    (PEP 562): the modules that raise them import torch."""
    if name == "RayMissing":  # Ray is not installed; the message says how to install it
        from attnmatrix.kernels.ray_cluster import RayMissing

        return RayMissing
    if name == "FleetError":  # the fleet cannot run the sweep as asked (a mislabelled node)
        from attnmatrix.kernels.ray_executor import FleetError

        return FleetError
    if name == "CubinError":  # a file that is not a flashinfer-cubin wheel, or its kernel table unreadable
        from attnmatrix.kernels.trtllm_cubins import CubinError

        return CubinError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def new_run_id() -> str:
    """A run id: the UTC date and 8 random hex digits. Every sweep and every cross-compile gets one, so two
    runs of the same case are two pieces of evidence, never a contradiction."""
    return f"{time.strftime('%Y%m%d', time.gmtime())}-{uuid.uuid4().hex[:8]}"


def default_workers() -> int:
    """All the machine's cores: JIT compiles and reference checks are CPU-bound even when kernels run on a GPU."""
    return max(2, os.cpu_count() or 2)


# --- which backends ------------------------------------------------------------------------------------------


@dataclass
class BackendPlan:
    """The backends asked for, split by what this machine can do with them."""

    ready: list[str] = field(default_factory=list)  # installed, for this device: probe these
    not_installed: dict[str, str] = field(default_factory=dict)  # name -> why it does not import
    wrong_device: list[str] = field(default_factory=list)  # GPU-only backends on a machine without a GPU


def plan_backends(names: Iterable[str], device: str, *, check_installed: bool = True) -> BackendPlan:
    """Split `names` for a sweep on `device` ("cuda" or "cpu"). A backend that is not installed is reported,
    never probed: an `unavailable` record says nothing about the kernel. A CPU sweep cannot run a GPU-only
    backend; a GPU sweep does run CPU backends' GPU counterparts only (a `cpu` backend is for arch `cpu`)."""
    plan = BackendPlan()
    for name in names:
        info = registry.info(name)
        if info.device != device:
            plan.wrong_device.append(name)
            continue
        why = _availability(name) if check_installed else None
        if why:
            plan.not_installed[name] = why
        else:
            plan.ready.append(name)
    return plan


def _availability(name: str) -> str | None:
    from attnmatrix.kernels.base import load_backend

    try:
        return load_backend(name).availability()
    except Exception as e:  # noqa: BLE001 - a glue module that cannot import is as absent as its library
        return f"cannot load the backend module: {type(e).__name__}: {e}"


def backends_for(device: str) -> list[str]:
    """The product's backends for `device` (plugins, such as test fakes, only when named explicitly)."""
    return [n for n in registry.names(include_plugins=False) if registry.info(n).device == device]


# --- the skip rule of `run` ------------------------------------------------------------------------------------


def recorded_here(ev: Evidence, arch: str, here: dict) -> set[str]:
    """Keys of the cases the matrix already has as validated evidence from this hardware and torch build:
    `run` does not probe them again (use --reprobe to re-measure)."""
    return {rec.key for rec in ev.records
            if rec.tier == "validated" and rec.case.arch == arch and rec.outcome != "unavailable"
            and rec.provenance.get("device") == here.get("device") and rec.provenance.get("torch") == here.get("torch")}


# --- the reprobe policy of `check --reprobe` ---------------------------------------------------------------------


def reprobe_claims(m: ResolvedMatrix, arch: str, installed: Iterable[str]) -> list[ResolvedCell]:
    """The validated claims about `arch` for backends installed here, in key order. Claims of other backends
    are not re-checked: a backend that is not installed cannot confirm or refute anything."""
    have = set(installed)
    return sorted((c for c in m.cells.values() if c.case.arch == arch and c.tier == "validated"
                   and c.case.backend in have), key=lambda c: c.case.key)


def _stable_hash(text: str, seed: int) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{text}".encode()).digest()[:8], "big")


def _round_robin(groups: dict, seed: int) -> list:
    """One from each group, then a second from each, ...: every group is represented early. The groups take
    their turns in an order drawn from `seed`."""
    lists = [list(groups[k]) for k in sorted(groups, key=lambda k: (_stable_hash(repr(k), seed), repr(k)))]
    out: list = []
    while any(lists):
        for lst in lists:
            if lst:
                out.append(lst.pop(0))
    return out


def stratified_sample(cells: Sequence[ResolvedCell], n: int, *, seed: int = 0) -> list[ResolvedCell]:
    """At most `n` cells spread evenly over backends, head dims and feature sets.

    Backends take turns; within a backend its head dims take turns; within a head dim its feature sets take
    turns (round robin at every level), so every backend is represented before any gets a second cell, every
    head dim of a backend before any gets a second, and so on down. Which group goes first, and the order
    within a (backend, head dims, feature set) group, is a hash of the keys and `seed`: deterministic, and
    another seed draws another sample. Returned in key order.
    """
    tree: dict[str, dict[tuple, dict[tuple, list[ResolvedCell]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(list)))
    for c in cells:
        tree[c.case.backend][(c.case.head_dim, c.case.head_dim_v)][c.case.features].append(c)
    per_backend = {}
    for b, dims in tree.items():
        per_dim = {}
        for hd, feats in dims.items():
            per_dim[hd] = _round_robin({f: sorted(g, key=lambda c: _stable_hash(c.case.key, seed))
                                        for f, g in feats.items()}, seed)
        per_backend[b] = _round_robin(per_dim, seed)
    # Backends in name order: each gets its share whatever the seed.
    lists = [per_backend[b] for b in sorted(per_backend)]
    out: list[ResolvedCell] = []
    while any(lists) and len(out) < n:
        for lst in lists:
            if lst and len(out) < n:
                out.append(lst.pop(0))
    return sorted(out, key=lambda c: c.case.key)


def broken_claims(claims: Iterable[ResolvedCell], now: dict[str, Record]
                  ) -> list[tuple[ResolvedCell, Record | None]]:
    """The claims that the new records do not confirm: a supported cell must pass again, an unsupported one
    must still not pass. A claim without a new record is broken too (the probe did not finish)."""
    out = []
    for c in claims:
        rec = now.get(c.case.key)
        if rec is None or (rec.outcome == "pass") != (c.status == SUPPORTED):
            out.append((c, rec))
    return out


# --- executors ------------------------------------------------------------------------------------------------


class Executor(Protocol):
    """Runs cases, appending each record to the store as it finishes; returns what it did."""

    name: str

    def run(self, cases: list[Case], store: ResultStore, progress: Callable[[Record], None] | None,
            on_event: Callable[[str, dict], None] | None = None) -> RunSummary: ...


@dataclass
class LocalExecutor:
    """This machine: isolated worker subprocesses (kernels/runner.py), spread over its GPUs."""

    cfg: RunnerConfig
    name: str = "local"

    def run(self, cases, store, progress, on_event=None) -> RunSummary:
        from attnmatrix.kernels.runner import run_cases

        return run_cases(cases, store, self.cfg, progress=progress)


@dataclass
class RayExecutor:
    """A Ray cluster: chunks of cases as tasks on nodes of their arch (kernels/ray_executor.py)."""

    cfg: RunnerConfig
    ray: object  # the connected Ray module (`ray_session`)
    chunk_size: int | None = None  # cases per task (None: about two tasks per slot, kernels/ray_executor.py)
    cpus_per_task: int = 1  # CPU lanes: CPUs a task takes (and runner workers it starts)
    name: str = "ray"

    def run(self, cases, store, progress, on_event=None) -> RunSummary:
        from attnmatrix.kernels import ray_executor as rx

        fleet = rx.FleetConfig(chunk_size=self.chunk_size, cpus_per_task=self.cpus_per_task)
        return rx.run_cases_ray(cases, store, self.cfg, fleet, progress=progress, ray=self.ray, on_event=on_event)


def probe_into(cases: list[Case], out: Path, executor: Executor, *,
               on_open: Callable[[ResultStore, int], Callable[[Record], None] | None] | None = None,
               on_event: Callable[[str, dict], None] | None = None) -> RunSummary:
    """Probe `cases` into the result file `out` (resumed if it exists; refused if it is not a result file)
    with `executor`. `on_open(store, todo)` is called once the store is open and may return a progress
    callback (the CLI's progress bar)."""
    with ResultStore(out) as store:
        todo = len({c.key for c in cases if c.key not in store})
        progress = on_open(store, todo) if on_open else None
        return executor.run(cases, store, progress, on_event)


# --- this machine ---------------------------------------------------------------------------------------------


def local_arch(device: str) -> str:
    """The matrix arch of this machine's `device`: `sm_90` for an H200, `cpu` without a GPU."""
    from attnmatrix.kernels.env import local_arch as arch_of

    return arch_of(device)


def device_provenance(device: str) -> dict:
    """The machine and software stack a record made here carries (device, driver, CUDA, torch, ...)."""
    from attnmatrix.kernels.env import device_provenance as provenance

    return provenance(device)


def runner_config(*, device: str, workers: int, timeout_s: float, memory_limit_mb: int | None = None,
                  gpus: list[int] | None = None, timing: bool = True, timed_dtypes: tuple[str, ...] = tuple(DTYPES),
                  budget_ms: float = 40.0, extra_env: dict[str, str] | None = None) -> RunnerConfig:
    """How a sweep's workers probe: the probe's settings under a new run id (`new_run_id`), and the runner's."""
    from attnmatrix.kernels.probe import ProbeConfig
    from attnmatrix.kernels.runner import RunnerConfig

    probe = ProbeConfig(timing=timing, run_id=new_run_id(), timed_dtypes=timed_dtypes, budget_ms=budget_ms)
    return RunnerConfig(workers=workers, timeout_s=timeout_s, memory_limit_mb=memory_limit_mb, device=device,
                        gpus=gpus, probe=probe, extra_env=dict(extra_env or {}))


def matmul_peak(gpu: int | None) -> tuple[dict[str, str], str | None]:
    """The GPU's bf16 matmul peak as the environment the workers read (empty when it could not be measured), and
    as text ("990 TFLOP/s (method)"). Measured in a subprocess: this process must not hold a CUDA context its
    workers inherit."""
    from attnmatrix.kernels.timing import PEAK_ENV, PEAK_METHOD_ENV, peak_env

    env = peak_env(gpu)
    return env, (f"{env[PEAK_ENV]} TFLOP/s ({env[PEAK_METHOD_ENV]})" if env else None)


# --- a Ray fleet ----------------------------------------------------------------------------------------------


def require_ray() -> None:
    """Ray is installed here, or `RayMissing` saying how to install it (before a sweep builds anything)."""
    from attnmatrix.kernels.ray_cluster import import_ray

    import_ray()


def ray_session(address: str | None) -> AbstractContextManager:
    """Connected to the Ray cluster at `address` (`auto`: the one `ray start --head` runs here; None: a new local
    instance) for the `with` block; yields the `ray` module (kernels/ray_cluster.py)."""
    from attnmatrix.kernels.ray_cluster import ray_session as session

    return session(address)


@dataclass
class Fleet:
    """What a Ray cluster offers a sweep: its lanes (an arch, the resource that selects its nodes, how many tasks
    at once), notes on nodes left out, the device probed and the archs offered for it."""

    lanes: list[Lane]
    notes: list[str]
    device: str
    archs: list[str]

    def describe(self) -> str:
        return "; ".join(lane.describe() for lane in self.lanes) or "none"


def read_fleet(ray: object, device: str, *, cpus_per_task: int) -> Fleet:
    """The live cluster's lanes; `device` `auto` is its GPUs if it has any, else its CPUs."""
    from attnmatrix.kernels import ray_cluster as rc

    lanes, notes = rc.live_lanes(ray, cpus_per_task=cpus_per_task)
    dev = rc.fleet_device(lanes, device)
    return Fleet(lanes, notes, dev, rc.fleet_archs(lanes, dev))


# --- cross-compiling ------------------------------------------------------------------------------------------


def not_cross_compilable(names: Iterable[str]) -> list[str]:
    """The backends among `names` that cannot be compiled without a GPU (no compile-only path)."""
    from attnmatrix.kernels.base import load_backend

    return [n for n in names if load_backend(n).compile_only is None]


def cross_compilable_backends() -> list[str]:
    """The product's GPU backends that compile without a GPU."""
    from attnmatrix.kernels.base import load_backend

    return [n for n in backends_for("cuda") if load_backend(n).compile_only is not None]


def compile_targets(archs: Sequence[str]) -> list[str]:
    """The compile targets for `archs` (`sm_100` -> `sm_100a`; none: every default target). Only targets whose SM
    count is known are taken: it is part of the compiled kernel. ValueError says which arch is refused and lists
    the targets."""
    from attnmatrix.kernels import xcompile as xc

    known = ", ".join(xc.DEFAULT_TARGETS)
    try:
        targets = [xc.normalize_target(a) for a in (archs or xc.DEFAULT_TARGETS)]
    except (CaseError, ValueError) as e:
        raise ValueError(f"{str(e).removeprefix('arch: ')} (compile targets: {known})") from None
    unknown = [t for t in targets if normalize_arch(t) not in xc.TARGETS]
    if unknown:
        raise ValueError(f"{', '.join(unknown)} is not a compile target this command knows the SM count of "
                         f"(compile targets: {known})")
    return targets


def cross_compile(cases: list[Case], out: Path, targets: Sequence[str], *, workers: int, timeout_s: float,
                  cache_dir: str | None, progress: Callable[[Record], None] | None = None) -> dict[str, RunSummary]:
    """Compile every case for every target into the result file `out` (resumed), under one new run id;
    {target: summary} (kernels/xcompile.py)."""
    from attnmatrix.kernels import xcompile as xc

    return xc.xcompile_cases(cases, out, targets, workers=workers, timeout_s=timeout_s, cache_dir=cache_dir,
                             run_id=new_run_id(), progress=progress)


# --- shipped binaries -----------------------------------------------------------------------------------------


@dataclass
class ShippedCubins:
    """What a flashinfer-cubin wheel ships: its kernel table, one `shipped` or `rejected` record per cell it
    decides, and the evidence file's name (by what it holds, as scripts/evidence_name.py derives it)."""

    table: KernelTable
    records: list[Record]
    file_name: str

    def summary_json(self) -> str:
        """Kernels per arch and cells per head dims, as `ingest-cubins --json` prints them."""
        from attnmatrix.kernels.trtllm_cubins import dumps_summary

        return dumps_summary(self.table, self.records)


def read_cubin_wheel(wheel: Path) -> ShippedCubins:
    """Read the kernel table out of `wheel` (nothing in it is executed); `CubinError` if it is not a
    flashinfer-cubin wheel or its table cannot be read (kernels/trtllm_cubins.py)."""
    from attnmatrix.kernels import trtllm_cubins as tc

    table = tc.read_wheel(wheel)
    name = f"{'+'.join(tc.ARCHS)}-trtllm-flashinfer-cubin{table.version}-shipped-{table.date.replace('-', '')}.jsonl"
    return ShippedCubins(table, list(tc.shipped_records(table)), name)
