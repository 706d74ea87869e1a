"""PyTorch `scaled_dot_product_attention`, one backend per SDPA kernel (and the CPU dispatch).

SDPA has parameters for causal masks, arbitrary masks/biases and GQA only. Softcap, sinks, paged KV
and cu_seqlens varlen have no parameter: those cases are `Unsupported` (attnmatrix's statement about
the API). Everything else is passed to torch, and what a kernel refuses is recorded in torch's words
(`sdpa_kernel` restricts dispatch to one kernel, so its refusal is that kernel's).

Masks: causal with seqlen_q == seqlen_k is `is_causal=True`; causal with 1 < seqlen_q < seqlen_k is
`causal_lower_right` (bottom-right, as the `Problem` defines it; flash and efficient take it without
a dense mask); a window or ALiBi is a dense (Sq, Sk) mask or float bias, which the flash kernel
refuses in torch's words (SDPA has no window or ALiBi argument).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F
from attnmatrix.matrix.cases import Case

# Imported here, not per case: torch.nn.attention.bias pulls in torch._dynamo (seconds), which must
# not count against the first case's timeout.
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import CausalBias, causal_lower_right

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
            return None, True  # top-left and bottom-right coincide
        if sq < sk:
            return causal_lower_right(sq, sk), False
    allowed = mask_for(p, sq, sk, p.q.device)
    if p.alibi_slopes is None:
        return allowed, False
    i = torch.arange(sq, device=p.q.device).unsqueeze(1) + (sk - sq)
    j = torch.arange(sk, device=p.q.device).unsqueeze(0)
    bias = -p.alibi_slopes.view(-1, 1, 1) * (i - j).abs().float()
    if allowed is not None:
        bias = bias.masked_fill(~allowed, float("-inf"))
    return bias.to(p.out_dtype).unsqueeze(0), False


# How torch names each kernel in the warnings that say why it was not used.
_KERNEL_WORDS = {"FLASH_ATTENTION": "flash", "EFFICIENT_ATTENTION": "efficient", "CUDNN_ATTENTION": "cudnn",
                 "MATH": "math"}
_TRIGGERED = re.compile(r"\s*\(Triggered internally at [^)]*\)\.?\s*$")


def _torch_reasons(kernel: str | None, seen: list[warnings.WarningMessage]) -> str:
    """torch's own reasons from the warnings of a refused call: the restricted kernel's section, else all.

    When no kernel can run, torch warns "<kernel> not used because:" followed by one warning per
    failed check, for every kernel, and then raises a generic "No available kernel".
    """
    msgs = [_TRIGGERED.sub("", str(w.message)).strip() for w in seen]
    msgs = [m for m in dict.fromkeys(msgs) if m]
    word = _KERNEL_WORDS.get(kernel or "", "")
    section: list[str] = []
    inside = False
    for m in msgs:
        if m.endswith("because:"):
            inside = bool(word) and word in m.lower()
        if inside:
            section.append(m)
    return " ".join(section or msgs)


def _prepare(kernel: str | None) -> Callable[[Problem], Callable[[], torch.Tensor]]:
    def prepare(p: Problem) -> Callable[[], torch.Tensor]:
        c = p.case
        for feat, what in (("softcap", "a softcap"), ("sinks", "attention sinks"), ("paged_kv", "a paged KV cache"),
                           ("varlen", "cu_seqlens (varlen) inputs")):
            if c.has(feat):
                raise Unsupported(f"scaled_dot_product_attention has no parameter for {what}")
        q, k, v = (t.transpose(1, 2) for t in (p.q, p.k, p.v))
        mask, is_causal = _mask(p)
        kw = {"attn_mask": mask, "is_causal": is_causal, "scale": p.scale}
        if k.shape[1] != q.shape[1]:
            kw["enable_gqa"] = True
        # The aten op is what F.scaled_dot_product_attention binds to; calling it through torch.ops
        # leaves a torch frame innermost in a refusal's traceback, so the probe records the refusal
        # as torch's rather than as an error of this adapter (a C function adds no frame of its own).
        # A CausalBias mask dispatches in Python (torch/nn/attention/bias.py) from F's entry point.

        sdpa = F.scaled_dot_product_attention if isinstance(mask, CausalBias) \
            else torch.ops.aten.scaled_dot_product_attention
        backend = None
        if kernel is not None:

            backend = getattr(SDPBackend, kernel)

        def run(fn: Callable[..., torch.Tensor]) -> torch.Tensor:
            if backend is None:
                return fn(q, k, v, **kw)

            with sdpa_kernel(backend):
                return fn(q, k, v, **kw)

        def call() -> torch.Tensor:
            try:
                out = run(sdpa)
            except RuntimeError as e:
                if e.args and isinstance(e.args[0], str) and e.args[0].startswith("No available kernel"):
                    # torch says why only in warnings, and only F's binding turns them into Python
                    # warnings (torch.ops prints them to stderr): ask once more through F to read them.
                    with warnings.catch_warnings(record=True) as seen:
                        warnings.simplefilter("always")
                        try:
                            run(F.scaled_dot_product_attention)
                        except RuntimeError:
                            pass
                    why = _torch_reasons(kernel, seen)
                    if why:
                        e.args = (f"{e.args[0]} {why}", *e.args[1:])
                raise
            return out.transpose(1, 2)

        return call

    return prepare


def _entry(label: str) -> Callable[[Case], str]:
    return lambda case: f"torch.nn.functional.scaled_dot_product_attention[{label}]"


SDPA_CPU = Backend.declare("sdpa_cpu", _prepare(None), _entry("cpu"))
SDPA_FLASH = Backend.declare("sdpa_flash", _prepare("FLASH_ATTENTION"), _entry("FLASH_ATTENTION"))
SDPA_EFFICIENT = Backend.declare("sdpa_efficient", _prepare("EFFICIENT_ATTENTION"), _entry("EFFICIENT_ATTENTION"))
SDPA_CUDNN = Backend.declare("sdpa_cudnn", _prepare("CUDNN_ATTENTION"), _entry("CUDNN_ATTENTION"))
SDPA_MATH = Backend.declare("sdpa_math", _prepare("MATH"), _entry("MATH"))
