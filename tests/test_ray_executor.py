"""The Ray executor (`probe --executor ray`), on local Ray clusters on the CPU.

- the lane mapping (accelerator types and `attnmatrix_arch_*` labels -> archs) and the guards, without Ray;
- the CLI end to end on a local Ray it starts itself, against the local executor's outcomes;
- kernel faults (segfault, hang) through Ray, on a cluster of two worker nodes, then a resume;
- a node removed while it runs a task: its unfinished cases are re-queued, none is lost or duplicated.

Ray start-up and worker start-up (importing torch) dominate; the case counts are kept small.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from attnmatrix.kernels.probe import ProbeConfig
from attnmatrix.kernels.runner import RunnerConfig
from attnmatrix.matrix.cases import Case
from attnmatrix.matrix.records import parse_record
from attnmatrix.matrix.storage import ResultStore, read_records
from click.testing import CliRunner

from attnmatrix.cli import main

ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'attnmatrix[ray]')")

from attnmatrix.kernels import ray_cluster as rc  # noqa: E402 - after the importorskip
from attnmatrix.kernels import ray_executor as rx  # noqa: E402

SPACE = ["--device", "cpu", "--head-dims", "64,128", "--features", "none,causal", "--ops", "prefill",
         "--dtypes", "bfloat16", "--no-timing", "--json"]


def _node(node_id: str, alive: bool = True, **res: float) -> dict:
    return {"NodeID": node_id, "Alive": alive, "Resources": res}


def _keys(path: Path) -> list[str]:
    return [r.key for _, r in read_records(path)]


# --- without a cluster ---------------------------------------------------------------------------------


def test_lanes_from_accelerator_types_and_labels() -> None:
    nodes = [
        _node("head0000", CPU=4),
        _node("h200aaaa", CPU=32, GPU=8, **{"accelerator_type:H200": 1}),
        _node("h200bbbb", CPU=32, GPU=8, **{"accelerator_type:H200": 1}),
        _node("h100cccc", CPU=16, GPU=4, **{"accelerator_type:H100": 1}),
        # a label wins over the accelerator type: this node is probed as sm_100 only
        _node("b200dddd", CPU=16, GPU=2, **{"accelerator_type:B200": 1, "attnmatrix_arch_sm_100a": 2}),
        _node("oddeeeee", CPU=8, GPU=1, **{"accelerator_type:X999": 1}),  # unknown type: left out, with a note
        _node("deadffff", alive=False, CPU=8, GPU=8, **{"accelerator_type:A100": 1}),
    ]
    lanes, notes = rc.discover_lanes(nodes, cpus_per_task=2)
    got = {(lane.arch, lane.resource): (lane.capacity, len(lane.nodes)) for lane in lanes}
    assert got == {
        ("cpu", None): (2 + 16 + 16 + 8 + 8 + 4, 6),
        ("sm_100", "attnmatrix_arch_sm_100a"): (2, 1),
        ("sm_90", "accelerator_type:H100"): (4, 1),
        ("sm_90", "accelerator_type:H200"): (16, 2),
    }
    assert len(notes) == 1 and "oddeeeee" in notes[0] and "X999" in notes[0] and "attnmatrix_arch_" in notes[0]
    assert rc.fleet_device(lanes, "auto") == "cuda"
    assert rc.fleet_archs(lanes, "cuda") == ["sm_100", "sm_90"] and rc.fleet_archs(lanes, "cpu") == ["cpu"]

    # CPU-only fleet; once a node carries the cpu label, only labelled nodes probe the CPU
    cpu_only = [_node("a", CPU=2), _node("b", CPU=2, attnmatrix_arch_cpu=1)]
    lanes, _ = rc.discover_lanes(cpu_only)
    assert [(lane.arch, lane.resource, lane.capacity) for lane in lanes] == [("cpu", "attnmatrix_arch_cpu", 2)]
    assert rc.fleet_device(lanes, "auto") == "cpu"


def test_every_mapped_accelerator_type_is_a_ray_type_and_an_arch() -> None:
    from attnmatrix.matrix.cases import normalize_arch
    from ray.util.accelerators import accelerators

    ray_types = {v for k, v in vars(accelerators).items() if k.startswith("NVIDIA_")}
    assert set(rc.ACCELERATOR_ARCH) - {"GH200"} <= ray_types
    assert all(normalize_arch(a) == a for a in rc.ACCELERATOR_ARCH.values())


def test_auto_chunk_size() -> None:
    assert rx.auto_chunk_size(6, 2) == 3  # small sweeps: every slot gets work
    assert rx.auto_chunk_size(16, 2) == 8
    assert rx.auto_chunk_size(40, 2) == rx.MIN_AUTO_CHUNK  # a chunk pays a worker start-up: not tiny
    assert rx.auto_chunk_size(120, 2) == 30  # about two chunks per slot
    assert rx.auto_chunk_size(100_000, 8) == rx.MAX_AUTO_CHUNK
    assert rx.auto_chunk_size(1, 0) == 1


def test_a_record_from_another_arch_is_refused(make_record) -> None:
    ok = parse_record(make_record(arch="sm_90", provenance={"capability": "9.0"}))
    assert rx.check_arch(ok) is None
    bad = parse_record(make_record(arch="sm_90", device="NVIDIA A100-SXM4-80GB", provenance={"capability": "8.0"}))
    why = rx.check_arch(bad)
    assert why and "capability 8.0" in why and "sm_80" in why and "A100" in why


def test_without_ray_installed(tmp_path: Path) -> None:
    # attnmatrix imports and works without Ray; --executor ray then says how to install it (exit 2).
    code = (
        "import sys; sys.modules['ray'] = None\n"
        "import attnmatrix.cli, attnmatrix.kernels.ray_executor\n"
        "from click.testing import CliRunner\n"
        "r = CliRunner().invoke(attnmatrix.cli.main, ['probe', '--executor', 'ray', '--device', 'cpu', "
        "'--backends', 'sdpa_cpu', '-o', sys.argv[1]])\n"
        "print(r.exit_code); print(r.output)\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "x.jsonl")], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    code_line, *rest = out.stdout.splitlines()
    assert code_line == "2" and "pip install 'attnmatrix[ray]'" in "\n".join(rest), out.stdout
    assert not (tmp_path / "x.jsonl").exists()


def test_ray_options_need_the_ray_executor(tmp_path: Path) -> None:
    for extra in (["--address", "auto"], ["--arch", "sm_90"], ["--chunk-size", "4"]):
        r = CliRunner().invoke(main, ["probe", "--device", "cpu", "--backends", "sdpa_cpu", *extra,
                                      "-o", str(tmp_path / "x.jsonl")])
        assert r.exit_code == 2 and "needs --executor ray" in r.output, (extra, r.output)
    r = CliRunner().invoke(main, ["probe", "--executor", "ray", "--gpus", "0", "-o", str(tmp_path / "x.jsonl")])
    assert r.exit_code == 2 and "Ray assigns" in r.output
    help_text = CliRunner().invoke(main, ["probe", "--help"]).output
    assert "--executor [local|ray]" in help_text and "--address" in help_text and "ray start --head" in help_text


def test_gpu_backends_only_checks_the_options_with_the_cpu_backends_of_backends_json(monkeypatch,
                                                                                       tmp_path: Path) -> None:
    # Before Ray starts, the options are checked on a CPU space; with only GPU backends named, the CPU backends
    # it is built with are backends.json's (a second CPU backend shows that they are not a fixed list).
    from attnmatrix import workflow
    from attnmatrix.cli import fleet

    built = []

    def stop(arch, backends, *rest):
        built.append((arch, list(backends)))
        raise fleet.UsageError("stop before Ray")

    monkeypatch.setattr(fleet, "build_space", stop)
    monkeypatch.setattr(workflow, "backends_for", lambda dev: ["sdpa_cpu", "cpu_only_extra"] if dev == "cpu" else [])
    r = CliRunner().invoke(main, ["probe", "--executor", "ray", "--backends", "fa4", "-o", str(tmp_path / "x.jsonl")])
    assert r.exit_code == 2 and "stop before Ray" in r.output, r.output
    assert built == [("cpu", ["sdpa_cpu", "cpu_only_extra"])]


# --- a local Ray that the CLI starts ---------------------------------------------------------------------


@pytest.mark.slow
def test_cli_ray_matches_local_executor(tmp_path: Path) -> None:
    assert not ray.is_initialized()
    backends = ["--backends", "sdpa_cpu,fake_nan,fake_raise,fake_wrong"]
    local, fleet = tmp_path / "local.jsonl", tmp_path / "ray.jsonl"
    r = CliRunner().invoke(main, ["probe", *SPACE, *backends, "-o", str(local)])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["probe", "--executor", "ray", *SPACE, *backends, "-o", str(fleet)])
    assert r.exit_code == 0, r.output
    assert not ray.is_initialized()  # the Ray it started is shut down
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["executor"] == "ray" and summary["cases"] == summary["probed"] == 16
    assert summary["unprobed"] == 0 and summary["ray_tasks"] == 2  # auto chunks: one per slot of 2 CPUs

    keys = _keys(fleet)
    assert len(keys) == len(set(keys)) == 16 and set(keys) == set(_keys(local))
    want = {r.key: r.outcome for _, r in read_records(local)}
    got = {r.key: r.outcome for _, r in read_records(fleet)}
    assert got == want
    assert Counter(got.values()) == Counter({"pass": 4, "wrong": 8, "rejected": 4})
    for _, rec in read_records(fleet):
        assert rec.tier == "validated" and rec.provenance["device"] and rec.provenance["torch"]


# --- a cluster of two worker nodes (the head takes no tasks) ------------------------------------------------


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    nodes = [c.add_node(num_cpus=1) for _ in range(2)]
    ray.init(address=c.address, log_to_driver=False, logging_level="WARNING")
    c.wait_for_nodes()
    try:
        yield c, nodes
    finally:
        ray.shutdown()
        c.shutdown()


@pytest.mark.slow
def test_faults_through_ray_then_resume(cluster, tmp_path: Path) -> None:
    out = tmp_path / "faults.jsonl"
    args = ["probe", "--executor", "ray", "--device", "cpu", "--backends", "sdpa_cpu,fake_segfault,fake_hang",
            "--head-dims", "64", "--features", "causal", "--ops", "prefill", "--dtypes", "bfloat16", "--no-timing",
            "--timeout", "15", "--chunk-size", "1", "--json", "-o", str(out)]
    r = CliRunner().invoke(main, args)  # uses the Ray this process is connected to
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["ray_tasks"] == 3 and summary["workers_replaced"] == 2 and summary["nodes"] == 2
    by = {rec.case.backend: rec for _, rec in read_records(out)}
    assert len(read_records(out)) == 3
    assert {b: rec.outcome for b, rec in by.items()} == {"sdpa_cpu": "pass", "fake_segfault": "crash",
                                                         "fake_hang": "timeout"}
    assert by["fake_segfault"].reason.startswith("worker killed by signal SIGSEGV while running the case")
    assert by["fake_hang"].reason == "no result within 15 s (case); worker killed"
    assert all(rec.provenance.get("device") for rec in by.values())  # the node's provenance, via its worker

    # Resuming runs no task; a case of an arch no node has is given up, not hung on.
    cases = [Case.from_key(k) for k in _keys(out)] + [Case("sm_90", "fa2", "prefill", "bfloat16", 128, 128, ())]
    cfg = RunnerConfig(device="cpu", probe=ProbeConfig(timing=False, run_id="t"))
    with ResultStore(out) as store:
        s = rx.run_cases_ray(cases, store, cfg, rx.FleetConfig(lane_grace_s=0.5))
    assert (s.total, s.skipped, s.ran, s.tasks) == (4, 3, 0, 0)
    assert list(s.unprobed) == [cases[-1].key] and "no live node of arch sm_90" in s.unprobed[cases[-1].key]
    assert len(out.read_text().splitlines()) == 3


@pytest.mark.slow
def test_node_killed_mid_sweep(cluster, tmp_path: Path) -> None:
    c, _ = cluster
    c.add_node(num_cpus=1)  # three worker nodes; one dies below, two stay for whatever runs after
    c.wait_for_nodes()
    cases = [Case("cpu", "sdpa_cpu", "prefill", "bfloat16", hd, hd, feats)
             for hd in (32, 64, 96, 128) for feats in ((), ("causal",), ("causal", "gqa"))]
    # The first chunk (4 cases, run in order by one worker) is: a passing case, a hang, two passing cases.
    # Its node is killed when the first record arrives: the task is then stuck in the hang, so exactly one
    # of its cases is finished and three are not.
    hang = Case("cpu", "fake_hang", "prefill", "bfloat16", 64, 64, ())
    cases.insert(1, hang)
    cfg = RunnerConfig(device="cpu", timeout_s=8, probe=ProbeConfig(timing=False, run_id="kill"))
    out = tmp_path / "kill.jsonl"
    events: list[tuple[str, dict]] = []
    killed: list[str] = []

    def on_event(kind: str, info: dict) -> None:
        events.append((kind, info))
        if kind == "task_record" and info["key"] == cases[0].key and not killed:
            node = next(n for n in c.worker_nodes if n.node_id == info["node"])
            killed.append(info["node"])
            c.remove_node(node, allow_graceful=False)

    recorded = []
    with ResultStore(out) as store:
        s = rx.run_cases_ray(cases, store, cfg, rx.FleetConfig(chunk_size=4), progress=recorded.append,
                             on_event=on_event)
    assert killed, "the first case never came back: the test killed nothing"
    lost = [info for kind, info in events if kind == "task_lost"]
    assert len(lost) == 1 and lost[0]["node"] == killed[0], lost
    assert (lost[0]["requeued"], lost[0]["given_up"]) == (3, 0)
    assert (s.tasks_lost, s.requeued, s.tasks) == (1, 3, 4 + 1)
    assert not s.unprobed and s.ran == len(cases) and s.outcomes == Counter({"pass": 12, "timeout": 1})
    # Every case is in the file exactly once, and the case finished before the kill was not run again.
    keys = _keys(out)
    assert len(keys) == len(set(keys)) == len(cases) and set(keys) == {c.key for c in cases}
    assert sorted(r.key for r in recorded) == sorted(keys)
    returned = Counter(info["key"] for kind, info in events if kind == "task_record")
    assert returned[cases[0].key] == 1 and set(returned.values()) == {1}
    # The re-queued cases ran on a live node.
    started = [info for kind, info in events[events.index(("task_lost", lost[0])):] if kind == "task_started"]
    assert any(hang.key in info["keys"] for info in started)
    assert all(info["node"] != killed[0] for info in started)
