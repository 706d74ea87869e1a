"""FlashInfer's own attention kernels (`flashinfer-python`, import `flashinfer`).

One backend, `flashinfer`, over three wrapper classes; which one a case uses follows from its op
and features alone (so `entry` can name it before running):

- decode (one query token):        `flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper`;
- prefill / mla_prefill, paged KV: `flashinfer.prefill.BatchPrefillWithPagedKVCacheWrapper`;
- prefill / mla_prefill otherwise: `flashinfer.prefill.BatchPrefillWithRaggedKVCacheWrapper`
  on packed (varlen) q/k/v with int32 indptrs, whether or not the lengths are ragged.

The decode wrapper reads only a paged cache: a decode case without `paged_kv` gets the `Problem`'s
default block size (`Problem.paged_kv`). Every wrapper is built with `backend="auto"` (FlashInfer's
own choice among its kernels: FA3-style on sm_90 where it can, FA2-style otherwise), layout NHD,
and planned in `prepare`, so a timed call is `run` alone. Planning builds the JIT module of the
case (nvcc, from the sources in the wheel) unless a prebuilt one is installed.

Mapping of the `Problem`:

- scale -> `sm_scale`; softcap -> `logits_soft_cap` (FlashInfer caps after scaling, as the
  `Problem` does); ALiBi -> `pos_encoding_mode="ALIBI"`. FlashInfer takes no slopes: it uses
  its built-in `get_alibi_slopes(num_qo_heads)`, so a case whose slopes differ is `Unsupported`.
- masks: FlashInfer's causal mask is bottom-right aligned, its window is `window_left`
  (inclusive) and it has no right window in the prefill wrappers. A window whose right edge is 0
  is the causal mask plus `window_left`; any other finite right edge is `Unsupported`.
- sinks -> `run(..., sinks=)` (paged prefill and decode). The ragged wrapper's `run` has no sink
  parameter: `Unsupported` there (FlashInfer's sink kernels live in other wrappers).
- fp8 -> e4m3 q/k/v with `q_data_type`/`kv_data_type` e4m3, `o_data_type` the case's dtype, and
  the descales as `q_scale`/`k_scale`/`v_scale`.
- The decode wrapper has one `head_dim`: head_dim != head_dim_v is `Unsupported` there.

Everything else (head dims, dtypes, page sizes, GQA ratios) is passed as it is, for FlashInfer to
accept or refuse in its own words. Outputs come back as (B, Sq, Hq, Dv).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import torch
from attnmatrix.matrix.cases import Case

from .base import Backend
from .problem import Problem, Unsupported

MODULE = "flashinfer"
WORKSPACE_BYTES = 128 * 2**20  # FlashInfer's recommended float workspace
BACKEND = "auto"
KV_LAYOUT = "NHD"


def workspace(p: Problem) -> torch.Tensor:
    # Zeroed rather than empty: whatever an entry point expects of its scratch, it never reads garbage.
    return torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=p.q.device)


def right_bound(p: Problem) -> int | None:
    """How far right of its aligned position a query may look: 0 for causal, None if unbounded."""
    right = 0 if p.causal else None
    if p.window is not None:
        right = p.window[1] if right is None else min(right, p.window[1])
    return right


def window_left(p: Problem) -> int:
    return p.window[0] if p.window is not None else -1


def causal_and_left(p: Problem, api: str) -> tuple[bool, int]:
    """(causal, window_left) for an API that has no right-window parameter."""
    right = right_bound(p)
    if right is not None and right != 0:
        raise Unsupported(f"{api} has no right-window parameter (window {p.window}, causal={p.causal})")
    return right == 0, window_left(p)


def descales(p: Problem) -> tuple[float, float, float]:
    return p.descale if p.descale is not None else (1.0, 1.0, 1.0)


def kv_lens(p: Problem) -> list[int]:
    return [p.valid_k(i) for i in range(p.shape.batch)]


def paged_cache(p: Problem) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """(k_cache, v_cache, block_table, page_size), NHD pages in a shuffled order."""
    k_cache, v_cache, table = p.paged_kv()
    return k_cache, v_cache, table, k_cache.shape[1]


def paged_indices_for(p: Problem, table: torch.Tensor, ps: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FlashInfer's description of the pages in `table`: (kv_indptr, kv_indices, last_page_len), int32."""
    counts = [-(-n // ps) for n in kv_lens(p)]
    dev = p.q.device
    indices = torch.cat([table[i, :c] for i, c in enumerate(counts)]).to(device=dev, dtype=torch.int32)
    indptr = torch.zeros(len(counts) + 1, dtype=torch.int32)
    indptr[1:] = torch.tensor(counts, dtype=torch.int32).cumsum(0)
    last = torch.tensor([n - (c - 1) * ps for n, c in zip(kv_lens(p), counts, strict=True)], dtype=torch.int32)
    return indptr.to(dev), indices, last.to(dev)


def _check_alibi(p: Problem, api: str) -> None:
    if p.alibi_slopes is None:
        return
    utils = importlib.import_module(f"{MODULE}.utils")
    builtin = utils.get_alibi_slopes(p.q.shape[2]).to(p.alibi_slopes.device, torch.float32)
    if not torch.allclose(builtin, p.alibi_slopes.float(), rtol=1e-6, atol=0.0):
        raise Unsupported(f"{api} takes no ALiBi slopes: pos_encoding_mode='ALIBI' uses FlashInfer's built-in "
                          "get_alibi_slopes(num_qo_heads), which differ from this case's slopes")


def _common_plan(p: Problem) -> dict:
    kw: dict = {
        "pos_encoding_mode": "ALIBI" if p.alibi_slopes is not None else "NONE",
        "logits_soft_cap": p.softcap if p.softcap else None,
        "sm_scale": p.scale,
        "q_data_type": p.q.dtype,
        "kv_data_type": p.k.dtype,
        "o_data_type": p.out_dtype,
    }
    return kw


def _scales(p: Problem, *names: str) -> dict:
    if p.descale is None:
        return {}
    return dict(zip(names, p.descale, strict=True))


def entry(case: Case) -> str:
    if case.op == "decode":
        return f"{MODULE}.decode.BatchDecodeWithPagedKVCacheWrapper"
    if case.has("paged_kv"):
        return f"{MODULE}.prefill.BatchPrefillWithPagedKVCacheWrapper"
    return f"{MODULE}.prefill.BatchPrefillWithRaggedKVCacheWrapper"


def _prepare_decode(p: Problem, backend: str = BACKEND) -> Callable[[], torch.Tensor]:
    api = "BatchDecodeWithPagedKVCacheWrapper"
    if p.q.shape[-1] != p.v.shape[-1]:
        raise Unsupported(f"{api}.plan takes one head_dim for q, k and v; the case has head_dim "
                          f"{p.q.shape[-1]} and head_dim_v {p.v.shape[-1]}")
    _check_alibi(p, api)
    dec = importlib.import_module(f"{MODULE}.decode")
    b, sq, hq, d = p.q.shape
    k_cache, v_cache, table, ps = paged_cache(p)
    indptr, indices, last = paged_indices_for(p, table, ps)
    wrapper = dec.BatchDecodeWithPagedKVCacheWrapper(workspace(p), KV_LAYOUT, backend=backend)
    wrapper.plan(indptr, indices, last, hq, p.k.shape[2], d, ps, window_left=window_left(p), **_common_plan(p))
    q = p.q.reshape(b * sq, hq, d)
    run_kw = _scales(p, "q_scale", "k_scale", "v_scale")
    if p.sinks is not None:
        run_kw["sinks"] = p.sinks

    def call() -> torch.Tensor:
        out = wrapper.run(q, (k_cache, v_cache), **run_kw)
        return out.view(b, sq, hq, out.shape[-1])

    return call


def _prepare_prefill(p: Problem, backend: str = BACKEND) -> Callable[[], torch.Tensor]:
    paged = p.case.has("paged_kv")
    api = "BatchPrefillWithPagedKVCacheWrapper" if paged else "BatchPrefillWithRaggedKVCacheWrapper"
    if p.sinks is not None and not paged:
        raise Unsupported(f"{api}.run has no attention-sink parameter (FlashInfer takes sinks in "
                          "BatchPrefillWithPagedKVCacheWrapper.run and in its separate sink wrappers)")
    causal, left = causal_and_left(p, f"{api}.plan")
    _check_alibi(p, api)
    pre = importlib.import_module(f"{MODULE}.prefill")
    q, k, v, cu_q, cu_k = p.packed()
    unpack = p.unpacker()
    hq, hkv, d, dv = p.q.shape[2], p.k.shape[2], p.q.shape[-1], p.v.shape[-1]
    plan_kw = {**_common_plan(p), "causal": causal, "window_left": left}
    run_kw = _scales(p, "q_scale", "k_scale", "v_scale")
    if paged:
        k_cache, v_cache, table, ps = paged_cache(p)
        indptr, indices, last = paged_indices_for(p, table, ps)
        wrapper = pre.BatchPrefillWithPagedKVCacheWrapper(workspace(p), KV_LAYOUT, backend=backend)
        wrapper.plan(cu_q, indptr, indices, last, hq, hkv, d, ps, head_dim_vo=dv, **plan_kw)
        if p.sinks is not None:
            run_kw["sinks"] = p.sinks

        def call() -> torch.Tensor:
            return unpack(wrapper.run(q, (k_cache, v_cache), **run_kw))

        return call
    wrapper = pre.BatchPrefillWithRaggedKVCacheWrapper(workspace(p), KV_LAYOUT, backend=backend)
    wrapper.plan(cu_q, cu_k, hq, hkv, d, head_dim_vo=dv, **plan_kw)

    def call() -> torch.Tensor:
        return unpack(wrapper.run(q, k, v, **run_kw))

    return call


def prepare(p: Problem, backend: str = BACKEND) -> Callable[[], torch.Tensor]:
    if p.case.op == "decode":
        return _prepare_decode(p, backend)
    return _prepare_prefill(p, backend)


def prepare_cutlass(p: Problem) -> Callable[[], torch.Tensor]:
    return prepare(p, "cutlass")


FLASHINFER = Backend.declare("flashinfer", prepare, entry)
# The same wrappers with FlashInfer's `cutlass` kernels: what vLLM's FLASHINFER MLA prefill backend builds
# (BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD", backend="cutlass"), vllm-project/vllm@4ba787ec9
# (v0.33.0) vllm/v1/attention/backends/mla/prefill/flashinfer.py:110-113 and :160-163). FlashInfer's own
# choice (`flashinfer`, backend="auto") runs different kernels, so it never answers for that vLLM name.
FLASHINFER_CUTLASS = Backend.declare("flashinfer_cutlass", prepare_cutlass, entry)

__all__ = ["FLASHINFER", "FLASHINFER_CUTLASS", "causal_and_left", "descales", "kv_lens", "paged_cache",
           "paged_indices_for", "right_bound", "window_left", "workspace"]
