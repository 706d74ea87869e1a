"""Shared fixtures: valid record dicts to build on, result files, a results folder.

`make_record(**overrides)` returns a *valid* JSON-ready record dict for one of the three tiers, so a
test states only what it is about. Case fields (arch, backend, op, dtype, head_dim, head_dim_v,
features) and a few common facts (kernel_version, device, date, latency_ms, reason, sources,
run_id, error, provenance) are keyword arguments; any other keyword replaces the top-level field of
the record, and the value `DROP` removes a field.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest

# The fault-injection fakes (kernels/fakes.py) are not product backends: the tests register them, through
# the plugin variable that the runner's worker subprocesses and Ray tasks inherit.
os.environ["ATTNMATRIX_BACKEND_PLUGINS"] = ",".join(
    filter(None, [os.environ.get("ATTNMATRIX_BACKEND_PLUGINS", ""), "attnmatrix.kernels.fakes"]))

DROP = object()  # make_record(reason=DROP) removes the field


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`@pytest.mark.gpu` tests need CUDA; skip them on a machine without it."""
    gpu_items = [it for it in items if it.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for it in gpu_items:
        it.add_marker(skip)


_DEFAULT_OUTCOME = {"validated": "pass", "compiled": "compiled", "declared": "pass"}
_CASE_FIELDS = ("arch", "backend", "op", "dtype", "head_dim", "head_dim_v", "features")


def build_record(
    *,
    tier: str = "validated",
    outcome: str | None = None,
    arch: str = "sm_90",
    backend: str = "fa2",
    op: str = "prefill",
    dtype: str = "bfloat16",
    head_dim: int = 128,
    head_dim_v: int | None = None,
    features: Iterable[str] = ("causal",),
    kernel_version: object = None,
    device: str = "NVIDIA H200",
    date: str = "2026-11-30",
    latency_ms: float | list[float] | None = None,
    reason: object = None,
    sources: object = None,
    run_id: object = None,
    error: object = None,
    provenance: dict | None = None,
    **top: object,
) -> dict:
    """A valid record dict of `tier` (see the module docstring)."""
    outcome = outcome or _DEFAULT_OUTCOME[tier]
    case = {"arch": arch, "backend": backend, "op": op, "dtype": dtype, "head_dim": head_dim,
            "head_dim_v": head_dim if head_dim_v is None else head_dim_v, "features": list(features)}
    if tier == "validated":
        prov = {"device": device, "torch": "2.11.0+cu130", "library": "flash-attn", "date": date,
                "kernel_version": "2.8.3.post2" if kernel_version is None else kernel_version}
    elif tier == "compiled":
        prov = {"target": "sm_100a", "library": "flash-attn-4", "date": date,
                "kernel_version": "4.0.0b36" if kernel_version is None else kernel_version}
    else:
        prov = {"date": date, "declared_id": "test-fact"}
        if kernel_version is not None:
            prov["kernel_version"] = kernel_version
    if provenance:
        prov.update(provenance)
    prov = {k: v for k, v in prov.items() if v is not DROP}
    d: dict = {"schema": 1, "case": case, "outcome": outcome, "tier": tier, "provenance": prov}
    if reason is None and outcome not in ("pass", "compiled"):
        reason = f"fake kernel: {outcome} for head_dim {head_dim}"
    if reason is not None:
        d["reason"] = reason
    if error is None and tier == "validated" and outcome in ("pass", "wrong"):
        error = {"max_abs_err": 0.004 if outcome == "pass" else 2.5, "nan": 0, "atol": 0.02, "rtol": 0.02}
    if error is not None:
        d["error"] = error
    if latency_ms is not None:
        lats = latency_ms if isinstance(latency_ms, list) else [latency_ms]
        d["timings"] = [{"shape": f"s{i}", "latency_ms": x, "tflops": 100.0} for i, x in enumerate(lats)]
    if sources is None and tier == "declared":
        sources = ["test/repo@abc123:src/kernel.py#L10"]
    if sources is not None:
        d["sources"] = sources
    if run_id is not None:
        d["run_id"] = run_id
    for k, v in top.items():
        if k in _CASE_FIELDS:
            raise TypeError(k)
        d[k] = v
    return {k: v for k, v in d.items() if v is not DROP}


def dump_jsonl(path: Path, rows: Iterable[dict | str]) -> Path:
    """Write rows (dicts, or raw strings written as they are) one per line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [r if isinstance(r, str) else json.dumps(r, sort_keys=True) for r in rows]
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


@pytest.fixture
def make_record() -> Callable[..., dict]:
    return build_record


@pytest.fixture
def make_rec():
    """Like make_record, but parsed into a `Record`."""
    from attnmatrix.matrix.records import parse_record

    return lambda **kw: parse_record(build_record(**kw))


@pytest.fixture
def write_jsonl() -> Callable[[Path, Iterable[dict | str]], Path]:
    return dump_jsonl


@pytest.fixture
def results_dir(tmp_path: Path) -> Path:
    d = tmp_path / "results"
    d.mkdir()
    return d


def vendored_selector(text: str, folder: Path, name: str = "gen_selector"):
    """A generated selector loaded as an engine vendors it: the module beside copies of the hand-written modules
    it imports (generator.render.SELECTOR_MODULES), plain files outside any package."""
    import importlib
    import importlib.util
    import shutil
    import sys

    from attnmatrix.generator.render import SELECTOR_MODULES

    path = folder / f"{name}.py"
    path.write_text(text, encoding="utf-8")
    for module in SELECTOR_MODULES:
        if module != "selector":
            shutil.copyfile(importlib.import_module(f"attnmatrix.{module}").__file__, folder / f"{module}.py")
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(folder))
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(folder))
    mod.__path_for_tests__ = str(path)
    return mod


def load_script(relpath: str):
    """A script of the repository that is no package module (benchmarks/*.py, scripts/*.py), imported from its file
    under a name of its own, so a test calls its functions. The module is registered under that name (in
    sys.modules), as an import would: a dataclass reads its module's namespace."""
    import importlib.util
    import sys

    path = Path(__file__).resolve().parent.parent / relpath
    name = f"script_{path.stem.replace('-', '_')}"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def sweep_rows(times: dict[tuple[int, int], dict[str, float]]) -> list[dict]:
    """Sweep rows (benchmarks/regret.py sweep) of one decode layer call: backends x and y checked and passed, and
    timed at each (batch, length) of `times` as given (both rounds alike: no noise)."""
    call = {"layer": "m:l", "op": "decode", "outcome": "pass", "arch": "sm_90", "heads_q": 8, "heads_kv": 1,
            "case": "sm_90/x/decode/bfloat16/128x128/gqa"}
    rows = [{**call, "backend": b, "set": "check"} for b in ("x", "y")]
    for (batch, length), per in times.items():
        rows += [{**call, "backend": b, "set": "bucket", "batch": batch, "length": length, "ms": ms,
                  "rounds": [ms, ms]} for b, ms in per.items()]
    return rows


@pytest.fixture
def load_selector() -> Callable:
    return vendored_selector


def checkout_copy(dest: Path) -> Path:
    """A checkout of its own at `dest`: a copy of this checkout's matrix data, docs and every generated code file
    (the selector and each engine's module), the parts `generate` and `check` read and write."""
    import shutil

    from attnmatrix.generator.render import SELECTOR_PATH

    from attnmatrix.engines.vllm.module import MODULE_PATH

    repo = Path(__file__).resolve().parent.parent
    (dest / "matrix").mkdir(parents=True)
    shutil.copytree(repo / "matrix" / "data", dest / "matrix" / "data")
    shutil.copy(repo / "mkdocs.yml", dest / "mkdocs.yml")
    shutil.copytree(repo / "site", dest / "site")
    for rel in (SELECTOR_PATH, MODULE_PATH):
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(repo / rel, dest / rel)
    return dest


@pytest.fixture(scope="module")
def cli_runner():
    from click.testing import CliRunner

    return CliRunner()


@pytest.fixture
def fast_cli(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI without the embedded declared facts (thousands of records validated on every call): the
    readers under test are the ones of FILE. The embedded facts get their own checks in test_cli.py."""
    import functools

    from attnmatrix.matrix import evidence

    from attnmatrix.cli import common

    monkeypatch.setattr(common, "load_evidence", functools.partial(evidence.load_evidence, declared=None))
