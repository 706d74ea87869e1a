"""vLLM's own FlashAttention 4 (`vllm.vllm_flash_attn.cute`): the CuTe DSL kernels vLLM ships.

vLLM's wheel carries a copy of FA4 under `vllm/vllm_flash_attn/cute/` (pure Python, CuTe DSL; its
imports rewritten to `vllm.vllm_flash_attn.cute.*`), with kernels upstream `flash-attn-4` 4.0.0b36
does not have, among them `sm100_hd256_2cta_fmha_forward.py`, the dedicated SM100/SM110 head-dim-256
forward. This backend calls it exactly the way vLLM's FLASH_ATTN backend does with
`fa_version=4`: `vllm.vllm_flash_attn.flash_attn_varlen_func` goes straight to
`vllm.vllm_flash_attn.cute.interface._flash_attn_fwd` (vllm-project/vllm v0.33.0
vllm/vllm_flash_attn/flash_attn_interface.py, the `fa_version == 4` branch), with

- `window_size_left/right` (None for no window), `softcap` (None when off, as vLLM's 0.0 reaches
  the kernel's `softcap` only when set), `learnable_sink` (vLLM's `s_aux`), `page_table` (vLLM's
  `block_table`) with `seqused_k`, `cu_seqlens_q/k` for packed sequences, `num_splits`;
- fp8 inputs with q/k/v descales (vLLM passes descales for fp8 only; they are (B, Hkv) float32);
- on the dedicated head-dim-256 path (arch 10.x/11.x, head dims (256, 256)) what vLLM's
  `FlashAttentionImpl.forward` does before the call (vllm/v1/attention/backends/flash_attn.py,
  `if self.fa4_hd256:`): `max_seqlen_k` rounded up to whole pages, the block table cut to that many
  pages, and `num_splits=1` (the kernel has no SplitKV). vLLM asks for 128-token KV blocks there
  (`FA4_HD256_PAGE_SIZE`, vllm/v1/attention/backends/fa_utils.py) and falls back to FA2 for sinks,
  softcap and block sizes that are not multiples of 128; the case's own page size is passed
  unchanged, so what the kernel refuses is recorded in its own words.

vLLM's call profile (what its FLASH_ATTN decoder backend passes, vllm-project/vllm v0.33.0):

- the KV cache is always paged (attention ops; MLA prefill passes gathered K/V with `cu_seqlens_k`):
  the forward's varlen call passes `block_table` and `seqused_k` for
  prefill and decode alike (vllm/v1/attention/backends/flash_attn.py:1404-1430). On the dedicated hd256
  path a case without paged KV is therefore run as vLLM runs it, on 128-token kernel pages with
  `seqused_k`; a paged case whose block size is a multiple of 128 is split into 128-token kernel pages
  (fa_utils.py:255, "Larger blocks are split into 128-token kernel pages"); any other block size is one
  vLLM never gives this kernel (it falls back to FA2, fa_utils.py:236-256): it is passed as it is and the
  kernel answers in its own words;
- a decode step of at most vLLM's largest captured batch runs padded to a captured batch size with empty
  sequences, as for vLLM's FA3 (kernels/vllm_fa.py `graph_batch`);
- fp8 KV cache on SM90: Q stays bf16/fp16 and only K/V are fp8 e4m3, paged in 64-token pages, with
  (batch, kv heads) K/V descales and `fp8_kv_dequant=True` (flash_attn_interface.py:456-495;
  flash_attn.py:324 for the 64-token page, :1158-1166 for the unquantized query). vLLM routes fp8 KV to
  FA4 on SM90 only at head dim 512 (fa_utils.py:307-309), FA3 elsewhere; the kernel is probed at every
  head dim all the same, and the record says what it did. On SM100 fp8 Q/K/V with all three descales.

Records of this backend carry `extra.profile` = `PROFILE`.

ALiBi: vLLM asserts `alibi_slopes is None` for FA4 ("Alibi is not supported in FA4"); FA4 has no ALiBi
parameter, so the case is `Unsupported` (attnmatrix speaking, quoting that assertion).

Where the code comes from: a directory holding `vllm/vllm_flash_attn/cute/` (and, for the version,
`vllm-<version>.dist-info/METADATA`), extracted from the vLLM wheel by `extract_wheel` (see
`scripts/fetch-vllm-fa4.sh`). Its location is `ATTNMATRIX_VLLM_FA4_DIR`, else
`~/.cache/attnmatrix/vllm-fa4`. The package is imported under its own name without running
`vllm/__init__.py` (which imports all of vLLM) or `vllm/vllm_flash_attn/__init__.py` (which needs the
FA2/FA3 CUDA extensions): `vllm` and `vllm.vllm_flash_attn` are registered as bare namespace modules
pointing at the extracted directories, the way vLLM's own `vllm_flash_attn/__init__.py` registers
`flash_attn` for its symlinked source tree. An installed vLLM is used instead when no extracted copy
is found.

vLLM pins the CuTe DSL it runs this code with (`nvidia-cutlass-dsl[cu13]==4.8.0` and
`apache-tvm-ffi==0.1.11` in vLLM 0.33.0's Requires-Dist); compile in an environment with those
versions (`scripts/fetch-vllm-fa4.sh` builds one). Records carry both versions in provenance.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import os
import re
import sys
import types
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from attnmatrix.matrix.cases import Case

from .base import Backend
from .fa4 import FA4Call, compile_with_fake_tensors
from .problem import Problem, Unsupported
from .vllm_fa import graph_batch, pad_to_graph

PACKAGE = "vllm.vllm_flash_attn.cute"
LIBRARY = "vllm"
DIR_ENV = "ATTNMATRIX_VLLM_FA4_DIR"
DEFAULT_DIR = Path.home() / ".cache" / "attnmatrix" / "vllm-fa4"
CUTE_SUBDIR = "vllm/vllm_flash_attn/cute"
# vLLM's one page size for the dedicated head-dim-256 kernel (FA4_HD256_PAGE_SIZE in fa_utils.py).
HD256_PAGE_SIZE = 128
# vLLM's KV block for FA4's SM90 fp8-KV dequant path (flash_attn.py:324: a 64-token TMA tile/page).
SM90_FP8_KV_PAGE_SIZE = 64
PROFILE = "vllm"


def entry(case: Case) -> str:
    return f"{PACKAGE}.interface._flash_attn_fwd"


def source_dir() -> Path:
    return Path(os.environ.get(DIR_ENV) or DEFAULT_DIR)


def extract_wheel(wheel: str | os.PathLike, dest: str | os.PathLike) -> dict:
    """Extract `vllm/vllm_flash_attn/cute/*.py` and the wheel's METADATA into `dest`. Nothing in the
    wheel is run. Returns {"version", "files", "cutlass_dsl", "tvm_ffi"} (the last two: vLLM's pins)."""
    dest = Path(dest)
    with zipfile.ZipFile(wheel) as zf:
        names = [n for n in zf.namelist()
                 if (n.startswith(CUTE_SUBDIR + "/") and n.endswith(".py"))
                 or re.fullmatch(r"vllm-[^/]+\.dist-info/METADATA", n)]
        if not any(n.startswith(CUTE_SUBDIR + "/") for n in names):
            raise ValueError(f"{wheel}: no {CUTE_SUBDIR}/ in this wheel (not a vLLM wheel with FA4?)")
        for n in names:
            target = dest / n
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(target.name + ".tmp")
            tmp.write_bytes(zf.read(n))
            os.replace(tmp, target)
    meta = read_metadata(dest)
    return {**meta, "files": sum(n.endswith(".py") for n in names)}


def read_metadata(root: str | os.PathLike | None = None) -> dict:
    """vLLM's version and its CuTe DSL pins, from the extracted METADATA ({} if there is none)."""
    root = Path(root) if root is not None else source_dir()
    metas = sorted(root.glob("vllm-*.dist-info/METADATA"))
    if not metas:
        return {}
    text = metas[-1].read_text(encoding="utf-8", errors="replace")
    out = {}
    m = re.search(r"^Version:\s*(\S+)", text, re.M)
    if m:
        out["version"] = m.group(1)
    for key, dist in (("cutlass_dsl", "nvidia-cutlass-dsl"), ("tvm_ffi", "apache-tvm-ffi")):
        m = re.search(rf"^Requires-Dist:\s*{re.escape(dist)}(?:\[[^\]]*\])?\s*==\s*([^\s;,]+)", text, re.M)
        if m:
            out[key] = m.group(1)
    return out


def kernel_version() -> str:
    """vLLM's version: of the extracted copy, else of an installed vLLM."""
    v = read_metadata().get("version")
    if v:
        return v
    from .env import package_version

    return package_version(LIBRARY) or "unknown"


def _register_namespace(name: str, path: Path) -> None:
    mod = types.ModuleType(name)
    mod.__path__ = [str(path)]
    mod.__package__ = name
    spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
    spec.submodule_search_locations = mod.__path__
    mod.__spec__ = spec
    sys.modules[name] = mod


def _cute_missing() -> bool:
    try:
        return importlib.util.find_spec(PACKAGE) is None
    except ModuleNotFoundError:  # an imported vllm without vllm_flash_attn: the import below says so
        return False


def import_cute():
    """Import `vllm.vllm_flash_attn.cute.interface` from the extracted copy (or an installed vLLM).

    Where a `vllm.vllm_flash_attn` without `cute` is already imported (vLLM's FA2/FA3 builds from another folder,
    scripts/vllm-fa-site.py, as the vllm_fa3 backend loads them), that package also searches the extracted copy,
    so the backends of one process (a workload sweep times them in turns) each find their own."""
    root = source_dir()
    if (root / CUTE_SUBDIR / "interface.py").is_file():
        if "vllm" not in sys.modules:
            _register_namespace("vllm", root / "vllm")
            _register_namespace("vllm.vllm_flash_attn", root / "vllm" / "vllm_flash_attn")
        elif _cute_missing():
            extra = str(root / "vllm" / "vllm_flash_attn")
            search = importlib.import_module("vllm.vllm_flash_attn").__path__
            if extra not in list(search):
                search.append(extra)
    return importlib.import_module(f"{PACKAGE}.interface")


def _arch_major() -> int:
    from .xcompile import ARCH_ENVS

    arch = os.environ.get(ARCH_ENVS[0], "")
    m = re.fullmatch(r"(?:sm_?)?(\d+)\d[af]?", arch.lower())
    return int(m.group(1)) if m else (torch.cuda.get_device_capability()[0] if torch.cuda.is_available() else 0)


def _is_hd256_path(p: Problem) -> bool:
    # vLLM's uses_fa4_hd256_kernel, on the archs where interface.py routes it (arch // 10 in [10, 11]).
    return _arch_major() in (10, 11) and p.case.head_dim == 256 and p.case.head_dim_v == 256


def _split_pages(k: torch.Tensor, v: torch.Tensor, table: torch.Tensor, page: int):
    """A cache of `k.shape[1]`-token blocks seen as `page`-token kernel pages: block b is pages
    b * n .. b * n + n - 1, in order (n = block // page)."""
    n = k.shape[1] // page
    kk = k.reshape(k.shape[0] * n, page, *k.shape[2:])
    vv = v.reshape(v.shape[0] * n, page, *v.shape[2:])
    t = (table.unsqueeze(-1) * n + torch.arange(n, dtype=table.dtype, device=table.device)).reshape(table.shape[0], -1)
    return kk, vv, t


def vllm_paging(p: Problem) -> tuple[int | None, int | None]:
    """(the case's KV block size, the kernel page size vLLM gives FA4) in vLLM's profile; (None, None) for an
    unpaged call (vLLM's attention without a KV cache)."""
    c = p.case
    block = c.page_size if c.has("paged_kv") else None
    if c.op == "mla_prefill":  # vLLM's MLA prefill passes gathered K/V with cu_seqlens_k, no block table
        return block, block
    if c.has("fp8") and _arch_major() == 9:
        return block or SM90_FP8_KV_PAGE_SIZE, SM90_FP8_KV_PAGE_SIZE if block is None else block
    if _is_hd256_path(p):
        if block is not None and block % HD256_PAGE_SIZE:
            return block, block  # a block vLLM never gives this kernel (it falls back to FA2): the kernel's own word
        return block or HD256_PAGE_SIZE, HD256_PAGE_SIZE
    return block, block


def build_vllm_call(p: Problem) -> FA4Call:
    """The `_flash_attn_fwd` call vLLM makes for this problem.

    Paged KV is vLLM's KV cache: packed queries with `cu_seqlens_q`/`max_seqlen_q`, the cache with
    `page_table`, `seqused_k` and `max_seqlen_k`, as `FlashAttentionImpl.forward` passes them, in the
    kernel pages vLLM gives this kernel (`vllm_paging`: the hd256 kernel and the SM90 fp8-KV path are
    always paged). Otherwise (vLLM's path for attention that keeps no cache), packed q/k/v with
    `cu_seqlens_q/k` when the case is varlen, batched tensors otherwise (decode included).
    """
    c = p.case
    if c.has("alibi") or p.alibi_slopes is not None:
        raise Unsupported("vLLM does not pass ALiBi to FA4 (vllm/vllm_flash_attn/flash_attn_interface.py: "
                          "'Alibi is not supported in FA4'); FA4's _flash_attn_fwd has no alibi parameter")
    b = p.shape.batch
    left, right = p.window if p.window is not None else (None, None)
    kw: dict = {
        "softmax_scale": p.scale, "causal": p.causal, "softcap": p.softcap or None,
        "window_size_left": left, "window_size_right": right, "learnable_sink": p.sinks,
        "num_splits": 0,  # vLLM's max_num_splits outside CUDA graphs: 0, FA4's own heuristic
    }
    post: Callable[[torch.Tensor], torch.Tensor] = lambda out: out  # noqa: E731
    block, page = vllm_paging(p)
    dequant = c.has("fp8") and _arch_major() == 9 and c.op != "mla_prefill"
    if dequant and p.descale is not None and p.q.dtype != p.out_dtype:
        # vLLM's SM90 fp8 KV cache: the query is not quantized. Its values are the fp8 ones times the
        # descale (exact in bf16/fp16: a power of two times an e4m3 value), so the reference is unchanged.
        p.q = p.q.to(p.out_dtype) * p.descale[0]
        p.descale = (1.0, p.descale[1], p.descale[2])
    if block is not None:
        q, _, _, cu_q, _ = p.packed()
        saved = p.page_size
        p.page_size = block
        try:
            k, v, table = p.paged_kv()
        finally:
            p.page_size = saved
        if page != block:
            k, v, table = _split_pages(k, v, table, page)
        kw.update(cu_seqlens_q=cu_q, max_seqlen_q=p.max_valid_q(), page_table=table,
                  seqused_k=p.seqlens_k_tensor(), max_seqlen_k=p.max_valid_k())
        post = p.unpacker()
        graph = graph_batch(p, paged=True)
        if graph != b:  # vLLM's decode step replays the graph of a captured batch size (kernels/vllm_fa.py)
            q = pad_to_graph(q, kw, graph, table="page_table")
            b, tokens, unpack = graph, sum(p.valid_q(i) for i in range(p.shape.batch)), post
            post = lambda out: unpack(out[:tokens])  # noqa: E731
        if _is_hd256_path(p):
            # vLLM's hd256 preparation: page-aligned max_seqlen_k, exact-width block table, no SplitKV.
            pages = -(-kw["max_seqlen_k"] // page)
            kw["page_table"] = kw["page_table"][:, :pages]
            kw["max_seqlen_k"] = pages * page
            kw["num_splits"] = 1
    elif c.has("varlen"):
        q, k, v, cu_q, cu_k = p.packed()
        kw.update(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=p.max_valid_q(),
                  max_seqlen_k=p.max_valid_k())
        post = p.unpacker()
    else:
        q, k, v = p.q, p.k, p.v
        if _is_hd256_path(p):
            kw["num_splits"] = 1
    if p.descale is not None:
        # vLLM passes descales for fp8 inputs only, one per (sequence, kv head), float32; on the SM90
        # fp8-KV path only K's and V's (flash_attn_interface.py:491).
        hkv = k.shape[2]
        names = ("q_descale", "k_descale", "v_descale")
        kw.update({name: torch.full((b, hkv), float(s), dtype=torch.float32, device=q.device)
                   for name, s in zip(names, p.descale, strict=True) if not (dequant and name == "q_descale")})
    if dequant:
        kw["fp8_kv_dequant"] = True
    return FA4Call("_flash_attn_fwd", (q, k, v), kw, post)


def prepare(p: Problem) -> Callable[[], torch.Tensor]:
    call = build_vllm_call(p)
    fn = import_cute()._flash_attn_fwd
    args, kwargs, post = call.args, call.kwargs, call.post

    def run() -> torch.Tensor:
        return post(fn(*args, **kwargs)[0])

    return run


def compile_only(p: Problem) -> dict:
    """Compile vLLM's FA4 forward for `p` under `FakeTensorMode` without launching it (see
    `fa4.compile_with_fake_tensors`)."""
    call = build_vllm_call(p)
    interface = import_cute()
    return compile_with_fake_tensors(interface, interface._flash_attn_fwd, call)


@dataclass(frozen=True)
class VllmFA4Backend(Backend):
    def availability(self) -> str | None:
        try:
            import_cute()
        except Exception as e:  # noqa: BLE001 - any import failure makes it unavailable
            return (f"cannot import {PACKAGE}: {type(e).__name__}: {e} (extract it from the vLLM wheel into "
                    f"{source_dir()} with scripts/fetch-vllm-fa4.sh, or set {DIR_ENV})")
        return None

    def version(self) -> str:
        return kernel_version()


VLLM_FA4 = VllmFA4Backend.declare("vllm_fa4", prepare, entry, compile_only=compile_only, cute_package=PACKAGE,
                                   profile=PROFILE)
