"""vLLM's own FlashAttention builds: `vllm_fa2` and `vllm_fa3`, called the way vLLM calls them.

vLLM does not run upstream flash-attn: its wheel ships `vllm.vllm_flash_attn`, a fork with two compiled
extensions (`_vllm_fa2_C`, `_vllm_fa3_C`) behind one Python entry point,
`flash_attn_varlen_func(q, k, v, max_seqlen_q, cu_seqlens_q, max_seqlen_k, cu_seqlens_k=, seqused_k=,
..., block_table=, fa_version=N, s_aux=)`. vLLM's FLASH_ATTN attention backend (prefill and decode
alike) and its FLASH_ATTN MLA prefill backend both call it, so a probe calls it too:

- every case goes in packed (varlen) layout, as vLLM's batches always are; a case without `varlen` is
  a batch of full-length sequences;
- paged KV: `block_table` with the case's block size, `seqused_k` instead of `cu_seqlens_k` (what
  vLLM passes for its paged cache; its block sizes are 16, 32, 64 and 128);
- causal (bottom-right), window (left, right), softcap and ALiBi slopes are the fork's arguments with
  the `Problem`'s meaning; the fork refuses what it cannot do in its own words (its FA3 path asserts
  "Alibi is not supported in FA3"; its FA2 path raises "FA2 does not support s_aux");
- attention sinks are `s_aux`, one logit per query head. The fork's FA3 takes them only as bfloat16,
  so they are passed as bfloat16 and the problem's sinks are rounded to the same values first: the
  reference then checks the kernel against exactly the sinks it was given;
- MLA prefill: (qk, v) head dims go in as they are for FA3; for FA2 V is zero-padded to the qk head
  dim and the output cut back, which is what vLLM's FLASH_ATTN MLA prefill does for every FA version
  but FA3 on Hopper and FA4 (`requires_v_padding` in vllm-project/vllm@4ba787ec9 (v0.33.0)
  vllm/v1/attention/backends/mla/prefill/flash_attn.py:387-394, the padding at :420-424);
- fp8: e4m3 tensors with (batch, heads_kv) float32 descales, as the fork's FA3 takes them;
- FA3's split-KV as vLLM's step sets it (`step_settings`): in vLLM's default CUDA graph mode
  (FULL_AND_PIECEWISE: a decode step replays a full graph) a step of at most the largest captured size runs
  with `num_splits` = 32, the bound of FA3's split of the KV cache among the SMs, where a larger step leaves
  it to FA3's own heuristic (0); and vLLM plans FA3's schedule ahead of the call (`get_scheduler_metadata`
  with the same bound, passed as `scheduler_metadata`) unless the model's layers use more than one sliding
  window (Gemma 2 and 3, gpt-oss), where it passes none (vllm-project/vllm@v0.26.0
  vllm/v1/attention/backends/flash_attn.py: the bound :400-420 and :489-499, the schedule :473-487 and
  :505-531, the call :1014-1039; the bound's default `flash_attn_max_num_splits_for_cuda_graph`
  vllm/config/attention.py:42; the largest captured size, min(2 x max_num_seqs, 512),
  vllm/config/compilation.py:692-704). vLLM does both for FA3 only: its FA2 and FA4 calls keep 0.
- a decode step replays the CUDA graph captured for the smallest of vLLM's captured batch sizes (1, 2, 4, every
  8th to 248, every 16th to the largest) that holds it, so the kernel runs that many sequences: the step's, then
  empty ones (no query token, no cached token, the null block in the block table), and FA3's schedule is planned
  for them all (`graph_batch`, `pad_to_graph`; vllm-project/vllm@v0.26.0 vllm/v1/worker/gpu_model_runner.py:
  `pad_attn` :4263 and the padded metadata :2285-2317 and :2337-2343, the zeroed lengths :2172; the sizes
  vllm/config/vllm.py:1748-1749 and :1808-1836, `matrix/vllm_graphs.py`). vLLM's FA4 call (kernels/vllm_fa4.py) is
  padded alike. It matters where a kernel's heuristic sees the padded batch: on the H200 at the batches vLLM pads,
  FA4 took 1.6% longer on average and up to 1.5x, FA3 (whose planned schedule sees the step's own lengths) 0.1%
  (benchmarks/results/README.md, the decode batch scan in vLLM's padded call); the selector reads FA4's decode
  time in the query's graph (backends.json `splits_see_graph_batch`).

The extensions are not on PyPI on their own: `scripts/vllm-fa-site.py` takes them from the vLLM wheel
of the release named there, with that wheel's `METADATA`, so the records' kernel version is the vLLM
release the build came from (library `vllm`). The module imports nothing from vLLM until a case runs.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from attnmatrix.matrix.cases import Case
from attnmatrix.matrix.vllm_graphs import GRAPH_TOKENS, capture_sizes

from .base import Backend
from .problem import Problem

PACKAGE = "vllm.vllm_flash_attn"
ENTRY = f"{PACKAGE}.flash_attn_varlen_func"
# The fork's extension per FlashAttention version: the package imports with either one present, so
# availability asks for the version's own extension, not just the package.
EXTENSIONS = {2: f"{PACKAGE}._vllm_fa2_C", 3: f"{PACKAGE}._vllm_fa3_C"}
SINK_DTYPE = torch.bfloat16  # the fork's FA3 takes s_aux only as bf16
# vLLM's FA3 step (see the module's docstring): the split bound of a step replayed from a full CUDA graph.
SPLIT_BOUND = 32


def graph_batch(p: Problem, paged: bool | None = None) -> int:
    """The number of sequences the kernel runs for this problem's step in vLLM: a decode step (one query token a
    sequence, on the paged cache: the case's, or `paged` where the caller pages it) of at most the largest
    captured size runs padded to the smallest captured size that holds it; any other step runs as it is."""
    b = p.shape.batch
    paged = p.case.has("paged_kv") if paged is None else paged
    if p.case.op != "decode" or not paged or b > GRAPH_TOKENS or p.max_valid_q() != 1:
        return b
    return next(n for n in capture_sizes() if n >= b)


def pad_to_graph(q: torch.Tensor, kw: dict, graph: int, table: str = "block_table") -> torch.Tensor:
    """Add the empty sequences of vLLM's padded decode step to a varlen call on the paged cache, in place in `kw`
    (`cu_seqlens_q` repeats its end, `seqused_k` is 0, the block table's row is the null block 0), and return q
    with their token rows (zeros): the kernel runs `graph` sequences, the output's first rows are the step's."""
    extra = graph - (kw["cu_seqlens_q"].numel() - 1)
    if extra <= 0:
        return q
    cu, used, blocks = kw["cu_seqlens_q"], kw["seqused_k"], kw[table]
    kw["cu_seqlens_q"] = torch.cat([cu, cu[-1:].expand(extra)])
    kw["seqused_k"] = torch.cat([used, used.new_zeros(extra)])
    kw[table] = torch.cat([blocks, blocks.new_zeros((extra, blocks.shape[1]))])
    return torch.cat([q, q.new_zeros((extra, *q.shape[1:]))])


def step_settings(p: Problem, version: int) -> tuple[int, bool]:
    """(num_splits, whether FA3's schedule is planned ahead) of vLLM's call for this problem's step: FA3's own
    heuristic and no plan (0, False) for FA2 and for a case without vLLM's paged cache."""
    if version != 3 or not p.case.has("paged_kv"):
        return 0, False
    tokens = sum(p.valid_q(b) for b in range(p.shape.batch))
    return (SPLIT_BOUND if tokens <= GRAPH_TOKENS else 0), p.one_window_size


def schedule_arguments(p: Problem, kw: dict) -> dict:
    """The keyword arguments of vLLM's `get_scheduler_metadata` call for the varlen call `kw` (its builder's
    `schedule()`: the sequences the kernel runs (`graph_batch`), the cache's block size, the call's causal flag and
    window, the step's split bound; vLLM passes the qk head dim alone and no softcap flag)."""
    hq, hkv = p.q.shape[2], p.k.shape[2]
    return {"batch_size": kw["seqused_k"].numel(), "max_seqlen_q": kw["max_seqlen_q"],
            "max_seqlen_k": kw["max_seqlen_k"],
            "num_heads_q": hq, "num_heads_kv": hkv, "headdim": p.case.head_dim, "cache_seqlens": kw["seqused_k"],
            "qkv_dtype": p.q.dtype, "cu_seqlens_q": kw["cu_seqlens_q"], "page_size": p.page_size,
            "causal": kw["causal"], "window_size": tuple(kw["window_size"]), "num_splits": kw.get("num_splits", 0)}


def entry_for(case: Case, version: int) -> str:
    """The call, as the record names it: entry point, FA version and the paged cache if any."""
    paged = f", block_table (block size {case.page_size})" if case.has("paged_kv") else ""
    return f"{ENTRY}(fa_version={version}{paged})"


def pads_v(case: Case, version: int) -> bool:
    """vLLM zero-pads V to the qk head dim for MLA prefill on every FA version but FA3 (and FA4)."""
    return case.op == "mla_prefill" and version == 2 and case.head_dim_v < case.head_dim


def call_arguments(p: Problem, version: int) -> tuple[tuple, dict, Callable[[torch.Tensor], torch.Tensor]]:
    """(positional q, k, v), keyword arguments and the output's unpacker for one call of the entry point. Where
    vLLM plans FA3's schedule ahead (`step_settings`), `prepare` adds the plan as `scheduler_metadata`.

    Pure: builds tensors, calls nothing from vLLM (the unit tests check the mapping on the CPU).
    """
    c = p.case
    b = p.shape.batch
    q, k, v, cu_q, cu_k = p.packed()
    kw: dict = {
        "max_seqlen_q": p.max_valid_q(),
        "cu_seqlens_q": cu_q,
        "max_seqlen_k": p.max_valid_k(),
        "softmax_scale": p.scale,
        "causal": p.causal,
        "window_size": list(p.window) if p.window is not None else [-1, -1],
        "softcap": p.softcap,
        "alibi_slopes": p.alibi_slopes,
        "fa_version": version,
    }
    if c.has("paged_kv"):
        k, v, table = p.paged_kv()
        kw.update(seqused_k=p.seqlens_k_tensor(), block_table=table)
        q = pad_to_graph(q, kw, graph_batch(p))
        b = kw["seqused_k"].numel()
    else:
        kw["cu_seqlens_k"] = cu_k
    splits, _ = step_settings(p, version)
    if splits:
        kw["num_splits"] = splits
    if p.sinks is not None:
        s_aux = p.sinks.to(SINK_DTYPE)
        p.sinks = s_aux.float()  # the reference sees the values the kernel was given
        kw["s_aux"] = s_aux
    if p.descale is not None:
        hkv = p.k.shape[2]
        for name, s in zip(("q_descale", "k_descale", "v_descale"), p.descale, strict=True):
            kw[name] = torch.full((b, hkv), s, dtype=torch.float32, device=p.q.device)
    unpack = p.unpacker()
    if b != p.shape.batch:  # the padded step's output: the step's own tokens first
        tokens, inner_step = sum(p.valid_q(i) for i in range(p.shape.batch)), unpack

        def unpack(out: torch.Tensor) -> torch.Tensor:
            return inner_step(out[:tokens])

    if pads_v(c, version):
        v = torch.nn.functional.pad(v, [0, c.head_dim - c.head_dim_v], value=0)
        dv = c.head_dim_v
        inner = unpack

        def unpack(out: torch.Tensor) -> torch.Tensor:
            return inner(out[..., :dv])

    return (q, k, v), kw, unpack


def _first(out):
    return out[0] if isinstance(out, (tuple, list)) else out


def make_prepare(version: int) -> Callable[[Problem], Callable[[], torch.Tensor]]:
    def prepare(p: Problem) -> Callable[[], torch.Tensor]:
        from vllm.vllm_flash_attn import flash_attn_varlen_func  # torch is already imported (problem.py)

        args, kw, unpack = call_arguments(p, version)
        if step_settings(p, version)[1]:  # planned once, before the calls, as vLLM's builder does each step
            from vllm.vllm_flash_attn import get_scheduler_metadata

            kw["scheduler_metadata"] = get_scheduler_metadata(**schedule_arguments(p, kw))

        def call() -> torch.Tensor:
            return unpack(_first(flash_attn_varlen_func(*args, **kw)))

        return call

    return prepare


# The registry (matrix/data/backends.json) declares each one's library `vllm` and its extension as the
# module that must import (EXTENSIONS).
VLLM_FA2 = Backend.declare("vllm_fa2", make_prepare(2), lambda c: entry_for(c, 2))
VLLM_FA3 = Backend.declare("vllm_fa3", make_prepare(3), lambda c: entry_for(c, 3))
