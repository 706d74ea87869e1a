"""FLOP counting that counts only unmasked work.

A causal or windowed case skips most of the score matrix; counting the dense product would inflate
TFLOP/s by up to 2x (causal) or far more (short windows). We count, per (query, key) pair that the
mask keeps, 2*D multiply-adds for Q.K^T and 2*Dv for P.V.
"""

from __future__ import annotations


def allowed_pairs(sq: int, sk: int, *, causal: bool, window: tuple[int, int] | None) -> int:
    """Number of (i, j) pairs the bottom-right-aligned causal/window mask allows, in O(sq)."""
    if not causal and window is None:
        return sq * sk
    total = 0
    offset = sk - sq
    for i in range(sq):
        ia = i + offset
        lo, hi = 0, sk - 1
        if causal:
            hi = min(hi, ia)
        if window is not None:
            lo = max(lo, ia - window[0])
            hi = min(hi, ia + window[1])
        if hi >= lo:
            total += hi - lo + 1
    return total


def attention_flops(
    *, batch: int, heads: int, seqlens_q: list[int], seqlens_k: list[int], head_dim: int, head_dim_v: int,
    causal: bool, window: tuple[int, int] | None,
) -> int:
    """Forward FLOPs of attention over ragged sequences (one entry per batch element)."""
    assert len(seqlens_q) == len(seqlens_k) == batch
    pairs = sum(allowed_pairs(sq, sk, causal=causal, window=window)
                for sq, sk in zip(seqlens_q, seqlens_k, strict=True))
    return 2 * heads * pairs * (head_dim + head_dim_v)


def problem_flops(p) -> int:
    """FLOPs of a `Problem` (kernels.problem), honouring varlen lengths and masks."""
    b = p.shape.batch
    return attention_flops(
        batch=b, heads=p.q.shape[2],
        seqlens_q=[p.valid_q(i) for i in range(b)], seqlens_k=[p.valid_k(i) for i in range(b)],
        head_dim=p.case.head_dim, head_dim_v=p.case.head_dim_v, causal=p.causal, window=p.window,
    )
