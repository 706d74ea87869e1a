"""Shipped-binary evidence for the TRT-LLM kernels FlashInfer runs on Blackwell (tier `shipped`).

FlashInfer's trtllm-gen attention kernels (`trtllm_ragged`, `trtllm_context`, and `trtllm_decode` on
compute capability 10.x) are prebuilt cubins. The `flashinfer-cubin` wheel carries them with a table
of every one: `flashinfer_cubin/cubins/<artifact>/fmha/trtllm-gen/include/flashInferMetaInfo.h`, an
array of `TllmGenFmhaKernelMetaInfo` entries (Q/KV/O dtypes, head dims QK and V, tile sizes, QKV
layout, tokens per page, mask type, kernel type, SM, function name). This module reads that table as
text (nothing in the wheel is executed or loaded) and answers, for each cell of the three backends on
sm_100/sm_103, whether a kernel with the attributes FlashInfer's launcher asks for exists.

How a cell becomes the attributes the loader looks up (flashinfer-ai/flashinfer, the commit a wheel
names in `flashinfer_cubin/_build_meta.py`; for 0.6.13 57ba7eeb7ea3003a2d6ad5d9a057c4f952709bac):

- `csrc/trtllm_fmha_kernel_launcher.cu`: the ragged launcher uses `QkvLayout::SeparateQkv`, the paged
  (context and decode) launcher `QkvLayout::PagedKv`; context kernels are `FmhaKernelType::Context`
  with mask `Causal` or `Dense`; decode (generation) kernels are generation kernels
  (`SwapsMmaAbForGeneration`, `KeepsMmaAbForGeneration`, ...) with mask `Causal`;
- `include/flashinfer/trtllm/fmha/fmhaKernels.cuh`: a window shorter than the keys turns a causal
  (or generation) mask into `SlidingOrChunkedCausal` (`selectKernel`); paged kernels are keyed by the
  page size, except that a page of >= 128 tokens with grouped heads (GQA) and equal head dims uses the
  "dynamic" 128-token kernels (`selectNumTokensPerPage`, `isDynamicNumTokensPerPageKernel`); an SM 10.0
  GPU loads `kSM_100` and `kSM_100f` kernels, an SM 10.3 GPU `kSM_103` and `kSM_100f` ones
  (`isSMCompatible`); the runner keeps the kernels whose Q, K, V and O dtypes equal the call's.

A cell is `shipped` when at least one kernel has all of those attributes; its reason names the
kernel (the first in name order) and how many variants (tile sizes, schedulers) match; the runtime
heuristic that picks among them is not modelled, so a `shipped` cell is as strong as a compile, not a
run. A cell with no such kernel is `rejected`, in the loader's own terms ("Trtllm-gen kernels not
found" with the attribute values), and the reason says which values the table does have. Cells the
backend's API cannot express at all (softcap, ALiBi, a non-decode op on the decode entry point, head
dims that differ on the decode entry point, paged KV on the ragged entry point, which takes no block
table) get no record here: the table says nothing about them.

Versioning: the table belongs to one `flashinfer-cubin` release (`kernel_version`), and FlashInfer
loads it only at the same version: `flashinfer.jit.env._get_cubin_dir` raises unless
`flashinfer_cubin.__version__ == flashinfer.__version__` (flashinfer-ai/flashinfer@57ba7ee
flashinfer/jit/env.py:59-86), and the kernel set is the artifact directory that release's
`ArtifactPath.TRTLLM_GEN_FMHA` names (flashinfer/artifacts.py:138; 0.6.13: `158f6fa1...`, while
flashinfer-python 0.7.2.post1 and 0.7.4 name other artifacts, so this table says nothing about them).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import re
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from attnmatrix.matrix.cases import Case, case_space, feature_name
from attnmatrix.matrix.records import Record

from .problem import GQA_RATIO, VALIDATION_SHAPES, WINDOW

HEADER_RE = re.compile(r"^flashinfer_cubin/cubins/([0-9a-f]+)/fmha/trtllm-gen/include/flashInferMetaInfo\.h$")
BACKENDS = ("trtllm_context", "trtllm_decode", "trtllm_ragged")
ARCHS = ("sm_100", "sm_103")
# The SM values a GPU of each arch loads (fmhaKernels.cuh isSMCompatible), and the compile target.
SM_COMPATIBLE = {"sm_100": ("kSM_100", "kSM_100f"), "sm_103": ("kSM_103", "kSM_100f")}
TARGETS = {"sm_100": "sm_100a", "sm_103": "sm_103a"}
DTYPE = {"bfloat16": "DATA_TYPE_BF16", "float16": "DATA_TYPE_FP16"}
FP8 = "DATA_TYPE_E4M3"
# fmhaRunnerParams.h enums, by value.
QKV_LAYOUTS = ["SeparateQkv", "PackedQkv", "PagedKv", "ContiguousKv"]
MASK_TYPES = ["Dense", "Causal", "SlidingOrChunkedCausal", "Custom"]
KERNEL_TYPES = ["Context", "Generation", "SwapsMmaAbForGeneration", "KeepsMmaAbForGeneration",
                "SpecDecodingGeneration"]
DYNAMIC_TOKENS_PER_PAGE = 128  # kDynamicNumTokensPerPageThreshold == kDynamicNumTokensPerPageKernelKey
# Features that do not change which kernel is loaded: sinks, ragged lengths and the MLA rope split
# are runtime arguments (ptrAttentionSinks, cumSeqLens, the head dims' sum).
NO_KERNEL_EFFECT = {"sinks", "varlen", "qk_rope"}
NO_API_PARAMETER = {"softcap", "alibi"}
SHOW_KERNELS = 8
DEVICE = "none (prebuilt binary listed in the flashinfer-cubin wheel)"


class CubinError(ValueError):
    """The wheel or its kernel table is not what this reader understands; the message says where."""


@dataclass(frozen=True)
class KernelMeta:
    line: int  # 1-based line of the entry in flashInferMetaInfo.h
    name: str
    sm: str
    dtype_q: str
    dtype_k: str
    dtype_v: str
    dtype_o: str
    head_dim_qk: int
    head_dim_v: int
    qkv_layout: int
    tokens_per_page: int
    mask_type: int
    kernel_type: int

    @property
    def dynamic_pages(self) -> bool:
        # fmhaKernels.cuh isDynamicNumTokensPerPageKernel
        return self.tokens_per_page == DYNAMIC_TOKENS_PER_PAGE and "P128" not in self.name


@dataclass(frozen=True)
class KernelTable:
    version: str  # flashinfer-cubin version
    git: str  # the flashinfer commit the wheel was built from
    artifact: str  # the artifact directory hash (ArtifactPath.TRTLLM_GEN_FMHA)
    header_path: str  # path inside the wheel
    header_sha256: str
    date: str  # the header's timestamp in the wheel, YYYY-MM-DD
    kernels: tuple[KernelMeta, ...]

    def by_layout(self, layout: int) -> tuple[KernelMeta, ...]:
        """The kernels of one QKV layout (lookups scan only those)."""
        cache = self.__dict__.setdefault("_by_layout", {})
        if layout not in cache:
            cache[layout] = tuple(k for k in self.kernels if k.qkv_layout == layout)
        return cache[layout]


_STRUCT_RE = re.compile(r"struct\s+TllmGenFmhaKernelMetaInfo\s*\{(.*?)\};", re.S)
_FIELD_RE = re.compile(r"^\s*[\w:][\w:\s*]*?[\s*](\w+)\s*;", re.M)  # the declared name: last word before ';'
_ROW_RE = re.compile(r"^\{\s*(DATA_TYPE_.*)\}\s*,?\s*$")
_NEEDED = {"mDataTypeQ": "dtype_q", "mDataTypeK": "dtype_k", "mDataTypeV": "dtype_v", "mDataTypeO": "dtype_o",
           "mHeadDimQk": "head_dim_qk", "mHeadDimV": "head_dim_v", "mSM": "sm", "mFuncName": "name",
           "mQkvLayout": "qkv_layout", "mNumTokensPerPage": "tokens_per_page", "mMaskType": "mask_type",
           "mKernelType": "kernel_type"}
_INTS = {"head_dim_qk", "head_dim_v", "qkv_layout", "tokens_per_page", "mask_type", "kernel_type"}


def parse_header(text: str, where: str = "flashInferMetaInfo.h") -> list[KernelMeta]:
    """The kernel entries of a flashInferMetaInfo.h text. The field order is read from the header's
    own `struct TllmGenFmhaKernelMetaInfo`; errors name the line."""
    m = _STRUCT_RE.search(text)
    if not m:
        raise CubinError(f"{where}: no 'struct TllmGenFmhaKernelMetaInfo {{...}};' definition")
    fields = _FIELD_RE.findall(m.group(1))
    missing = sorted(set(_NEEDED) - set(fields))
    if missing:
        raise CubinError(f"{where}: struct TllmGenFmhaKernelMetaInfo has no field(s) {', '.join(missing)}")
    index = {f: i for i, f in enumerate(fields)}
    out = []
    for lineno, line in enumerate(text.splitlines(), 1):
        row = _ROW_RE.match(line.strip())
        if not row:
            continue
        values = [v.strip() for v in row.group(1).split(",")]
        if len(values) != len(fields):
            raise CubinError(f"{where}:{lineno}: {len(values)} values for {len(fields)} fields")
        kw = {}
        for field, attr in _NEEDED.items():
            v = values[index[field]]
            if attr in _INTS:
                try:
                    kw[attr] = int(v)
                except ValueError:
                    raise CubinError(f"{where}:{lineno}: {field} is {v!r}, not an integer") from None
            else:
                kw[attr] = v.strip('"')
        out.append(KernelMeta(line=lineno, **kw))
    if not out:
        raise CubinError(f"{where}: no kernel entries")
    return out


def read_wheel(wheel: str | Path) -> KernelTable:
    """The trtllm-gen FMHA kernel table of a flashinfer-cubin wheel (read, never executed)."""
    try:
        zf = zipfile.ZipFile(wheel)
    except (OSError, zipfile.BadZipFile) as e:
        raise CubinError(f"{wheel}: cannot open as a wheel: {e}") from None
    with zf:
        headers = [i for i in zf.infolist() if HEADER_RE.match(i.filename)]
        if len(headers) != 1:
            raise CubinError(f"{wheel}: expected one fmha/trtllm-gen/include/flashInferMetaInfo.h, found "
                             f"{len(headers)}")
        info = headers[0]
        raw = zf.read(info)
        try:
            meta = zf.read("flashinfer_cubin/_build_meta.py").decode()
        except KeyError:
            raise CubinError(f"{wheel}: no flashinfer_cubin/_build_meta.py (not a flashinfer-cubin wheel?)") from None
    version = re.search(r'__version__\s*=\s*"([^"]+)"', meta)
    git = re.search(r'__git_version__\s*=\s*"([^"]+)"', meta)
    if not version:
        raise CubinError(f"{wheel}: flashinfer_cubin/_build_meta.py has no __version__")
    y, mo, d = info.date_time[:3]
    return KernelTable(
        version=version.group(1), git=git.group(1) if git else "unknown",
        artifact=HEADER_RE.match(info.filename).group(1), header_path=info.filename,
        header_sha256=hashlib.sha256(raw).hexdigest(), date=_dt.date(y, mo, d).isoformat(),
        kernels=tuple(parse_header(raw.decode("utf-8", errors="replace"), info.filename)),
    )


# --- what the launcher asks for -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Query:
    """The attributes FlashInfer's loader matches for one cell."""

    sms: tuple[str, ...]
    dtype_q: str
    dtype_kv: str
    dtype_o: str
    head_dim_qk: int
    head_dim_v: int
    qkv_layout: int
    kernel_types: tuple[int, ...]
    mask_type: int
    tokens_per_page: int  # 0: not paged
    dynamic_pages: bool

    def matches(self, k: KernelMeta, relax: str = "") -> bool:
        """All attributes equal, except the one named by `relax` (sm, dtypes, head_dims, layout,
        kernel_type, mask, page)."""
        return ((relax == "head_dims" or (k.head_dim_qk == self.head_dim_qk and k.head_dim_v == self.head_dim_v))
                and (relax == "layout" or k.qkv_layout == self.qkv_layout)
                and (relax == "sm" or k.sm in self.sms)
                and (relax == "mask" or k.mask_type == self.mask_type)
                and (relax == "kernel_type" or k.kernel_type in self.kernel_types)
                and (relax == "dtypes" or (k.dtype_q == self.dtype_q and k.dtype_k == self.dtype_kv
                                           and k.dtype_v == self.dtype_kv and k.dtype_o == self.dtype_o))
                and (relax == "page" or (k.tokens_per_page == self.tokens_per_page
                                         and k.dynamic_pages == self.dynamic_pages)))

    def describe(self) -> str:
        kinds = "/".join(KERNEL_TYPES[t] for t in self.kernel_types)
        page = (f"numTokensPerPage={self.tokens_per_page}" + (" (dynamic)" if self.dynamic_pages else "")
                if self.qkv_layout == 2 else "numTokensPerPage=0")
        return (f"SM={'/'.join(self.sms)}, dtypeQ={_dt_name(self.dtype_q)}, dtypeKv={_dt_name(self.dtype_kv)}, "
                f"dtypeO={_dt_name(self.dtype_o)}, qkvLayout={QKV_LAYOUTS[self.qkv_layout]}, kernelType={kinds}, "
                f"maskType={MASK_TYPES[self.mask_type]}, headDimQk={self.head_dim_qk}, headDimV={self.head_dim_v}, "
                f"{page}")


def _dt_name(t: str) -> str:
    return t.removeprefix("DATA_TYPE_")


def query_for(case: Case) -> Query | None:
    """The loader's lookup for `case`, as the attnmatrix adapter (kernels/trtllm.py) calls the entry
    point, or None where the entry point cannot express the case (no statement from the table)."""
    names = {feature_name(f) for f in case.features}
    if names & NO_API_PARAMETER:
        return None
    if names - NO_API_PARAMETER - NO_KERNEL_EFFECT - {"causal", "sliding_window", "gqa", "paged_kv", "fp8"}:
        return None  # a feature this reader does not know how the loader treats
    if case.backend == "trtllm_decode" and (case.op != "decode" or case.head_dim != case.head_dim_v):
        return None
    if case.backend not in BACKENDS or case.arch not in SM_COMPATIBLE:
        return None
    if case.backend == "trtllm_ragged" and "paged_kv" in names:
        return None  # the ragged entry point takes no block table: a paged call cannot be made, whatever the table
    fp8 = "fp8" in names
    dtype_in = FP8 if fp8 else DTYPE[case.dtype]
    window = "sliding_window" in names
    shape = VALIDATION_SHAPES[case.op]
    # the loader picks the sliding mask when the keys exceed the window, as they do on every probed shape
    if window and shape.seqlen_k <= getattr(shape, "window", WINDOW):
        raise AssertionError("the validation shape's keys must exceed the window for the sliding mask")
    causal = "causal" in names or window  # a (WINDOW, 0) window is causal + left; MLA prefill follows its case
    ratio = GQA_RATIO if "gqa" in names else 1
    if case.backend == "trtllm_ragged":
        layout, kinds, page, dynamic = 0, (0,), 0, False
    else:
        layout = 2
        page = case.page_size or 16  # the adapter's default page (Problem.paged_kv)
        dynamic = page >= DYNAMIC_TOKENS_PER_PAGE and ratio > 1 and case.head_dim == case.head_dim_v
        if dynamic:
            page = DYNAMIC_TOKENS_PER_PAGE
        kinds = (0,) if case.backend == "trtllm_context" else (1, 2, 3, 4)
    if case.backend == "trtllm_decode":
        mask = 2 if window else 1  # generation kernels are looked up with a causal mask
    else:
        mask = 2 if window else (1 if causal else 0)
    return Query(SM_COMPATIBLE[case.arch], dtype_in, dtype_in, DTYPE[case.dtype], case.head_dim, case.head_dim_v,
                 layout, kinds, mask, page, dynamic)


def _nearest(q: Query, kernels: Iterable[KernelMeta]) -> str:
    """Which values the table has where one attribute is let go (the closest kernels that exist)."""
    ks = list(kernels)
    bits = []
    for attr, show in (
        ("mask", lambda k: MASK_TYPES[k.mask_type]),
        ("dtypes", lambda k: f"{_dt_name(k.dtype_q)}/{_dt_name(k.dtype_k)}/{_dt_name(k.dtype_o)}"),
        ("page", lambda k: str(k.tokens_per_page) + (" (dynamic)" if k.dynamic_pages else "")),
        ("head_dims", lambda k: f"{k.head_dim_qk}x{k.head_dim_v}"),
    ):
        order = (lambda v: MASK_TYPES.index(v)) if attr == "mask" else _natural
        vals = sorted({show(k) for k in ks if q.matches(k, relax=attr)}, key=order)
        if vals:
            label = {"mask": "maskType", "dtypes": "dtypes Q/Kv/O", "page": "numTokensPerPage",
                     "head_dims": "head dims"}[attr]
            bits.append(f"{label} {', '.join(vals)}")
    return ("; with the rest equal the table has " + "; ".join(bits)) if bits else ""


def _natural(s: str) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]


def shipped_record(case: Case, table: KernelTable) -> Record | None:
    """The `shipped` record of one cell, or None where the table has nothing to say (see query_for)."""
    q = query_for(case)
    if q is None:
        return None
    candidates = table.by_layout(q.qkv_layout)
    found = sorted((k for k in candidates if q.matches(k)), key=lambda k: k.name)
    loader = f"flashinfer-ai/flashinfer@{table.git}:include/flashinfer/trtllm/fmha/fmhaKernels.cuh#loadKernel"
    header = f"pypi:flashinfer-cubin=={table.version}:{table.header_path}"
    prov = {
        "date": table.date, "device": DEVICE, "library": "flashinfer-cubin", "kernel_version": table.version,
        "target": TARGETS[case.arch], "artifact": f"{table.artifact}/fmha/trtllm-gen",
        "header_sha256": table.header_sha256, "flashinfer_commit": table.git,
        "loaded_by": f"flashinfer-python=={table.version}",
    }
    if found:
        first = found[0]
        more = f" (+{len(found) - 1} more variant{'s' if len(found) > 2 else ''})" if len(found) > 1 else ""
        return Record(case=case, outcome="shipped", tier="shipped", provenance=prov,
                      reason=f"kernel {first.name}{more}", sources=(f"{header}#L{first.line}", loader),
                      extra={"kernels": [k.name for k in found[:SHOW_KERNELS]], "kernel_count": len(found),
                             "lookup": q.describe()})
    reason = f"Trtllm-gen kernels not found: {q.describe()}{_nearest(q, candidates)}"
    return Record(case=case, outcome="rejected", tier="shipped", provenance=prov, reason=reason[:2000],
                  sources=(header, loader))


def shipped_records(table: KernelTable, archs: Iterable[str] = ARCHS,
                    backends: Iterable[str] = BACKENDS) -> Iterator[Record]:
    """One record per cell of the standard space that the table decides, in case-space order."""
    for case in case_space(list(archs), list(backends)):
        rec = shipped_record(case, table)
        if rec is not None:
            yield rec


def summary(records: Iterable[Record]) -> dict:
    """Cells per (arch, backend, op, head dims) -> {"shipped": n, "rejected": n}: the closing table."""
    out: dict[str, dict[str, int]] = {}
    for r in records:
        c = r.case
        key = f"{c.arch} {c.backend} {c.op} {c.head_dim}x{c.head_dim_v}"
        out.setdefault(key, {"shipped": 0, "rejected": 0})[r.outcome] += 1
    return dict(sorted(out.items(), key=lambda kv: _natural(kv[0])))


def kernels_by_arch(table: KernelTable) -> dict[str, dict[str, list[str]]]:
    """arch -> kernel kind -> head dims (QKxV) with at least one 16-bit or fp8 kernel: the table in brief."""
    out: dict[str, dict[str, set]] = {}
    for arch, sms in SM_COMPATIBLE.items():
        for k in table.kernels:
            if k.sm not in sms or k.dtype_q not in (*DTYPE.values(), FP8):
                continue
            kind = f"{QKV_LAYOUTS[k.qkv_layout]}/{'Context' if k.kernel_type == 0 else 'Generation'}"
            out.setdefault(arch, {}).setdefault(kind, set()).add(f"{k.head_dim_qk}x{k.head_dim_v}")
    return {a: {kind: sorted(v, key=_natural) for kind, v in sorted(d.items())} for a, d in out.items()}


def dumps_summary(table: KernelTable, records: list[Record]) -> str:
    return json.dumps({"flashinfer_cubin": table.version, "kernels": len(table.kernels),
                       "by_arch": kernels_by_arch(table), "cells": summary(records)}, indent=1, sort_keys=True)
