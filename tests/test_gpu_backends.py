"""Every CUDA backend, through the real probe path, on a GPU: a case it must pass, and refusals in its own words.

Skipped without a GPU (conftest) and, per backend, where its library is not installed. On a GPU
machine: `python -m pytest -m gpu -v`.

FA2's regular package `flash_attn` hides FA4's namespace package `flash_attn.cute` in any process that
has both on its path, so with both installed run the suite twice: once with FA2 off the path (FA4's
tests run, FA2's skip), once with FA2 on it and `-k fa2` (scripts/isolate-fa2.py moves an installed FA2
into a folder of its own; site/gpu-probing.md shows the commands).
"""

from __future__ import annotations

import pytest
import torch
from attnmatrix.kernels.base import load_backend
from attnmatrix.kernels.probe import ProbeConfig, probe_case
from attnmatrix.kernels.runner import RunnerConfig, run_cases
from attnmatrix.matrix.cases import Case
from attnmatrix.matrix.storage import ResultStore

pytestmark = pytest.mark.gpu

CONFIG = ProbeConfig(timing=False, run_id="gpu-test")


def _arch() -> str:
    major, minor = torch.cuda.get_device_capability() if torch.cuda.is_available() else (0, 0)
    return f"sm_{major}{minor}"


def _case(backend: str, op: str = "prefill", dims: tuple[int, int] = (128, 128),
          features: tuple[str, ...] = ("causal",), dtype: str = "bfloat16") -> Case:
    return Case(_arch(), backend, op, dtype, dims[0], dims[1], features)


def _require(backend: str) -> None:
    why = load_backend(backend).availability()
    if why:
        pytest.skip(f"{backend} unavailable here: {why}")


# (name, a case the backend passed in the committed H200 sweep, or that its documentation says it supports)
PASSING = [
    ("sdpa_flash", _case("sdpa_flash")),
    ("sdpa_efficient", _case("sdpa_efficient", features=("causal", "alibi"))),
    ("sdpa_cudnn", _case("sdpa_cudnn")),
    ("sdpa_math", _case("sdpa_math", features=("causal", "alibi"))),
    ("fa2", _case("fa2", features=("causal", "paged_kv:256"))),
    ("fa2_decode", _case("fa2", op="decode", features=("causal", "paged_kv:256"))),  # FA2: blocks of 256n
    ("fa4", _case("fa4", features=("causal", "varlen"))),
    ("flashinfer", _case("flashinfer", op="decode", features=("causal", "paged_kv:16"))),
    ("trtllm_decode", _case("trtllm_decode", op="decode", features=("causal", "paged_kv:64"))),
]


@pytest.mark.parametrize(("name", "case"), PASSING, ids=[n for n, _ in PASSING])
def test_backend_passes_a_supported_case(name, case):
    _require(case.backend)
    rec = probe_case(case, CONFIG)
    assert rec.outcome == "pass", rec.reason
    assert rec.error["mismatched"] == 0
    assert rec.provenance["device"] == torch.cuda.get_device_name()
    assert rec.provenance["kernel_version"] != "unknown"


# (backend, a case it must refuse, a word its refusal must contain)
REFUSED = [
    ("sdpa_flash", _case("sdpa_flash", dims=(512, 512)), ""),
    ("fa2", _case("fa2", dims=(512, 512)), "256"),
    ("fa2_fp8", _case("fa2", features=("causal", "fp8")), ""),
    ("fa2_page_16", _case("fa2", features=("causal", "paged_kv:16")), "divisible by 256"),
    ("sdpa_efficient_gqa", _case("sdpa_efficient", features=("causal", "gqa")), "No available kernel"),
]


@pytest.mark.parametrize(("name", "case", "word"), REFUSED, ids=[n for n, _, _ in REFUSED])
def test_backend_refuses_in_its_own_words(name, case, word):
    _require(case.backend)
    rec = probe_case(case, CONFIG)
    assert rec.outcome == "rejected", (rec.outcome, rec.reason)
    assert rec.reason and word in rec.reason


def test_isolated_runner_uses_every_gpu(tmp_path):
    """Workers spread over every visible GPU (two each): every case recorded once, all of them passing."""
    gpus = list(range(torch.cuda.device_count()))
    cases = [_case("sdpa_efficient", dims=(d, d)) for d in (64, 128)] + \
            [_case("sdpa_math", dims=(d, d)) for d in (64, 128)]
    with ResultStore(tmp_path / "r.jsonl") as store:
        summary = run_cases(cases, store, RunnerConfig(workers=2 * len(gpus), timeout_s=120, device="cuda",
                                                        gpus=gpus, probe=CONFIG))
        assert summary.ran == len(cases)
        assert sorted(store.done) == sorted(c.key for c in cases)
    assert summary.outcomes == {"pass": len(cases)}


def test_timing_inputs_are_drawn_on_the_gpu():
    """A decode timing shape at head dim 256 holds over 4 G values: they are drawn on the GPU, in the
    kernel's dtype, reproducibly per seed, and random (never zeros). On the CPU they took 40 to 130 s."""
    from attnmatrix.kernels.problem import TIMING_SHAPES, make_problem

    case = _case("sdpa_flash", op="decode", dims=(256, 256), features=("causal", "varlen", "sinks"))
    shape = TIMING_SHAPES["decode"][0]
    p = make_problem(case, shape, device="cuda", seed=7, draw_on_device=True)
    for t in (p.q, p.k, p.v):
        assert t.is_cuda and t.dtype == torch.bfloat16 and t[:1].float().std().item() > 0.5
    again = make_problem(case, shape, device="cuda", seed=7, draw_on_device=True)
    assert torch.equal(p.k, again.k) and p.seqlens_k == again.seqlens_k
    del again  # each problem holds over 8 GB
    assert not torch.equal(p.k, make_problem(case, shape, device="cuda", seed=8, draw_on_device=True).k)
