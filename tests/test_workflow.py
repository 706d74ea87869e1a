"""The workflow layer's policies (attnmatrix/workflow.py), the one backend registry, record identity, and the
one validation of head and page sizes: pure parts, no probing."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter

import pytest
from attnmatrix.kernels import registry
from attnmatrix.kernels.base import Backend, load_backend
from attnmatrix.kernels.runner import RunSummary
from attnmatrix.matrix import backends as B
from attnmatrix.matrix.cases import (
    MAX_HEAD_DIM,
    MAX_PAGE_SIZE,
    Case,
    CaseError,
    canonical_features,
    check_head_size,
    check_page_size,
    parse_head_dims,
)
from attnmatrix.matrix.evidence import Evidence, load_backends
from attnmatrix.matrix.merge import merge_records
from attnmatrix.matrix.policy import resolve
from attnmatrix.matrix.records import parse_record
from attnmatrix.matrix.storage import InputError

from attnmatrix import project, workflow

# --- the registry ---------------------------------------------------------------------------------------------


def test_every_product_backend_is_declared_once_and_its_module_agrees() -> None:
    data = json.loads(B.BACKENDS_FILE.read_text())["backends"]
    assert not [n for n in data if n.startswith("fake_")], "test fakes are registered by the tests, not the product"
    for name, meta in data.items():
        b = load_backend(name)
        assert isinstance(b, Backend)
        assert (b.name, b.library, b.device, list(b.imports)) == (name, meta["library"], meta["device"],
                                                                  meta["imports"])


def test_backend_modules_take_their_identity_from_the_registry() -> None:
    """No backend module spells its library, device or imports: Backend.declare reads them."""
    from pathlib import Path

    kernels = Path(registry.__file__).parent
    for mod in ("fa2", "fa3", "fa4", "flashinfer", "trtllm", "sdpa"):
        text = (kernels / f"{mod}.py").read_text()
        assert not re.search(r"= *\w*Backend\(", text), mod


@pytest.mark.slow
def test_fakes_are_known_only_where_the_plugin_is_loaded() -> None:
    env = {k: v for k, v in os.environ.items() if k != B.PLUGINS_ENV}
    code = "from attnmatrix.matrix import backends; print(','.join(backends.names()))"
    bare = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert "fake_" not in bare.stdout and "sdpa_cpu" in bare.stdout
    with_plugin = subprocess.run([sys.executable, "-c", code], env={**env, B.PLUGINS_ENV:
                                                                     "attnmatrix.kernels.fakes"},
                                 capture_output=True, text=True, check=True)
    assert "fake_nan" in with_plugin.stdout
    assert "fake_nan" in B.names()  # this test process: conftest names the plugin
    assert "fake_nan" not in load_backends(B.BACKENDS_FILE)  # the product's file never lists them


def test_a_plugin_cannot_redeclare_a_product_backend() -> None:
    sdpa = load_backend("sdpa_cpu")
    with pytest.raises(registry.RegistryError, match="declared in backends.json"):
        registry.register(sdpa, label="impostor")


def test_malformed_registry_entry_names_backend_and_field() -> None:
    with pytest.raises(B.RegistryError, match=r"backends.x.device: 'tpu'"):
        B.register("x", {"label": "x", "library": "x", "device": "tpu", "imports": [], "module": "a:b"})
    with pytest.raises(B.RegistryError, match=r"backends.x: missing imports, module"):
        B.register("x", {"label": "x", "library": "x", "device": "cpu"})
    assert "x" not in B.names()


def test_the_one_loader_reports_every_malformed_identity_with_file_and_field(tmp_path) -> None:
    path = tmp_path / "backends.json"
    path.write_text(json.dumps({"backends": {"a": {"label": "a", "library": "a", "device": "tpu", "imports": "x",
                                                   "module": "m:A", "default_rank": "1"}}}))
    with pytest.raises(InputError) as e:
        load_backends(path)
    assert [p.field for p in e.value.problems] == ["backends.a.default_rank", "backends.a.device", "backends.a.imports"]


# --- which backends a sweep probes ---------------------------------------------------------------------------


class _Missing(Backend):
    pass


@pytest.fixture
def missing_backend():
    b = _Missing("fake_missing", "no-such-dist", "cpu", ("attnmatrix_no_such_module",), lambda p: None,
                 lambda c: "none")
    registry.register(b, label="test fake: not installed")
    yield b
    registry.unregister("fake_missing")


def test_plan_splits_not_installed_and_wrong_device(missing_backend) -> None:
    plan = workflow.plan_backends(["sdpa_cpu", "fake_missing", "fa4", "sdpa_cudnn"], "cpu")
    assert plan.ready == ["sdpa_cpu"]
    assert list(plan.not_installed) == ["fake_missing"]
    assert "attnmatrix_no_such_module" in plan.not_installed["fake_missing"]
    assert plan.wrong_device == ["fa4", "sdpa_cudnn"]
    assert workflow.backends_for("cpu") == ["sdpa_cpu"]  # plugins only when named


# --- the skip rule and the reprobe policy ----------------------------------------------------------------------


def _ev(records) -> Evidence:
    return Evidence(records=list(records), where=[f"t.jsonl:{i}" for i in range(len(records))],
                    backends=load_backends())


def test_recorded_here_is_this_hardware_and_torch_only(make_rec) -> None:
    here = {"device": "NVIDIA H200", "torch": "2.11.0+cu130"}
    same = make_rec(head_dim=64)
    other_gpu = make_rec(head_dim=80, device="NVIDIA H100")
    unavailable = make_rec(head_dim=96, outcome="unavailable", reason="cannot import")
    compiled = make_rec(head_dim=128, tier="compiled", arch="sm_90")
    got = workflow.recorded_here(_ev([same, other_gpu, unavailable, compiled]), "sm_90", here)
    assert got == {same.key}


def test_reprobe_claims_installed_backends_validated_only(make_rec) -> None:
    m = resolve(_ev([make_rec(backend="fa2", head_dim=64), make_rec(backend="sdpa_flash", head_dim=64),
                     make_rec(backend="fa4", tier="compiled", arch="sm_100"),
                     make_rec(backend="fa2", arch="sm_80", head_dim=64)]))
    claims = workflow.reprobe_claims(m, "sm_90", ["sdpa_flash", "fa4"])
    assert [c.case.backend for c in claims] == ["sdpa_flash"]


def _cells(make_rec, backends, dims, feature_sets):
    recs = [make_rec(backend=b, head_dim=d, features=f) for b in backends for d in dims for f in feature_sets]
    return sorted(resolve(_ev(recs)).cells.values(), key=lambda c: c.case.key)


def test_stratified_sample_spreads_over_backends_head_dims_and_features(make_rec) -> None:
    cells = _cells(make_rec, ["fa2", "sdpa_flash", "sdpa_cudnn"], [64, 128, 256],
                   [("causal",), ("causal", "softcap"), ("causal", "gqa"), ()])
    assert len(cells) == 36
    three = workflow.stratified_sample(cells, 3)
    assert sorted(c.case.backend for c in three) == ["fa2", "sdpa_cudnn", "sdpa_flash"]
    nine = workflow.stratified_sample(cells, 9)
    assert Counter(c.case.backend for c in nine) == {"fa2": 3, "sdpa_flash": 3, "sdpa_cudnn": 3}
    for b in ("fa2", "sdpa_flash", "sdpa_cudnn"):  # each backend's three cells: three head dims
        assert sorted(c.case.head_dim for c in nine if c.case.backend == b) == [64, 128, 256]
    twelve_per = workflow.stratified_sample(cells, 36 - 3)
    for b in ("fa2",):
        feats = Counter(c.case.features for c in twelve_per if c.case.backend == b)
        assert max(feats.values()) - min(feats.values()) <= 1 and len(feats) == 4
    assert workflow.stratified_sample(cells, 9) == nine  # deterministic
    samples = {tuple(c.case.key for c in workflow.stratified_sample(cells, 9, seed=s)) for s in range(6)}
    assert len(samples) > 1  # other seeds, other samples
    assert workflow.stratified_sample(cells, 100) == cells
    assert [c.case.key for c in nine] == sorted(c.case.key for c in nine)


def test_stratified_sample_of_an_uneven_space_gives_small_backends_their_share(make_rec) -> None:
    big = _cells(make_rec, ["fa2"], [32, 64, 80, 96, 128, 160, 192, 256], [("causal",), ()])
    small = _cells(make_rec, ["sdpa_cudnn"], [128], [("causal",)])
    got = workflow.stratified_sample(big + small, 4)
    assert Counter(c.case.backend for c in got) == {"fa2": 3, "sdpa_cudnn": 1}


def test_broken_claims(make_rec) -> None:
    m = resolve(_ev([make_rec(head_dim=64), make_rec(head_dim=128, outcome="rejected", reason="no"),
                     make_rec(head_dim=256)]))
    claims = sorted(m.cells.values(), key=lambda c: c.case.key)
    c128, c256, c64 = claims
    now = {c64.case.key: make_rec(head_dim=64), c128.case.key: make_rec(head_dim=128, outcome="crash", reason="x")}
    assert [c.case.key for c, _ in workflow.broken_claims(claims, now)] == [c256.case.key]  # 256: no record now
    now[c128.case.key] = make_rec(head_dim=128)
    assert {c.case.head_dim for c, _ in workflow.broken_claims(claims, now)} == {128, 256}


# --- one summary type -------------------------------------------------------------------------------------------


def test_one_summary_type_for_every_executor() -> None:
    from attnmatrix.kernels import ray_executor

    assert ray_executor.FleetSummary is RunSummary
    local = RunSummary(total=3, skipped=1, outcomes=Counter({"pass": 2}), wall_s=2.0).to_json("f.jsonl")
    assert local["executor"] == "local" and local["probed"] == 2 and local["cases_per_min"] == 60.0
    assert "ray_tasks" not in local
    fleet = RunSummary(executor="ray", tasks=4, tasks_lost=1, nodes={"a", "b"}).to_json("f.jsonl")
    assert fleet["ray_tasks"] == 4 and fleet["nodes"] == 2


def test_run_ids_are_distinct_and_dated() -> None:
    a, b = workflow.new_run_id(), workflow.new_run_id()
    assert a != b and len(a.split("-")[0]) == 8


# --- record identity and contradictions ---------------------------------------------------------------------------


def _compiled(**kw):
    from conftest import build_record

    d = build_record(tier="compiled", arch="sm_100", backend="fa4", **kw)
    return d


def test_identity_ignores_compile_time_and_date() -> None:
    a = _compiled(extra={"compile_s": 3.2, "cubin_bytes": 100}, date="2026-11-30")
    b = _compiled(extra={"compile_s": 4.7, "cubin_bytes": 100}, date="2026-12-01")
    merged, problems = merge_records([(parse_record(a), "x.jsonl:1"), (parse_record(b), "y.jsonl:1")])
    assert problems == [] and len(merged) == 1


def test_contradiction_names_the_field() -> None:
    a = parse_record(_compiled(extra={"compile_s": 3.2, "cubin_bytes": 100}))
    b = parse_record(_compiled(extra={"compile_s": 3.2, "cubin_bytes": 200}))
    _, (p,) = merge_records([(a, "x.jsonl:1"), (b, "y.jsonl:4")])
    assert (p.file, p.line, p.field) == ("y.jsonl", 4, "extra.cubin_bytes")
    assert "a different extra.cubin_bytes (extra.cubin_bytes: 100 vs 200)" in p.message
    c = parse_record(_compiled(outcome="rejected", reason="FA4: head dim 512 is not supported"))
    _, (q,) = merge_records([(a, "x.jsonl:1"), (c, "y.jsonl:2")])
    assert q.field == "outcome" and "outcome: 'compiled' vs 'rejected'" in q.message


def test_cross_compiles_with_run_ids_are_two_pieces_of_evidence() -> None:
    a = parse_record(_compiled(run_id="20261201-aaaaaaaa"))
    b = parse_record(_compiled(run_id="20261201-bbbbbbbb", outcome="rejected", reason="no"))
    merged, problems = merge_records([(a, "x:1"), (b, "y:1")])
    assert problems == [] and len(merged) == 2


# --- head and page sizes: one check ------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, -1, MAX_HEAD_DIM + 1, 99999999999999999999999, True, 1.5, "64", None])
def test_head_size_check(bad) -> None:
    with pytest.raises(CaseError, match="is not a head size"):
        check_head_size(bad, "--head-size")
    with pytest.raises(CaseError):
        Case("sm_90", "fa2", "prefill", "bfloat16", bad, 64)


def test_head_size_check_accepts_the_range() -> None:
    assert check_head_size(1) == 1 and check_head_size(MAX_HEAD_DIM) == MAX_HEAD_DIM
    with pytest.raises(CaseError, match="is not a head size"):
        parse_head_dims("64,0")
    with pytest.raises(CaseError):
        parse_head_dims("99999999999999999999999")


@pytest.mark.parametrize("bad", [0, -16, MAX_PAGE_SIZE + 1, 10**30, False, 16.0])
def test_page_size_check(bad) -> None:
    with pytest.raises(CaseError, match="is not a page size"):
        check_page_size(bad, "--page-size")


@pytest.mark.parametrize("token", ["paged_kv:0", "paged_kv:-16", "paged_kv:016", "paged_kv:²",
                                   f"paged_kv:{MAX_PAGE_SIZE + 1}", "paged_kv:"])
def test_page_size_in_feature_tokens(token) -> None:
    with pytest.raises(CaseError, match="block size"):
        canonical_features(["causal", token])
    assert canonical_features(["paged_kv:16"]) == ("paged_kv:16",)


# --- one checkout -----------------------------------------------------------------------------------------------


def test_locate_uses_the_checkout_it_stands_in(tmp_path, monkeypatch) -> None:
    tree = tmp_path / "tree"
    (tree / "matrix" / "data").mkdir(parents=True)
    (tree / "mkdocs.yml").write_text("site_name: x\n")
    (tree / "site").mkdir()
    monkeypatch.chdir(tree / "site")
    p = project.locate()
    assert p.root == tree.resolve() and p.data_dir == tree.resolve() / "matrix" / "data"
    assert str(tree.resolve()) in p.describe()
    monkeypatch.chdir(tmp_path)
    outside = project.locate()
    assert outside.root is None and outside.data_dir == project.package_data_dir()
    assert "installed package" in outside.describe()
    with pytest.raises(project.ProjectNotFound):
        project.locate(need_checkout=True)
    with pytest.raises(project.ProjectNotFound, match="no attnmatrix checkout"):
        project.locate(tmp_path)


def test_kernel_versions_leave_out_backends_that_did_not_import(make_rec) -> None:
    ev = _ev([make_rec(backend="fa2", kernel_version="2.8.3"),
              make_rec(backend="fa3", kernel_version="unknown", outcome="unavailable", reason="cannot import"),
              make_rec(backend="flashinfer", kernel_version="0.7.4", outcome="unavailable", reason="no cubins")])
    assert project.kernel_versions(ev) == {"fa2": ["2.8.3"]}
