"""TensorRT-LLM attention kernels as FlashInfer ships them (`flashinfer-python`, import `flashinfer`).

Three backends, one entry point each:

- `trtllm_ragged`:  `flashinfer.prefill.trtllm_ragged_attention_deepseek` (vLLM's TRTLLM_RAGGED MLA
  prefill) on packed q/k/v with int32 `cum_seq_lens_q`/`cum_seq_lens_kv` and kv `seq_lens`;
- `trtllm_context`: `flashinfer.prefill.trtllm_batch_context_with_kv_cache` on packed queries and a
  paged NHD KV cache (`block_tables`, `seq_lens`);
- `trtllm_decode`:  `flashinfer.decode.trtllm_batch_decode_with_kv_cache` (`backend="auto"`:
  trtllm-gen on compute capability 10.x, XQA elsewhere, e.g. sm_90) on a paged NHD KV cache.

The paged entry points read only a paged cache: a case without `paged_kv` gets the `Problem`'s
default block size (`Problem.paged_kv`). `trtllm_decode` is a decode entry point: a case whose op is
not `decode` is `Unsupported` there (speculative multi-token decode is not a prefill).

Mapping of the `Problem` (TRT-LLM's fused scales, after FlashInfer's docstrings):

- `bmm1_scale` = softmax scale x q descale x k descale; `bmm2_scale` = v descale (1 unless fp8);
  the output dtype is the case's dtype (fp8 inputs write bf16/fp16, never fp8).
- causal (bottom-right) -> `is_causal`/`causal`; a window -> `window_left` (inclusive). The ragged
  and decode APIs have no right window: a window whose right edge is 0 is the causal mask plus
  `window_left`, any other finite right edge is `Unsupported`. The context API also takes
  `window_right`.
- sinks -> `attention_sinks` / `sinks` (fp32, one logit per query head).
- No entry point has a softcap or an ALiBi parameter: those cases are `Unsupported`. The ragged entry
  point takes no block table: a paged KV case is `Unsupported` there.

Head dims, dtypes, page sizes and GQA ratios are passed as they are: FlashInfer refuses what it
does not build, in its own words (e.g. the ragged kernel's head-dim assertion, XQA's page-size
check). The trtllm-gen kernels (ragged, context, and decode on 10.x) are prebuilt cubins that
FlashInfer fetches at run time (`flashinfer.jit.cubin_loader.get_artifact`) unless
`flashinfer-cubin` provides them; where they are absent and `FLASHINFER_NO_DOWNLOAD` is set,
those backends are `unavailable` (a missing download is no statement about the kernel). XQA is
compiled from the sources in the wheel and needs no download.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
from attnmatrix.matrix.cases import Case

from .base import Backend
from .flashinfer import (
    MODULE,
    causal_and_left,
    descales,
    kv_lens,
    paged_cache,
    right_bound,
    window_left,
    workspace,
)
from .problem import Problem, Unsupported

RAGGED = "trtllm_ragged_attention_deepseek"
CONTEXT = "trtllm_batch_context_with_kv_cache"
DECODE = "trtllm_batch_decode_with_kv_cache"
KV_LAYOUT = "NHD"


def _no_softcap_alibi(p: Problem, api: str) -> None:
    for present, what in ((bool(p.softcap), "a logits softcap"), (p.alibi_slopes is not None, "ALiBi slopes")):
        if present:
            raise Unsupported(f"{api} has no parameter for {what}")


def _scales(p: Problem) -> tuple[float, float]:
    dq, dk, dv = descales(p)
    return p.scale * dq * dk, dv


def prepare_ragged(p: Problem) -> Callable[[], torch.Tensor]:
    _no_softcap_alibi(p, RAGGED)
    if p.case.has("paged_kv"):
        # Running it on packed K/V would pass without paging anything: the case would claim what was not tested.
        raise Unsupported(f"{RAGGED} takes no block table: K/V are packed ragged tensors, so a paged KV cache "
                          "cannot be expressed")
    causal, left = causal_and_left(p, RAGGED)
    pre = importlib.import_module(f"{MODULE}.prefill")
    q, k, v, cu_q, cu_k = p.packed()
    unpack = p.unpacker()
    bmm1, bmm2 = _scales(p)
    ws = workspace(p)
    out = torch.empty(q.shape[0], q.shape[1], v.shape[-1], dtype=p.out_dtype, device=q.device)
    kw = {
        "seq_lens": p.seqlens_k_tensor(), "max_q_len": p.max_valid_q(), "max_kv_len": max(kv_lens(p)),
        "bmm1_scale": bmm1, "bmm2_scale": bmm2,
        "o_sf_scale": 1.0,  # scale of FP4 output scale factors; unused for bf16/fp16 output
        "batch_size": p.shape.batch, "window_left": left, "cum_seq_lens_q": cu_q, "cum_seq_lens_kv": cu_k,
        "enable_pdl": None, "is_causal": causal, "return_lse": False, "attention_sinks": p.sinks, "out": out,
    }

    def call() -> torch.Tensor:
        return unpack(pre.trtllm_ragged_attention_deepseek(q, k, v, ws, **kw))

    return call


def prepare_context(p: Problem) -> Callable[[], torch.Tensor]:
    _no_softcap_alibi(p, CONTEXT)
    right = right_bound(p)
    causal = right == 0
    left = window_left(p)
    # causal accepts window_right -1 or 0; a non-causal window needs its right edge, a dense mask -1
    w_right = -1 if right is None or causal else right
    pre = importlib.import_module(f"{MODULE}.prefill")
    q, _, _, cu_q, cu_k = p.packed()
    unpack = p.unpacker()
    k_cache, v_cache, table, _ = paged_cache(p)
    bmm1, bmm2 = _scales(p)
    ws = workspace(p)
    kw = {
        "max_q_len": p.max_valid_q(), "max_kv_len": max(kv_lens(p)), "bmm1_scale": bmm1, "bmm2_scale": bmm2,
        "batch_size": p.shape.batch, "cum_seq_lens_q": cu_q, "cum_seq_lens_kv": cu_k, "window_left": left,
        "window_right": w_right, "out_dtype": p.out_dtype, "kv_layout": KV_LAYOUT, "sinks": p.sinks,
        "causal": causal,
    }
    seq_lens = p.seqlens_k_tensor()

    def call() -> torch.Tensor:
        return unpack(pre.trtllm_batch_context_with_kv_cache(q, (k_cache, v_cache), ws, table, seq_lens, **kw))

    return call


def prepare_decode(p: Problem) -> Callable[[], torch.Tensor]:
    if p.case.op != "decode":
        raise Unsupported(f"{DECODE} is a decode entry point (one query token per sequence, or a "
                          f"speculative draft); a {p.case.op} case is not its op")
    _no_softcap_alibi(p, DECODE)
    if p.q.shape[-1] != p.v.shape[-1]:
        raise Unsupported(f"{DECODE} has one head_dim: its output takes the query's shape, so head_dim "
                          f"{p.q.shape[-1]} with head_dim_v {p.v.shape[-1]} cannot be expressed")
    dec = importlib.import_module(f"{MODULE}.decode")
    b, sq, hq, d = p.q.shape
    q = p.q.reshape(b * sq, hq, d)
    k_cache, v_cache, table, _ = paged_cache(p)
    bmm1, bmm2 = _scales(p)
    ws = workspace(p)
    kw = {
        "max_seq_len": max(kv_lens(p)), "bmm1_scale": bmm1, "bmm2_scale": bmm2, "window_left": window_left(p),
        "out_dtype": p.out_dtype, "sinks": p.sinks, "kv_layout": KV_LAYOUT, "backend": "auto",
    }
    seq_lens = p.seqlens_k_tensor()

    def call() -> torch.Tensor:
        out = dec.trtllm_batch_decode_with_kv_cache(q, (k_cache, v_cache), ws, table, seq_lens, **kw)
        return out.view(b, sq, hq, out.shape[-1])

    return call


def _needs_trtllm_gen_always() -> bool:
    return True


def _needs_trtllm_gen_for_decode() -> bool:
    # trtllm_batch_decode_with_kv_cache(backend="auto") runs trtllm-gen on capability 10.x, XQA elsewhere.
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 10


def trtllm_gen_cubins_missing() -> str | None:
    """Why FlashInfer's trtllm-gen FMHA artifacts cannot be had here, or None if they can."""
    if not os.environ.get("FLASHINFER_NO_DOWNLOAD"):
        return None  # FlashInfer fetches them on first use
    env = importlib.import_module(f"{MODULE}.jit.env")
    artifacts = importlib.import_module(f"{MODULE}.artifacts")
    path = env.FLASHINFER_CUBIN_DIR / artifacts.ArtifactPath.TRTLLM_GEN_FMHA / "checksums.txt"
    if path.is_file():
        return None
    return (f"FlashInfer's trtllm-gen FMHA cubins are not installed ({path} is missing; no matching "
            "flashinfer-cubin) and FLASHINFER_NO_DOWNLOAD is set, so the kernel cannot be loaded here")


@dataclass(frozen=True)
class TrtllmGenBackend(Backend):
    """A backend whose kernels may be prebuilt trtllm-gen cubins that FlashInfer downloads."""

    needs_cubins: Callable[[], bool] = _needs_trtllm_gen_always

    def availability(self) -> str | None:
        why = super().availability()
        if why or not self.needs_cubins():
            return why
        try:
            return trtllm_gen_cubins_missing()
        except Exception as e:  # noqa: BLE001 - an unreadable layout makes the kernel unavailable, not the probe fail
            return f"cannot locate FlashInfer's trtllm-gen cubins: {type(e).__name__}: {e}"


def _entry(module: str, name: str) -> Callable[[Case], str]:
    return lambda case: f"{MODULE}.{module}.{name}"


TRTLLM_RAGGED = TrtllmGenBackend.declare("trtllm_ragged", prepare_ragged, _entry("prefill", RAGGED))
TRTLLM_CONTEXT = TrtllmGenBackend.declare("trtllm_context", prepare_context, _entry("prefill", CONTEXT))
TRTLLM_DECODE = TrtllmGenBackend.declare("trtllm_decode", prepare_decode, _entry("decode", DECODE),
                                         needs_cubins=_needs_trtllm_gen_for_decode)
