"""PyTorch `scaled_dot_product_attention`, one backend per SDPA kernel (and the CPU dispatch).

SDPA has parameters for causal masks, arbitrary masks/biases and GQA only. Softcap, sinks, paged KV
and cu_seqlens varlen have no parameter: those cases are `Unsupported` (attnmatrix's statement about
the API). Everything else is passed to torch, and what a kernel refuses is recorded in torch's words
(`sdpa_kernel` restricts dispatch to one kernel, so its refusal is that kernel's).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from attnmatrix.matrix.cases import Case

from .base import Backend
from .problem import Problem, Unsupported
from .reference import mask_for


def _mask(p: Problem) -> tuple[torch.Tensor | None, bool]:
    """(attn_mask, is_causal) expressing the problem's mask and bias for SDPA's (B, H, Sq, Sk)."""
    sq, sk = p.shape.seqlen_q, p.shape.seqlen_k
    if p.alibi_slopes is None and p.window is None:
        if not p.causal or sq == 1:
            return None, False  # one decode token, bottom-right aligned, sees every key
        if sq == sk:
            return None, True
    allowed = mask_for(p, sq, sk, p.q.device)
    if p.alibi_slopes is None:
        return allowed, False
    i = torch.arange(sq, device=p.q.device).unsqueeze(1) + (sk - sq)
    j = torch.arange(sk, device=p.q.device).unsqueeze(0)
    bias = -p.alibi_slopes.view(-1, 1, 1) * (i - j).abs().float()
    if allowed is not None:
        bias = bias.masked_fill(~allowed, float("-inf"))
    return bias.to(p.out_dtype).unsqueeze(0), False


def _prepare(kernel: str | None) -> Callable[[Problem], Callable[[], torch.Tensor]]:
    def prepare(p: Problem) -> Callable[[], torch.Tensor]:
        c = p.case
        for feat, what in (("softcap", "a softcap"), ("sinks", "attention sinks"), ("paged_kv", "a paged KV cache"),
                           ("varlen", "cu_seqlens (varlen) inputs")):
            if c.has(feat):
                raise Unsupported(f"scaled_dot_product_attention has no parameter for {what}")
        q, k, v = (t.transpose(1, 2) for t in (p.q, p.k, p.v))
        mask, is_causal = _mask(p)
        gqa = k.shape[1] != q.shape[1]
        ctx = None
        if kernel is not None:
            from torch.nn.attention import SDPBackend

            ctx = getattr(SDPBackend, kernel)

        def call() -> torch.Tensor:
            kw = {"attn_mask": mask, "is_causal": is_causal, "scale": p.scale}
            if gqa:
                kw["enable_gqa"] = True
            if ctx is None:
                out = F.scaled_dot_product_attention(q, k, v, **kw)
            else:
                from torch.nn.attention import sdpa_kernel

                with sdpa_kernel(ctx):
                    out = F.scaled_dot_product_attention(q, k, v, **kw)
            return out.transpose(1, 2)

        return call

    return prepare


def _entry(label: str) -> Callable[[Case], str]:
    return lambda case: f"torch.nn.functional.scaled_dot_product_attention[{label}]"


SDPA_CPU = Backend("sdpa_cpu", "torch", "cpu", ("torch",), _prepare(None), _entry("cpu"))
SDPA_FLASH = Backend("sdpa_flash", "torch", "cuda", ("torch",), _prepare("FLASH_ATTENTION"), _entry("FLASH_ATTENTION"))
SDPA_EFFICIENT = Backend("sdpa_efficient", "torch", "cuda", ("torch",), _prepare("EFFICIENT_ATTENTION"),
                         _entry("EFFICIENT_ATTENTION"))
SDPA_CUDNN = Backend("sdpa_cudnn", "torch", "cuda", ("torch",), _prepare("CUDNN_ATTENTION"), _entry("CUDNN_ATTENTION"))
SDPA_MATH = Backend("sdpa_math", "torch", "cuda", ("torch",), _prepare("MATH"), _entry("MATH"))
