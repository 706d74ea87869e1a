"""FlashAttention 2 (`flash-attn`, import `flash_attn`): its three forward entry points.

Which entry a case uses follows from its features alone (so `entry` can name it before running):

- paged KV with varlen:  `flash_attn_varlen_func(..., block_table=...)` on the packed queries;
- paged KV:              `flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=, block_table=)`;
- varlen:                `flash_attn_varlen_func` on packed q/k/v with int32 `cu_seqlens`;
- everything else (decode included): `flash_attn_func`.

FA2's conventions are the `Problem`'s (bottom-right causal, window (left, right), softcap after
scaling, ALiBi `-slope * |i + sk - sq - j|` with fp32 (H,) slopes), so every feature with an
argument is passed through as is. Attention sinks have no argument: `Unsupported`. fp8 inputs and
head_dim != head_dim_v are passed unchanged, so FA2 refuses them in its own words
("FlashAttention only support fp16 and bf16 data type", its shape checks).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from attnmatrix.matrix.cases import Case

from .base import Backend
from .problem import Problem, Unsupported


def entry_for(case: Case, module: str) -> str:
    paged, varlen = case.has("paged_kv"), case.has("varlen")
    if paged and not varlen:
        return f"{module}.flash_attn_with_kvcache"
    if varlen:
        return f"{module}.flash_attn_varlen_func"
    return f"{module}.flash_attn_func"


def prepare(p: Problem) -> Callable[[], torch.Tensor]:
    c = p.case
    if c.has("sinks"):
        raise Unsupported("flash_attn (FlashAttention 2) has no parameter for attention sinks")
    # torch is already imported (problem.py), as flash_attn's CUDA extension requires.
    from flash_attn import flash_attn_interface as fa2

    kw = {
        "softmax_scale": p.scale,
        "causal": p.causal,
        "window_size": p.window if p.window is not None else (-1, -1),
        "softcap": p.softcap,
        "alibi_slopes": p.alibi_slopes,
    }
    paged, varlen = c.has("paged_kv"), c.has("varlen")
    if varlen:
        q, k, v, cu_q, cu_k = p.packed()
        max_q = p.max_valid_q()
        max_k = p.max_valid_k()
        unpack = p.unpacker()
        if paged:
            k, v, table = p.paged_kv()
            kw["block_table"] = table

        def call() -> torch.Tensor:
            return unpack(fa2.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, **kw))

        return call
    if paged:
        k_cache, v_cache, table = p.paged_kv()
        cache_seqlens = p.seqlens_k_tensor()

        def call() -> torch.Tensor:
            return fa2.flash_attn_with_kvcache(p.q, k_cache, v_cache, cache_seqlens=cache_seqlens, block_table=table,
                                              **kw)

        return call

    def call() -> torch.Tensor:
        return fa2.flash_attn_func(p.q, p.k, p.v, **kw)

    return call


# Not just `flash_attn`: FlashAttention 4 (`flash-attn-4`) installs `flash_attn.cute` and so makes
# `flash_attn` importable as a namespace package without FA2. The interface module imports FA2's
# CUDA extension (`flash_attn_2_cuda`), so it imports only where FA2 is really installed.
FA2 = Backend.declare("fa2", prepare, lambda case: entry_for(case, "flash_attn"))
