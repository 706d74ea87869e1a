"""What a Ray cluster offers a sweep: connecting to it (Ray imported only here and when a task runs), and its
*lanes*, one per GPU type (the arch of a case is the GPU type it must run on).

A node labelled with the custom resource `attnmatrix_arch_<arch>` (e.g.
`ray start --resources '{"attnmatrix_arch_sm_90": 8}'`) belongs to that arch, whatever its GPU; an unlabelled
GPU node is placed by Ray's own accelerator-type resource (`accelerator_type:H200` -> sm_90, table
`ACCELERATOR_ARCH`). A lane's capacity is its nodes' GPU count (one task per GPU); for arch `cpu` it is their
CPUs divided by the CPUs a task takes. How the sweep uses the lanes: `kernels/ray_executor.py`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from attnmatrix.matrix.cases import CaseError, normalize_arch

ARCH_RESOURCE_PREFIX = "attnmatrix_arch_"
ACCELERATOR_RESOURCE_PREFIX = "accelerator_type:"
INSTALL_HINT = "pip install 'attnmatrix[ray]'"

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
