"""The concrete inputs of one case: tensors plus the attention semantics every backend must honour.

One representation is shared by every backend and by the reference, so that "the kernel was given
the same problem" holds by construction. Conventions follow flash-attention's, which the engines use:

- layout (batch, seqlen, heads, head_dim);
- causal and sliding-window masks are aligned to the bottom-right when seqlen_q != seqlen_k
  (query i sees key j iff j <= i + seqlen_k - seqlen_q), so one decode token sees the whole cache;
- window (left, right) keeps keys j with i' - left <= j <= i' + right, i' the aligned query index;
- softcap: scores <- softcap * tanh(scores / softcap), after scaling, before masking;
- ALiBi adds -slope * |i' - j|; sinks are one extra logit per head in the softmax denominator;
- fp8: q, k, v are e4m3 and stand for `descale * value` (the kernel's q/k/v descales);
- fp8_kv (an fp8 KV cache, vLLM's kv_cache_dtype="fp8"): k and v are e4m3 and stand for `descale * value`,
  q stays in the case's dtype (its descale is 1).

Every input is built so that a kernel that ignores a requested feature gets a visibly different answer
(kernels/sensitivity.py measures it; tests hold every feature to >= 10x the tolerance): logits are
spread (std LOGIT_STD) so masks, ALiBi and the cap change which keys win; the cap is low enough to
bite; sink logits sit near a row's log-sum-exp; windows cut most of a row; fp8 descales are not 1.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from itertools import accumulate

import torch
from attnmatrix.matrix.cases import Case

# The shapes live with the matrix (torch-free): the pages turn a timed shape's name back into its sizes.
from attnmatrix.matrix.shapes import CPU_TIMING_SHAPES, TIMING_SHAPES, VALIDATION_SHAPES, WINDOW, Shape  # noqa: F401

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
GQA_RATIO = 4


@dataclass(frozen=True)
class Recipe:
    """How a problem's values are drawn. Records say which version validated them (`extra.problem`);
    a record without it was validated on version 1."""

    version: int
    # Standard deviation of the scaled logits q.k * scale. At 1, attention over hundreds of keys is
    # nearly uniform and averages away what a mask, a bias or a cap changes; at 3 a few keys win in
    # each row, and which ones is what every feature decides.
    logit_std: float
    # A cap bites where |score| is near it: with logits of std 3, a cap of 5 changes most rows. It is
    # also small enough that a kernel's approximate tanh (error ~2^-11 of the cap) stays far inside
    # float16's tolerance.
    softcap: float
    # Sink logits centred near the largest of a row's logits (logit_std * sqrt(2 ln seqlen_k)), so a
    # sink takes a share of every row, from most of it to little, head by head; else N(0, 1).
    sinks_near_row_max: bool
    # fp8 descales (q, k, v): not 1, so a kernel that drops them is off by far more than the tolerance.
    # All below 1: dropping q's and k's sharpens the softmax, dropping v's scales the output up, and
    # a larger wrong output is what fp8's relative tolerance (0.15) cannot absorb (descales above 1
    # flatten a decode row into a small average, within 5x of the tolerance). Powers of two, so
    # `value / descale` loses nothing before the e4m3 cast.
    fp8_descale: tuple[float, float, float]
    shape_windows: bool  # the window is the shape's (validation shapes cut most of a row); else WINDOW


# Version 1 could not tell a kernel that ignores a softcap, a sink or fp8 descales from a right one on
# some cells (kernels/sensitivity.py measures it); version 2 can, for every feature of the case space.
RECIPE_V1 = Recipe(1, logit_std=1.0, softcap=30.0, sinks_near_row_max=False, fp8_descale=(1.0, 1.0, 1.0),
                   shape_windows=False)
RECIPE = Recipe(2, logit_std=3.0, softcap=5.0, sinks_near_row_max=True, fp8_descale=(0.5, 0.5, 0.25),
                shape_windows=True)
RECIPES = {r.version: r for r in (RECIPE_V1, RECIPE)}
SOFTCAP = RECIPE.softcap
LOGIT_STD = RECIPE.logit_std
FP8_DESCALE = RECIPE.fp8_descale


class Unsupported(Exception):
    """The library's API has no way to express this case (e.g. no softcap argument).

    This is attnmatrix's statement about the API, not the kernel's; records say so.
    """


@dataclass
class Problem:
    case: Case
    shape: Shape
    q: torch.Tensor  # (B, Sq, Hq, D)
    k: torch.Tensor  # (B, Sk, Hkv, D)
    v: torch.Tensor  # (B, Sk, Hkv, Dv)
    scale: float
    causal: bool
    window: tuple[int, int] | None
    softcap: float
    alibi_slopes: torch.Tensor | None  # (Hq,) float32
    sinks: torch.Tensor | None  # (Hq,) float32
    seqlens_q: list[int] | None  # varlen: valid lengths per batch element (<= Sq)
    seqlens_k: list[int] | None
    page_size: int | None
    fp8: bool  # e4m3 inputs (fp8: q, k and v; fp8_kv: k and v): fp8 tolerances apply
    descale: tuple[float, float, float] | None  # fp8 q, k, v scales
    # Every attention layer of the model shares one sliding window (or none): an engine can then plan a kernel's
    # schedule once for all of them, and vLLM does so for FA3 (kernels/vllm_fa.py). A property of the model, not of
    # the case: the workload sweep sets it from the preset (matrix/workloads.py Layer.one_window_size).
    one_window_size: bool = True

    @property
    def out_dtype(self) -> torch.dtype:
        return DTYPES[self.case.dtype]

    @property
    def mask(self) -> str:
        """The mask this problem asks for, as records state it (`extra.mask`): "causal" or "none" (a window is
        its own feature on top of either)."""
        return "causal" if self.causal else "none"

    def valid_q(self, b: int) -> int:
        return self.seqlens_q[b] if self.seqlens_q else self.shape.seqlen_q

    def valid_k(self, b: int) -> int:
        return self.seqlens_k[b] if self.seqlens_k else self.shape.seqlen_k

    def max_valid_q(self) -> int:
        """The longest sequence's valid query tokens (a varlen call's `max_seqlen_q`)."""
        return max(self.valid_q(i) for i in range(self.shape.batch))

    def max_valid_k(self) -> int:
        """The longest sequence's valid key tokens (a varlen call's `max_seqlen_k`)."""
        return max(self.valid_k(i) for i in range(self.shape.batch))

    def packed(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Varlen layout: q, k, v packed over valid tokens, plus int32 cu_seqlens for q and k."""
        b = self.shape.batch
        qs = [self.q[i, : self.valid_q(i)] for i in range(b)]
        ks = [self.k[i, : self.valid_k(i)] for i in range(b)]
        vs = [self.v[i, : self.valid_k(i)] for i in range(b)]
        cu_q = torch.tensor([0] + list(accumulate(len(x) for x in qs)), dtype=torch.int32)
        cu_k = torch.tensor([0] + list(accumulate(len(x) for x in ks)), dtype=torch.int32)
        dev = self.q.device
        return torch.cat(qs), torch.cat(ks), torch.cat(vs), cu_q.to(dev), cu_k.to(dev)

    def unpacker(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """A function from packed (total_q, H, Dv) output to (B, Sq, H, Dv), rows past a sequence's
        end zero. The indices are computed here, once, so a timed call runs one copy kernel and no
        Python loop over the batch."""
        b, sq = self.shape.batch, self.shape.seqlen_q
        lens = [self.valid_q(i) for i in range(b)]
        if all(n == sq for n in lens):
            return lambda out: out.view(b, sq, *out.shape[1:])
        idx = torch.cat([torch.arange(n) + i * sq for i, n in enumerate(lens)]).to(self.q.device)

        def unpack(out: torch.Tensor) -> torch.Tensor:
            full = out.new_zeros((b * sq, *out.shape[1:]))
            full.index_copy_(0, idx, out)
            return full.view(b, sq, *out.shape[1:])

        return unpack

    def unpack(self, out_packed: torch.Tensor) -> torch.Tensor:
        return self.unpacker()(out_packed)

    def seqlens_k_tensor(self) -> torch.Tensor:
        """Valid key lengths per batch element, int32 on the problem's device (cache_seqlens, seqused_k)."""
        return torch.tensor([self.valid_k(i) for i in range(self.shape.batch)], dtype=torch.int32,
                            device=self.q.device)

    def paged_kv(self, generator: torch.Generator | None = None):
        """(k_cache, v_cache, block_table) with blocks in a shuffled order, so a kernel that ignores
        the table reads the wrong keys and fails validation. The default shuffle is fixed per batch
        size: reproducible, and still not the identity."""
        generator = generator or torch.Generator().manual_seed(1234 + self.shape.batch)
        ps = self.page_size or 16
        b, sk, hkv, d = self.k.shape
        nblk = math.ceil(sk / ps)
        pad = nblk * ps - sk
        perm = torch.randperm(b * nblk, generator=generator)  # on the CPU: no device syncs
        table = perm.view(b, nblk).to(torch.int32)

        def scatter(x: torch.Tensor) -> torch.Tensor:
            raw = x.view(torch.uint8) if x.element_size() == 1 else x  # fp8: padding and indexing as bytes
            blocks = torch.nn.functional.pad(raw, (0, 0, 0, 0, 0, pad)).reshape(b * nblk, ps, hkv, x.shape[-1])
            cache = torch.zeros_like(blocks)
            cache[perm.to(x.device)] = blocks  # block i of the flat order lands in slot perm[i]
            return cache.view(x.dtype)

        k_cache, v_cache = scatter(self.k), scatter(self.v)
        table = table.to(self.k.device)
        return k_cache, v_cache, table


def make_problem(case: Case, shape: Shape, *, device: str | torch.device = "cpu", seed: int = 0,
                 draw_on_device: bool = False, recipe: Recipe = RECIPE) -> Problem:
    """Fresh random inputs for a case (never zeros: zeros hide wrong kernels and flatter timings).

    By default the values are drawn on the CPU, so a validation problem is the same on every device.
    `draw_on_device` draws them on `device` instead, for timing shapes: a decode timing shape's K and V
    hold over 4 G values at head dim 256, which takes one CPU worker 40 to 130 s per case, for timed
    loops of under a second.
    """
    gen_device = torch.device(device) if draw_on_device else torch.device("cpu")
    g = torch.Generator(device=gen_device).manual_seed(seed)
    dtype = DTYPES[case.dtype]
    hq = shape.heads_q
    # A shape with its own KV head count (a model's layer, matrix/workloads.py) keeps it; the case space's
    # shapes have as many KV heads as query heads, and a `gqa` case groups GQA_RATIO query heads per KV head.
    if shape.heads_kv != shape.heads_q:
        hkv = shape.heads_kv
    else:
        hkv = max(1, hq // GQA_RATIO) if case.has("gqa") else shape.heads_kv

    def rnd(*s: int, std: float = 1.0) -> torch.Tensor:
        if gen_device.type != "cpu":  # straight in the kernel's dtype: no float32 copy of a large cache
            t = torch.randn(*s, generator=g, device=gen_device, dtype=dtype)
            return t.mul_(std) if std != 1.0 else t
        return (torch.randn(*s, generator=g, dtype=torch.float32) * std).to(device=device, dtype=dtype)

    q = rnd(shape.batch, shape.seqlen_q, hq, case.head_dim, std=recipe.logit_std)  # q.k/sqrt(d) ~ N(0, std^2)
    k = rnd(shape.batch, shape.seqlen_k, hkv, case.head_dim)
    v = rnd(shape.batch, shape.seqlen_k, hkv, case.head_dim_v)
    seqlens_q = seqlens_k = None
    if case.has("varlen") and shape.batch > 1:
        # Ragged lengths between half and all of the padded length; the first is always full.
        fr = torch.rand(shape.batch, generator=g, device=gen_device)
        seqlens_k = [shape.seqlen_k] + [max(1, int(shape.seqlen_k * (0.5 + 0.5 * float(x)))) for x in fr[1:]]
        if shape.seqlen_q == shape.seqlen_k:
            seqlens_q = list(seqlens_k)
        else:
            seqlens_q = [shape.seqlen_q] * shape.batch
    alibi = None
    if case.has("alibi"):
        alibi = torch.tensor([2 ** (-8 * (h + 1) / hq) for h in range(hq)], dtype=torch.float32, device=device)
    sinks = None
    if case.has("sinks"):
        sinks = torch.randn(hq, generator=g, device=gen_device)
        if recipe.sinks_near_row_max:
            sinks += recipe.logit_std * math.sqrt(2 * math.log(max(2, shape.seqlen_k)))
        sinks = sinks.to(device)
    descale = None
    if case.has("fp8"):
        fp8 = torch.float8_e4m3fn
        descale = recipe.fp8_descale
        q, k, v = ((t / d).to(fp8) for t, d in zip((q, k, v), descale, strict=True))
    elif case.has("fp8_kv"):
        descale = (1.0, *recipe.fp8_descale[1:])
        k, v = ((t / d).to(torch.float8_e4m3fn) for t, d in zip((k, v), descale[1:], strict=True))
    # The mask is the case's: an MLA prefill case without `causal` is the non-causal call (vLLM's context-chunk
    # prefill over cached prefix keys), not a causal one under a misleading label.
    causal = case.has("causal")
    window = ((shape.window if recipe.shape_windows else WINDOW), 0) if case.has("sliding_window") else None
    return Problem(
        case=case, shape=shape, q=q, k=k, v=v, scale=1.0 / math.sqrt(case.head_dim), causal=causal,
        window=window, softcap=recipe.softcap if case.has("softcap") else 0.0, alibi_slopes=alibi, sinks=sinks,
        seqlens_q=seqlens_q, seqlens_k=seqlens_k, page_size=case.page_size,
        fp8=case.has("fp8") or case.has("fp8_kv"),
        descale=descale,
    )
