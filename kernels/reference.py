"""The reference: plain attention in float32 (float64 on request), written for clarity, not speed.

It implements every feature of `Problem` directly from its definition, so a kernel is judged
against the definition rather than against another kernel.
"""

from __future__ import annotations

import torch

from .problem import Problem


def mask_for(p: Problem, sq: int, sk: int, device: torch.device) -> torch.Tensor | None:
    """Boolean (sq, sk) mask of allowed positions, bottom-right aligned; None means all allowed."""
    if not p.causal and p.window is None:
        return None
    i = torch.arange(sq, device=device).unsqueeze(1) + (sk - sq)  # aligned query positions
    j = torch.arange(sk, device=device).unsqueeze(0)
    allowed = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if p.causal:
        allowed &= j <= i
    if p.window is not None:
        left, right = p.window
        allowed &= (j >= i - left) & (j <= i + right)
    return allowed


def reference_attention(p: Problem, *, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Output (B, Sq, Hq, Dv) in `dtype`. Rows past a varlen sequence's end are zero."""
    b, sq_pad, hq, _ = p.q.shape
    hkv = p.k.shape[2]
    dq, dk, dv = p.descale if p.descale is not None else (1.0, 1.0, 1.0)
    out = torch.zeros(b, sq_pad, hq, p.v.shape[-1], dtype=dtype, device=p.q.device)
    for bi in range(b):
        sq, sk = p.valid_q(bi), p.valid_k(bi)
        q = (p.q[bi, :sq].to(dtype) * dq).transpose(0, 1)  # (Hq, sq, D)
        k = (p.k[bi, :sk].to(dtype) * dk).transpose(0, 1)
        v = (p.v[bi, :sk].to(dtype) * dv).transpose(0, 1)
        if hkv != hq:  # grouped-query attention: each kv head serves hq // hkv query heads
            k = k.repeat_interleave(hq // hkv, dim=0)
            v = v.repeat_interleave(hq // hkv, dim=0)
        s = torch.matmul(q, k.transpose(-1, -2)) * p.scale
        if p.softcap:
            s = p.softcap * torch.tanh(s / p.softcap)
        if p.alibi_slopes is not None:
            i = torch.arange(sq, device=s.device).unsqueeze(1) + (sk - sq)
            j = torch.arange(sk, device=s.device).unsqueeze(0)
            s = s - p.alibi_slopes.to(dtype).view(hq, 1, 1) * (i - j).abs().to(dtype)
        allowed = mask_for(p, sq, sk, s.device)
        if allowed is not None:
            s = s.masked_fill(~allowed, float("-inf"))
        if p.sinks is not None:
            sink = p.sinks.to(dtype).view(hq, 1, 1).expand(hq, sq, 1)
            s = torch.cat([s, sink], dim=-1)
        m = s.amax(dim=-1, keepdim=True)
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))  # fully masked rows give 0, not NaN
        w = torch.exp(s - m)
        denom = w.sum(dim=-1, keepdim=True)
        w = w / torch.where(denom > 0, denom, torch.ones_like(denom))
        if p.sinks is not None:
            w = w[..., :-1]
        out[bi, :sq] = torch.matmul(w, v).transpose(0, 1)
    return out


# Tolerances against the float32 reference, per input dtype: a few units in the last place of the
# output dtype on outputs of magnitude ~1, which is what flash-attention's own tests allow.
TOLERANCES = {
    "bfloat16": {"atol": 2e-2, "rtol": 2e-2},
    "float16": {"atol": 4e-3, "rtol": 4e-3},
    "fp8": {"atol": 1.5e-1, "rtol": 1.5e-1},
}


def compare(p: Problem, out: torch.Tensor, ref: torch.Tensor) -> dict:
    """Error measures of `out` against `ref` over valid rows; `ok` decides pass or wrong."""
    tol = TOLERANCES["fp8" if p.fp8 else p.case.dtype]
    o, r = out.float(), ref.float().to(out.device)
    if p.seqlens_q is not None:  # only rows inside each ragged sequence are defined
        rows = torch.zeros(out.shape[:2], dtype=torch.bool, device=out.device)
        for bi in range(p.shape.batch):
            rows[bi, : p.valid_q(bi)] = True
        o, r = o[rows], r[rows]
    nan = int(torch.isnan(o).sum())
    inf = int(torch.isinf(o).sum())
    diff = (o - r).abs()
    finite = torch.isfinite(diff)
    # None when no element is finite: JSON has no Infinity, and "no finite output" is what happened.
    max_abs = round(float(diff[finite].max()), 6) if bool(finite.any()) else None
    mean_abs = round(float(diff[finite].mean()), 7) if bool(finite.any()) else None
    bad = int((~(diff <= tol["atol"] + tol["rtol"] * r.abs())).sum())
    return {
        "ok": nan == 0 and inf == 0 and bad == 0, "max_abs_err": max_abs,
        "mean_abs_err": mean_abs, "mismatched": bad, "nan": nan, "inf": inf, "elements": o.numel(),
        "atol": tol["atol"], "rtol": tol["rtol"],
    }
