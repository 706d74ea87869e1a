"""vLLM's own selection tests as the acceptance test of the generated vLLM module.

Fetches vLLM 0.33.0's source distribution and wheel from PyPI (pip), checks that the sdist's Python files the
tests exercise are the released wheel's (sha256 against the wheel's RECORD), and runs the release's own
selection decision tests twice on this CPU:

- on the pristine source tree (vLLM's hand-written rules), and
- on the tree patched by `attnmatrix vllm-patch` (`git apply --check`, then `git apply`): vLLM's rules replaced
  by calls into the generated module (attnmatrix/engines/vllm/selection.py, vendored as vllm/attnmatrix/);
- for comparison, on the same patched tree with the module swapped for the selector's own vLLM-compatible
  functions (SELECTOR_ONLY: what attnmatrix answered before the vLLM-shaped module).

The decision tests (28) are the tests of `tests/kernels/attention/test_attention_selector.py` and
`tests/v1/attention/test_mla_prefill_selector.py` that assert a selection decision the module answers:
`test_fa4_hd256_fallback_matrix` (16: get_flash_attn_version), `test_fa4_hd256_block_size_advertisement` (5:
the kernel block sizes FLASH_ATTN advertises), `test_fa4_hd256_mm_prefix_deselects_flash_attn` (1) and
`TestPlatformMLAPrefillHooks`' priority-list tests (6: the MLA prefill order vLLM walks). The MLA validation
tests (`TestBackendValidation`, 2) run too and are reported beside them; they exercise vLLM's own per-backend
validation, which the patch leaves in place.

The tests need vLLM importable: a virtual environment with vLLM's import-time dependencies (no GPU build:
torch for the CPU), created by this script on first use (`--env`). What cannot load on a CPU is stood in by
`ENV_CONFTEST` below (loaded with `-p`, vLLM's own conftest files are not): the compiled extensions the wheel
ships are importable empty modules, the optional kernel libraries the release requires (flashinfer,
tokenspeed_mla) import as inert modules, and the platform is vLLM's CudaPlatform reporting capability 10.0
(the tests patch the capability they assert on). Neither the stand-ins nor the patch's glue choose anything:
every decision in the patched tree comes from the generated module.

For each test that fails on the patched tree the report lists the module's calls during the test and, for each
FlashAttention backend, the evidence the matrix holds for that call (`attnmatrix.selector.explain`): the
evidence that contradicts vLLM's expectation, or the gap.

Usage (the committed results: benchmarks/results/vllm-selection-tests.{md,json}):

    python benchmarks/vllm_selection_tests.py --work /tmp/vllm-tests
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ET
import zipfile
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VERSION = "0.33.0"
RESULTS = ROOT / "benchmarks" / "results" / "vllm-selection-tests"
ATTENTION = "tests/kernels/attention/test_attention_selector.py"
MLA = "tests/v1/attention/test_mla_prefill_selector.py"
HOOKS = f"{MLA}::TestPlatformMLAPrefillHooks"
DECISION_TESTS = [
    f"{ATTENTION}::test_fa4_hd256_fallback_matrix",
    f"{ATTENTION}::test_fa4_hd256_block_size_advertisement",
    f"{ATTENTION}::test_fa4_hd256_mm_prefix_deselects_flash_attn",
    *(f"{HOOKS}::{t}" for t in ("test_priorities_no_capability", "test_priorities_blackwell_glm_dimensions",
                                "test_priorities_blackwell_deepseek_dimensions", "test_priorities_hopper",
                                "test_skips_import_error_backends", "test_all_invalid_raises_error")),
]
OTHER_TESTS = [f"{MLA}::TestBackendValidation"]
# The vLLM files the tests exercise, checked against the wheel.
CHECKED_FILES = [
    "vllm/v1/attention/backends/fa_utils.py", "vllm/v1/attention/backends/flash_attn.py",
    "vllm/v1/attention/backends/flash_attn_diffkv.py", "vllm/platforms/interface.py", "vllm/platforms/cuda.py",
    "vllm/v1/attention/backends/mla/prefill/base.py", "vllm/v1/attention/backends/mla/prefill/registry.py",
    "vllm/v1/attention/backends/mla/prefill/selector.py", "vllm/v1/attention/backends/mla/prefill/flash_attn.py",
    "vllm/v1/attention/backends/mla/prefill/trtllm_ragged.py", "vllm/v1/attention/backends/mla/prefill/flashinfer.py",
    "vllm/v1/attention/backends/mla/prefill/tokenspeed_mla.py", "vllm/vllm_flash_attn/flash_attn_interface.py",
]
# vLLM's import-time dependencies for these tests on a CPU (torch without CUDA), and what fetching the sdist
# needs: pip prepares its metadata by running vLLM's setup.py.
ENV_REQUIREMENTS = [
    "torch", "pytest", "pydantic", "regex", "numpy", "cbor2", "psutil", "pyzmq", "urllib3", "requests", "aiohttp",
    "transformers>=5.16.1,<5.21.0", "openai", "openai-harmony", "cachetools", "msgspec", "cloudpickle", "pyyaml",
    "pillow", "pybase64", "uvloop", "py-cpuinfo", "prometheus_client", "xgrammar", "fastapi", "partial-json-parser",
    "llguidance", "einops", "setuptools>=77,<81", "setuptools-scm", "setuptools-rust", "wheel", "packaging", "jinja2",
]

ENV_CONFTEST = '''"""Stand-ins for what cannot load on a CPU, loaded by the acceptance run (pytest -p attnmatrix_env).

- vLLM's compiled extensions (shipped in the wheel, built for a CUDA torch): importable, empty.
- flashinfer and tokenspeed_mla (dependencies of `pip install vllm` on Linux): importable, inert: their kernels
  are never called by the selection code under test.
- the platform: vLLM's own CudaPlatform, with the device capability 10.0 in place of NVML's (the tests patch
  the capability they assert on).
- ATTNMATRIX_CALL_LOG: every call of the vendored module (vllm.attnmatrix.selection), one JSON line each, with
  the test that made it.
"""
import importlib.machinery
import json
import os
import sys
import types


class _Unrunnable:
    def __init__(self, name):
        self._name = name

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self._name}: a kernel, not callable on this machine")

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Unrunnable(f"{self._name}.{attr}")


def _module(name, inert=False):
    mod = types.ModuleType(name)
    mod.__spec__ = importlib.machinery.ModuleSpec(name, None)
    if inert:
        def __getattr__(attr):
            if attr.startswith("__"):
                raise AttributeError(attr)
            return _Unrunnable(f"{name}.{attr}")
        mod.__getattr__ = __getattr__
    return mod


for _name in ("vllm._C", "vllm._C_stable_libtorch", "vllm._moe_C", "vllm.cumem_allocator",
              "vllm.vllm_flash_attn._vllm_fa2_C", "vllm.vllm_flash_attn._vllm_fa3_C"):
    sys.modules.setdefault(_name, _module(_name))
for _name in ("flashinfer", "flashinfer.prefill", "tokenspeed_mla"):
    sys.modules.setdefault(_name, _module(_name, inert=True))

import vllm.platforms as _platforms  # noqa: E402
from vllm.platforms.cuda import CudaPlatform  # noqa: E402
from vllm.platforms.interface import DeviceCapability  # noqa: E402


class StandInCudaPlatform(CudaPlatform):
    @classmethod
    def get_device_capability(cls, device_id=0):
        return DeviceCapability(10, 0)


_platforms._current_platform = StandInCudaPlatform()

_current = {"test": None}


def pytest_runtest_setup(item):
    _current["test"] = item.nodeid


_log = os.environ.get("ATTNMATRIX_CALL_LOG")
if _log:
    try:
        import vllm.attnmatrix.selection as _selection
    except ImportError:
        _selection = None
    if _selection is not None:
        def _recording(name, fn):
            def call(*args, **kwargs):
                result = fn(*args, **kwargs)
                with open(_log, "a", encoding="utf-8") as f:
                    f.write(json.dumps({"test": _current["test"], "function": name, "args": list(args),
                                        "kwargs": kwargs, "result": result}, default=repr) + "\\n")
                return result
            return call

        for _fn in ("get_flash_attn_version", "get_supported_kernel_block_sizes",
                    "get_mla_prefill_backend_priorities"):
            setattr(_selection, _fn, _recording(_fn, getattr(_selection, _fn)))
'''


# The baseline: the selector's own vLLM-compatible functions (attnmatrix/selector.py) behind the module's names,
# as before the vLLM-shaped module: no configuration inputs, no supports_fa4_hd256, no block-size answer, and
# the validated MLA list where vLLM walks the raw one.
SELECTOR_ONLY = '''"""The selector's own functions behind the generated module's names (the baseline)."""
from .selector import get_flash_attn_version as _flash_attn_version
from .selector import get_mla_prefill_backend_priorities as _mla_prefill_backend_priorities


def get_flash_attn_version(requires_alibi=False, head_size=None, head_size_v=None, has_sinks=False,
                           requires_softcap=False, kv_cache_block_size=None, supports_fa4_hd256=False, *,
                           capability, requires_local_attention=False, **config):
    return _flash_attn_version(capability, requires_alibi, head_size, head_size_v, has_sinks,
                               requires_local_attention, requires_softcap, kv_cache_block_size)


def get_supported_kernel_block_sizes(*args, **kwargs):
    raise NotImplementedError("attnmatrix.selector has no kernel block-size answer")


def get_mla_prefill_backend_priorities(capability, qk_nope_head_dim, qk_rope_head_dim, v_head_dim):
    return _mla_prefill_backend_priorities(capability, qk_nope_head_dim, qk_rope_head_dim, v_head_dim)
'''


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    print("+", " ".join(map(str, cmd)), file=sys.stderr)
    return subprocess.run([str(c) for c in cmd], check=True, **kw)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def make_env(env: Path) -> Path:
    py = env / "bin" / "python"
    if not py.exists():
        run([sys.executable, "-m", "venv", env])
        run([py, "-m", "pip", "install", "-q", *ENV_REQUIREMENTS])
    return py


def fetch(py: Path, dl: Path) -> tuple[Path, Path]:
    """The sdist and the wheel, downloaded with pip (kept in `dl` for later runs)."""
    dl.mkdir(parents=True, exist_ok=True)
    sdists, wheels = sorted(dl.glob(f"vllm-{VERSION}.tar.gz")), sorted(dl.glob(f"vllm-{VERSION}-*.whl"))
    if not sdists:
        # pip prepares an sdist's metadata by running its setup.py; vLLM's reads the target device and would
        # append it to the version, so the target and the version are given.
        env = dict(os.environ, VLLM_TARGET_DEVICE="cpu", VLLM_VERSION_OVERRIDE=VERSION)
        run([py, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", "--no-build-isolation",
             f"vllm=={VERSION}", "-d", dl], env=env)
    if not wheels:
        run([py, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
             "--platform", "manylinux_2_28_x86_64", f"vllm=={VERSION}", "-d", dl])
    return next(dl.glob(f"vllm-{VERSION}.tar.gz")), next(dl.glob(f"vllm-{VERSION}-*.whl"))


def wheel_record(wheel: Path) -> dict[str, str]:
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/RECORD"))
        out = {}
        for line in z.read(name).decode().splitlines():
            path, digest, _ = line.rsplit(",", 2)
            if digest.startswith("sha256="):
                d = digest[len("sha256="):]
                out[path] = base64.urlsafe_b64decode(d + "=" * (-len(d) % 4)).hex()
        return out


def extract(sdist: Path, dest: Path) -> Path:
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    with tarfile.open(sdist) as t:
        t.extractall(dest, filter="data")
    tree = dest / f"vllm-{VERSION}"
    run(["git", "init", "-q", tree])
    return tree


def run_tests(py: Path, tree: Path, junit: Path, calls: Path | None) -> None:
    (tree / "attnmatrix_env.py").write_text(ENV_CONFTEST, encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=str(tree))
    if calls is not None:
        env["ATTNMATRIX_CALL_LOG"] = str(calls)
        calls.unlink(missing_ok=True)
    subprocess.run([str(py), "-m", "pytest", "-q", "-p", "no:cacheprovider", "--noconftest", "-p", "attnmatrix_env",
                    "--rootdir", str(tree), f"--junitxml={junit}", *DECISION_TESTS, *OTHER_TESTS],
                   cwd=tree, env=env, check=False)


def read_junit(junit: Path) -> dict[str, dict]:
    out = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        cls, name = case.get("classname", ""), case.get("name", "")
        path, _, klass = cls.partition(".Test") if ".Test" in cls else (cls, "", "")
        node = path.replace(".", "/") + ".py::" + (f"Test{klass}::" if klass else "") + name
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        skipped = case.find("skipped")
        if bad is not None:
            # object addresses vary from run to run: the report stays byte-stable without them
            message = re.sub(r" at 0x[0-9a-f]+", "", (bad.get("message") or "").strip())
            out[node] = {"outcome": "failed", "message": message}
        elif skipped is not None:
            out[node] = {"outcome": "skipped", "message": (skipped.get("message") or "").strip()}
        else:
            out[node] = {"outcome": "passed"}
    return out


def is_decision(node: str) -> bool:
    return any(node == t or node.startswith(t + "[") for t in DECISION_TESTS)


def evidence(calls: list[dict]) -> list[dict]:
    """For each get_flash_attn_version call: what the matrix holds about each FlashAttention backend."""
    sys.path.insert(0, str(ROOT))
    from attnmatrix import selector
    from attnmatrix.engines.vllm import selection

    fa_backends = sorted(b for b, v in selector.DATA["fa_version"].items())
    facts = json.loads((ROOT / "matrix" / "data" / "declared.json").read_text())["facts"]
    declared = {f["id"]: f["sources"] for f in facts}
    out = []
    for c in calls:
        if c["function"] != "get_flash_attn_version":
            continue
        names = ("requires_alibi", "head_size", "head_size_v", "has_sinks", "requires_softcap", "kv_cache_block_size",
                 "supports_fa4_hd256")
        a = dict(zip(names, c["args"], strict=False)) | c["kwargs"]
        cap = tuple(a["capability"])
        hd = a.get("head_size")
        why = selector.explain(cap, hd, a.get("head_size_v"), sinks=bool(a.get("has_sinks")),
                               softcap=bool(a.get("requires_softcap")), alibi=bool(a.get("requires_alibi")),
                               page_size=a.get("kv_cache_block_size")) if hd is not None else {}
        texts = {b: why.get(b, "no evidence on this arch") for b in fa_backends}
        ids = sorted({i for t in texts.values() for i in re.findall(r"\[evidence: ([^\]]+)\]", t)})
        out.append({"call": {k: v for k, v in a.items() if k != "available_versions"}, "answer": c["result"],
                    "evidence": texts, "sources": {i: declared.get(i, []) for i in ids},
                    "profile_refusals": [r["id"] for r in selection.PROFILE["config_refusals"]]})
    return out


def write_report(doc: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    d = doc["decision"]
    lines = [
        f"# vLLM {VERSION}'s selection tests on the generated vLLM module",
        "",
        f"Written by `python benchmarks/vllm_selection_tests.py` ({doc['date']}). vLLM's own decision tests, run on "
        "a CPU twice: on vLLM's source as released, and on the source patched by `attnmatrix vllm-patch` "
        "(vLLM's hand-written FlashAttention version rules, MLA prefill priority lists and FA4 head-size-256 "
        "block size replaced by calls into `attnmatrix/engines/vllm/selection.py`). The script's docstring "
        "says which tests and why, and what stands in for the GPU.",
        "",
        f"- sdist `{doc['sdist']['name']}` sha256 `{doc['sdist']['sha256']}`",
        f"- wheel `{doc['wheel']['name']}` sha256 `{doc['wheel']['sha256']}`; "
        f"{len(doc['checked_files'])} files the tests exercise are byte-identical in both "
        "(sha256 against the wheel's RECORD)",
        f"- patch (`attnmatrix vllm-patch`): `git apply --check` {doc['patch']['apply_check']}; "
        f"{doc['patch']['files']} files",
        "",
        f"**Decision tests: vLLM's code {d['vllm_passed']}/{d['total']}, the generated module "
        f"{d['attnmatrix_passed']}/{d['total']}.** For comparison, the selector's own vLLM-compatible functions "
        f"behind the same names (no configuration inputs, no block-size answer, the validated MLA list): "
        f"{d['selector_only_passed']}/{d['total']}.",
        "",
        "| test | vLLM's code | generated module | selector's functions |",
        "| --- | --- | --- | --- |",
    ]
    for node, r in doc["tests"].items():
        lines.append(f"| `{node.split('::', 1)[1]}` | {r['vllm']['outcome']} | {r['attnmatrix']['outcome']} "
                     f"| {r['selector_only']['outcome']} |")
    lines += ["", "## Failures on the generated module, with the evidence", ""]
    for node, r in doc["tests"].items():
        if r["attnmatrix"]["outcome"] == "passed":
            continue
        message = " ".join(r["attnmatrix"]["message"].split())
        lines += [f"### `{node.split('::', 1)[1]}`", "", f"- vLLM's expectation failed: `{message}`"]
        for e in r.get("evidence", []):
            lines.append(f"- call: `{json.dumps(e['call'], sort_keys=True)}` -> `{e['answer']}`")
            for b, why in e["evidence"].items():
                lines.append(f"  - {b}: {why}")
            for i, srcs in e["sources"].items():
                lines.append(f"  - `{i}` cites: " + ("; ".join(f"`{x}`" for x in srcs) or "its probe record"))
        lines.append("")
    out.with_suffix(".md").write_text("\n".join(lines).rstrip() + "\n", encoding="utf-8")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, required=True, help="working folder (downloads, environment, trees)")
    ap.add_argument("--env", type=Path, default=None, help="the test environment (default: WORK/env; made if missing)")
    ap.add_argument("--out", type=Path, default=RESULTS, help="report path without suffix (.md and .json)")
    args = ap.parse_args()
    work = args.work.resolve()
    py = make_env((args.env or work / "env").resolve())
    sdist, wheel = fetch(py, work / "dl")
    record = wheel_record(wheel)
    pristine, patched = extract(sdist, work / "pristine"), extract(sdist, work / "patched")
    baseline = extract(sdist, work / "selector-only")
    differ = [f for f in CHECKED_FILES if record.get(f) != sha256(pristine / f)]
    if differ:
        sys.exit(f"the sdist's {', '.join(differ)} differ from the wheel's: not the released code")
    diff = work / "attnmatrix-vllm.diff"
    run([sys.executable, "-m", "attnmatrix.cli", "vllm-patch", "--source", patched, "-o", diff], cwd=ROOT)
    run(["git", "apply", "--check", diff], cwd=patched)
    run(["git", "apply", diff], cwd=patched)
    run(["git", "apply", diff], cwd=baseline)
    (baseline / "vllm" / "attnmatrix" / "selection.py").write_text(SELECTOR_ONLY, encoding="utf-8")
    run_tests(py, baseline, work / "selector-only.xml", None)
    run_tests(py, pristine, work / "vllm.xml", None)
    calls_log = work / "calls.jsonl"
    run_tests(py, patched, work / "attnmatrix.xml", calls_log)
    ours, theirs = read_junit(work / "attnmatrix.xml"), read_junit(work / "vllm.xml")
    before = read_junit(work / "selector-only.xml")
    calls = [json.loads(line) for line in calls_log.read_text().splitlines()] if calls_log.exists() else []
    tests = {}
    for node in theirs:
        r = {"decision": is_decision(node), "vllm": theirs[node], "attnmatrix": ours.get(node, {"outcome": "missing"}),
             "selector_only": before.get(node, {"outcome": "missing"})}
        if r["attnmatrix"]["outcome"] != "passed":
            r["evidence"] = evidence([c for c in calls if c["test"] == node])
        tests[node] = r
    decision = [r for r in tests.values() if r["decision"]]
    text = diff.read_text()
    doc = {
        "vllm_version": VERSION,
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
        "command": "python benchmarks/vllm_selection_tests.py --work WORK",
        "sdist": {"name": sdist.name, "sha256": sha256(sdist)},
        "wheel": {"name": wheel.name, "sha256": sha256(wheel)},
        "checked_files": CHECKED_FILES,
        "patch": {"apply_check": "ok", "files": sum(ln.startswith("diff --git ") for ln in text.splitlines())},
        "decision": {"total": len(decision), "vllm_passed": sum(r["vllm"]["outcome"] == "passed" for r in decision),
                     "attnmatrix_passed": sum(r["attnmatrix"]["outcome"] == "passed" for r in decision),
                     "selector_only_passed": sum(r["selector_only"]["outcome"] == "passed" for r in decision)},
        "tests": tests,
    }
    write_report(doc, args.out)
    d = doc["decision"]
    print(f"decision tests: vLLM's code {d['vllm_passed']}/{d['total']}, the generated module "
          f"{d['attnmatrix_passed']}/{d['total']}, the selector's functions {d['selector_only_passed']}/{d['total']}")


if __name__ == "__main__":
    main()
