"""FlashAttention 3 (the Hopper package `flash_attn_3`, import `flash_attn_interface`).

FA3 takes paged KV through `flash_attn_with_kvcache(..., page_table=)`, which also accepts packed
(varlen) queries through `cu_seqlens_q`/`max_seqlen_q`; `flash_attn_varlen_func` has no page table.
So, from the case's features alone:

- paged KV (with or without varlen): `flash_attn_with_kvcache`;
- varlen:                            `flash_attn_varlen_func`;
- everything else (decode included): `flash_attn_func`.

Causal (bottom-right), window (left, right) and softcap are FA3 arguments with the `Problem`'s
meaning. FA3 has no ALiBi and no attention-sink argument: those cases are `Unsupported`. fp8 goes
in as e4m3 tensors with (batch, heads_kv) float32 descales, as FA3 takes them; FA3 returns bf16
for fp8 inputs. Head dims (including head_dim != head_dim_v) are passed as they are, for FA3 to
accept or refuse in its own words.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from attnmatrix.matrix.cases import Case

from .base import Backend
from .problem import Problem, Unsupported

MODULE = "flash_attn_interface"


def entry(case: Case) -> str:
    if case.has("paged_kv"):
        return f"{MODULE}.flash_attn_with_kvcache"
    if case.has("varlen"):
        return f"{MODULE}.flash_attn_varlen_func"
    return f"{MODULE}.flash_attn_func"


def _first(out):
    # Some FA3 releases return (out, softmax_lse) from every entry point; later ones only `out`.
    return out[0] if isinstance(out, (tuple, list)) else out


def prepare(p: Problem) -> Callable[[], torch.Tensor]:
    c = p.case
    for feat, what in (("alibi", "ALiBi slopes"), ("sinks", "attention sinks")):
        if c.has(feat):
            raise Unsupported(f"flash_attn_interface (FlashAttention 3) has no parameter for {what}")
    import flash_attn_interface as fa3

    kw: dict = {
        "softmax_scale": p.scale,
        "causal": p.causal,
        "window_size": p.window if p.window is not None else (-1, -1),
        "softcap": p.softcap,
    }
    b, hkv = p.shape.batch, p.k.shape[2]
    if p.descale is not None:
        for name, s in zip(("q_descale", "k_descale", "v_descale"), p.descale, strict=True):
            kw[name] = torch.full((b, hkv), s, dtype=torch.float32, device=p.q.device)
    paged, varlen = c.has("paged_kv"), c.has("varlen")
    if paged:
        k_cache, v_cache, table = p.paged_kv()
        kw.update(cache_seqlens=p.seqlens_k_tensor(), page_table=table)
        if varlen:
            q, _, _, cu_q, _ = p.packed()
            unpack = p.unpacker()
            kw.update(cu_seqlens_q=cu_q, max_seqlen_q=p.max_valid_q())

            def call() -> torch.Tensor:
                return unpack(_first(fa3.flash_attn_with_kvcache(q, k_cache, v_cache, **kw)))

            return call

        def call() -> torch.Tensor:
            return _first(fa3.flash_attn_with_kvcache(p.q, k_cache, v_cache, **kw))

        return call
    if varlen:
        q, k, v, cu_q, cu_k = p.packed()
        max_q = p.max_valid_q()
        max_k = p.max_valid_k()
        unpack = p.unpacker()

        def call() -> torch.Tensor:
            return unpack(_first(fa3.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, **kw)))

        return call

    def call() -> torch.Tensor:
        return _first(fa3.flash_attn_func(p.q, p.k, p.v, **kw))

    return call


FA3 = Backend.declare("fa3", prepare, entry)
