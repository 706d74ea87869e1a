"""FlashAttention 4 (`flash-attn-4`, import `flash_attn.cute`): the CuTe DSL kernels.

FA4's public forward entry points are `flash_attn_func` and `flash_attn_varlen_func`; both return
`(out, lse)`. Which one a case uses follows from its features alone:

- paged KV (with or without varlen): `flash_attn_varlen_func(..., page_table=, seqused_k=)`; FA4
  refuses `cu_seqlens_k` together with a page table, so the keys' lengths go in `seqused_k`, and
  the queries are batched (B, Sq, H, D), or packed with `cu_seqlens_q` when the case is varlen;
- varlen: `flash_attn_varlen_func` on packed q/k/v with int32 `cu_seqlens_q/k` and host-int
  `max_seqlen_q/k`;
- everything else (decode, seqlen_q = 1, included): `flash_attn_func`.

Arguments, all with the `Problem`'s meaning: `softmax_scale`, `causal` (bottom-right aligned),
`window_size=(left, right)` (`(None, None)` for no window), `softcap` (0.0 = off),
`learnable_sink` ((H,) float32 per-head sink logits). GQA is native (fewer k/v heads). Head dims
(head_dim != head_dim_v included) go in unchanged, so FA4 accepts or refuses them itself.

What FA4's public API cannot express (attnmatrix's statement, raised as `Unsupported`):

- ALiBi: FA4 has no `alibi_slopes` parameter (no ALiBi anywhere in `flash_attn.cute`); only a
  user-written `score_mod` could emulate it, which is not the feature engines select.
- fp8 descales other than 1: `flash_attn_func`/`flash_attn_varlen_func` take fp8 (e4m3) q/k/v but
  have no `q_descale/k_descale/v_descale` parameter (only the private `interface._flash_attn_fwd`
  has). The `Problem`'s descales are 1.0, which is exactly "no descale", so fp8 cases run through
  the public API; FA4 itself refuses fp8 off SM100 ("FP8 is only supported on SM100 ...") and
  returns bf16 for fp8 inputs.

`compile_only` builds the same call with fake CUDA tensors under `FakeTensorMode`: FA4 then
compiles the forward kernel (CuTe DSL -> cubin) and skips the launch. With `FLASH_ATTENTION_ARCH`,
`CUTE_DSL_ARCH` and `FLASH_ATTENTION_NUM_SMS` set before FA4 is imported, this works on a machine
without a GPU (see `xcompile.py`).
"""

from __future__ import annotations

import os
import re
import struct
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from attnmatrix.matrix.cases import Case

from .base import Backend
from .problem import Problem, Unsupported

MODULE = "flash_attn.cute"


def entry(case: Case) -> str:
    if case.has("paged_kv") or case.has("varlen"):
        return f"{MODULE}.flash_attn_varlen_func"
    return f"{MODULE}.flash_attn_func"


@dataclass
class FA4Call:
    """One FA4 call, unbound: the entry point's name, its arguments, and how to turn its `out`
    into (B, Sq, H, Dv). Tensors are the problem's; `compile_only` swaps them for fake ones."""

    func: str  # "flash_attn_func" or "flash_attn_varlen_func"
    args: tuple
    kwargs: dict = field(default_factory=dict)
    post: Callable[[torch.Tensor], torch.Tensor] = lambda out: out

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in (*self.args, *self.kwargs.values()) if isinstance(t, torch.Tensor)]


def build_call(p: Problem) -> FA4Call:
    """Map a `Problem` onto FA4's public API, or raise `Unsupported` for what it cannot express."""
    c = p.case
    if c.has("alibi") or p.alibi_slopes is not None:
        raise Unsupported("flash_attn.cute (FlashAttention 4) has no alibi_slopes parameter (ALiBi could only be "
                          "hand-written as a score_mod)")
    if p.descale is not None and any(float(s) != 1.0 for s in p.descale):
        raise Unsupported("flash_attn.cute.flash_attn_func/flash_attn_varlen_func have no q_descale/k_descale/"
                          "v_descale parameter (only the private interface._flash_attn_fwd has)")
    kw: dict = {
        "softmax_scale": p.scale,
        "causal": p.causal,
        "window_size": tuple(p.window) if p.window is not None else (None, None),
        "softcap": p.softcap,
    }
    if p.sinks is not None:
        kw["learnable_sink"] = p.sinks
    paged, varlen = c.has("paged_kv"), c.has("varlen")
    if paged:
        k_cache, v_cache, table = p.paged_kv()
        kw.update(page_table=table, seqused_k=p.seqlens_k_tensor())
        if varlen:
            q, _, _, cu_q, _ = p.packed()
            kw.update(cu_seqlens_q=cu_q, max_seqlen_q=p.max_valid_q())
            return FA4Call("flash_attn_varlen_func", (q, k_cache, v_cache), kw, p.unpacker())
        return FA4Call("flash_attn_varlen_func", (p.q, k_cache, v_cache), kw)
    if varlen:
        q, k, v, cu_q, cu_k = p.packed()
        kw.update(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=p.max_valid_q(),
                  max_seqlen_k=p.max_valid_k())
        return FA4Call("flash_attn_varlen_func", (q, k, v), kw, p.unpacker())
    return FA4Call("flash_attn_func", (p.q, p.k, p.v), kw)


def _out(result) -> torch.Tensor:
    # FA4 returns (out, lse); lse is None unless return_lse=True.
    return result[0] if isinstance(result, (tuple, list)) else result


def prepare(p: Problem) -> Callable[[], torch.Tensor]:
    call = build_call(p)
    import flash_attn.cute as fa4

    fn = getattr(fa4, call.func)
    args, kwargs, post = call.args, call.kwargs, call.post

    def run() -> torch.Tensor:
        return post(_out(fn(*args, **kwargs)))

    return run


# --- compile without running ----------------------------------------------------------------------------------

def _compile_caches(interface) -> dict[str, object]:
    """FA4's in-process compile caches (`_flash_attn_fwd.compile_cache` and friends) of an FA4
    `interface` module, by name."""
    out = {}
    for name, obj in vars(interface).items():
        cache = getattr(obj, "compile_cache", None)
        if cache is not None and isinstance(getattr(cache, "cache", None), dict):
            out[name] = cache
    return out


# The lowered host module embeds the device code as a fatbinary in an LLVM global (`@kernels_binary`),
# printed as an MLIR string literal: printable bytes as themselves, others as `\XX`.
_BINARY_GLOBAL = re.compile(r'llvm\.mlir\.global[^\n]*?@(\w*binary\w*)\("((?:[^"\\]|\\[0-9A-Fa-f]{2}|\\\\)*)"')
_ESCAPE = re.compile(r"\\([0-9A-Fa-f]{2})|\\\\")
_FATBIN_MAGIC = 0xBA55ED50
_FATBIN_ELF = 2  # entry kind: 1 = PTX, 2 = ELF (cubin)


def _unescape_mlir(s: str) -> bytes:
    out, pos = bytearray(), 0
    for m in _ESCAPE.finditer(s):
        out += s[pos:m.start()].encode("latin-1")
        out.append(int(m.group(1), 16) if m.group(1) else 0x5C)
        pos = m.end()
    out += s[pos:].encode("latin-1")
    return bytes(out)


def fatbin_cubins(blob: bytes) -> list[tuple[int, int]]:
    """(cubin bytes, SM number) of each ELF entry of a CUDA fatbinary.

    Layout (CUDA's fatbin.h): a 16-byte header (magic 0xBA55ED50, u16 version, u16 header size,
    u64 payload size), then entries, each a header (u16 kind, u16 version, u32 header size,
    u64 payload size, ..., u32 SM number at byte 28) followed by its payload.
    """
    magic, _, hsize, fsize = struct.unpack_from("<IHHQ", blob, 0)
    if magic != _FATBIN_MAGIC:
        raise ValueError(f"not a fatbinary (magic {magic:#x})")
    out, off, end = [], hsize, hsize + fsize
    while off + 32 <= min(end, len(blob)):
        kind, _, ehsize, psize = struct.unpack_from("<HHIQ", blob, off)
        sm = struct.unpack_from("<I", blob, off + 28)[0]
        if kind == _FATBIN_ELF:
            out.append((psize, sm))
        off += ehsize + psize
    return out


def cubin_facts(compiled) -> dict:
    """Size and SM of the cubin(s) inside one CuTe DSL compiled function, where they can be found.

    `compiled.__cubin__` holds the cubin only when the DSL was told to keep it (`CUTE_DSL_KEEP=cubin`);
    otherwise it is read from the fatbinary the lowered host module embeds (`compiled.ir_module`).
    A function FA4 loaded from its persistent disk cache is a bare `tvm_ffi.Function` with neither:
    then nothing is returned.
    """
    try:
        cubin = getattr(compiled, "__cubin__", None)
        if isinstance(cubin, (bytes, bytearray)) and cubin:
            return {"cubin_bytes": len(cubin)}
        module = getattr(compiled, "ir_module", None)
        if module is None:
            return {}
        sizes, sms = 0, set()
        for m in _BINARY_GLOBAL.finditer(str(module)):
            for size, sm in fatbin_cubins(_unescape_mlir(m.group(2))):
                sizes += size
                sms.add(sm)
        if not sizes:
            return {}
        facts: dict = {"cubin_bytes": sizes}
        if len(sms) == 1:
            facts["cubin_sm"] = sms.pop()
        return facts
    except Exception:  # noqa: BLE001 - a fact we could not read is omitted, never a failure
        return {}


def _fake_cuda(t: torch.Tensor) -> torch.Tensor:
    # Same shape, strides and dtype; no storage. Must be called inside FakeTensorMode.
    return torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device="cuda")


def compile_only(p: Problem) -> dict:
    """Compile FA4's forward kernel(s) for `p` without running them (see `compile_with_fake_tensors`).
    Raises what FA4 raises, `Unsupported` as `prepare` does."""
    call = build_call(p)
    import flash_attn.cute as fa4
    from flash_attn.cute import interface

    return compile_with_fake_tensors(interface, getattr(fa4, call.func), call)


def compile_with_fake_tensors(interface, fn: Callable, call: FA4Call) -> dict:
    """Run `fn` (an FA4 entry point of the copy whose `interface` module is given) on fake CUDA tensors
    under `FakeTensorMode`: FA4 builds and compiles the forward kernel and skips the launch (its
    `is_fake_mode()` check). Shared by every FA4 copy (upstream `flash-attn-4`, vLLM's).

    Returns `compile_s` (wall), `compile_cpu_s` (this process's CPU time), `kernels` (how many new
    compiled functions FA4 cached; 0 when this process had already compiled the same kernel, so the
    times are FA4's host-side work only), `cubin_bytes` and `cubin_sm` when readable (see `cubin_facts`),
    and `disk_cache_hits` when FA4's persistent cache (FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1)
    served a kernel instead of compiling it. Raises what FA4 raises.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    caches = _compile_caches(interface)
    before = {name: set(c.cache) for name, c in caches.items()}
    t0, c0 = time.perf_counter(), time.process_time()
    with warnings.catch_warnings():
        # FakeTensor data_ptr deprecation and CuTe's "cannot be converted to a JitArgument" notes.
        warnings.simplefilter("ignore")
        with FakeTensorMode():
            swap = {id(t): _fake_cuda(t) for t in call.tensors()}
            args = tuple(swap.get(id(a), a) if isinstance(a, torch.Tensor) else a for a in call.args)
            kwargs = {k: swap.get(id(v), v) if isinstance(v, torch.Tensor) else v for k, v in call.kwargs.items()}
            result = fn(*args, **kwargs)
    facts: dict = {"compile_s": round(time.perf_counter() - t0, 3),
                   "compile_cpu_s": round(time.process_time() - c0, 3)}
    out = result[0] if isinstance(result, (tuple, list)) else result
    if isinstance(out, torch.Tensor):  # the fake output has the dtype the kernel would write
        facts["out_dtype"] = str(out.dtype).removeprefix("torch.")
    new = [c.cache[k] for name, c in caches.items() for k in c.cache if k not in before[name]]
    facts["kernels"] = len(new)
    total, sms, hits = 0, set(), 0
    for compiled in new:
        f = cubin_facts(compiled)
        if not f:
            hits += not hasattr(compiled, "ir_module")
            continue
        total += f["cubin_bytes"]
        if "cubin_sm" in f:
            sms.add(f["cubin_sm"])
    if total:
        facts["cubin_bytes"] = total
    if len(sms) == 1:
        facts["cubin_sm"] = sms.pop()
    if hits:
        facts["disk_cache_hits"] = hits
    return facts


@dataclass(frozen=True)
class FA4Backend(Backend):
    """FA4 ships `flash_attn/cute` with no `flash_attn/__init__.py`: a namespace portion. FA2
    (`flash-attn`) ships `flash_attn` as a regular package, and a regular package wins over namespace
    portions wherever it is on the path: with both installed, `flash_attn.cute` cannot be found (and FA4's GPU
    tests skip). Say so, not just
    'No module named flash_attn.cute'."""

    def availability(self) -> str | None:
        why = super().availability()
        if why is None:
            return None
        pkg = sys.modules.get("flash_attn")
        init = getattr(pkg, "__file__", None)
        if init and os.path.basename(init) == "__init__.py":
            return (f"{why} (`flash_attn` is the regular package at {os.path.dirname(init)}, FlashAttention 2's, "
                    "which hides FA4's namespace package `flash_attn.cute`: install flash-attn and flash-attn-4 "
                    "in separate environments, or put FA2 on the path only for FA2's sweep)")
        return why


FA4 = FA4Backend.declare("fa4", prepare, entry, compile_only=compile_only, cute_package=MODULE)
