"""vLLM's own answers: run a pinned vLLM release's selection code, read from its wheel, under small stand-ins.

The comparison page (`site/vllm-comparison.md`) puts vLLM's choice next to attnmatrix's. vLLM's choice is
not re-derived from a hand-written copy of its rules (which drifts with every release): this module loads the
release's own Python files and calls its own functions:

- the attention backend of a decoder layer: `CudaPlatformBase.get_attn_backend_cls` (`vllm/platforms/cuda.py`:
  the priority list for the capability, then each backend's `validate_configuration` from
  `vllm/v1/attention/backend.py` and the backends' own modules), in a fresh namespace per capability;
- `get_flash_attn_version` (`vllm/v1/attention/backends/fa_utils.py`) with the `is_fa_version_supported` it
  imports (`vllm/vllm_flash_attn/flash_attn_interface.py`, with the package `__init__.py` that re-exports it);
- the MLA prefill choice: the priority walk `Platform.get_mla_prefill_backend_cls`
  (`vllm/platforms/interface.py`), the backend enum (`mla/prefill/registry.py`), each backend's
  `validate_configuration` (`mla/prefill/base.py` and `flash_attn.py`, `trtllm_ragged.py`, `flashinfer.py`,
  `tokenspeed_mla.py`), the selector config (`mla/prefill/selector.py`), and `FlashAttnPrefillBackend.__init__`
  for the FlashAttention version it runs and whether it pads V.

The files execute in a private module namespace (`namespace.py`, with its stand-ins): nothing stays in
`sys.modules` and no vLLM install is needed.

What the answers stand for: vLLM's default configuration on CUDA (no `flash_attn_version` or
`mla_prefill_backend` set, `VLLM_BATCH_INVARIANT` off, no model-level softcap, unquantized KV cache), with
the release's dependencies installed. Every call's log lines (what vLLM would have logged) are kept with
its answer: they are vLLM's own words for why it left a default.

`run_answers` returns them as a document with provenance (version, wheel name and sha256, path and sha256 of
every executed file, checked against the wheel's RECORD); `answers.write_answers` commits it and
`answers.load_answers` reads it back for the comparison, which never needs the wheel.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from attnmatrix.vocabulary import capability_of

from .answers import ANSWERS_SCHEMA, answers_path, backend_params, cap_text, fa_params
from .namespace import EXECUTED, INERT, OPTIONAL_LIBRARIES, STAND_INS, THIRD_PARTY_STAND_INS, Namespace
from .release import Release

# --- queries ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class FaQuery:
    """One call of get_flash_attn_version, as vLLM's FLASH_ATTN attention backend makes it."""

    capability: tuple[int, int]
    head_size: int
    head_size_v: int
    requires_alibi: bool = False
    has_sinks: bool = False
    requires_softcap: bool = False
    kv_cache_block_size: int | None = None

    def key(self) -> tuple:
        return (self.capability, self.head_size, self.head_size_v, self.requires_alibi, self.has_sinks,
                self.requires_softcap, -1 if self.kv_cache_block_size is None else self.kv_cache_block_size)


@dataclass(frozen=True)
class MlaQuery:
    capability: tuple[int, int]
    dims: tuple[int, int, int]  # qk_nope, qk_rope, v
    dtype: str

    def key(self) -> tuple:
        return (self.capability, self.dims, self.dtype)


@dataclass(frozen=True)
class BackendQuery:
    """One attention backend choice for a decoder (non-MLA) layer, as vLLM's CUDA platform makes it
    (`CudaPlatformBase.get_attn_backend_cls` with no backend selected)."""

    capability: tuple[int, int]
    head_size: int
    dtype: str
    has_sink: bool = False
    has_sliding_window: bool = False
    block_size: int | None = None  # None: vLLM picks the block size (no --block-size)
    kv_cache_dtype: str = "auto"  # vLLM's default cache dtype; "fp8" for an fp8 KV cache

    def key(self) -> tuple:
        return (self.capability, self.head_size, self.dtype, self.has_sink, self.has_sliding_window,
                -1 if self.block_size is None else self.block_size, self.kv_cache_dtype)


class Oracle:
    """vLLM's selection functions from one release, callable per query."""

    def __init__(self, ns: Namespace):
        self.ns = ns
        self.fa_utils = ns.import_module("vllm.v1.attention.backends.fa_utils")
        self._deciders: dict[tuple[int, int], Namespace] = {}

    def _decider(self, capability: tuple[int, int]) -> Namespace:
        """A namespace of its own per compute capability: vLLM caches what it learns about the one GPU of its
        process (`functools.cache` on `supports_trtllm_attention`, `_get_backend_priorities`), so each
        capability is asked in a fresh import of the release, as on a machine with that GPU."""
        if capability not in self._deciders:
            import torch

            ns = Namespace(self.ns.release)
            ns.capability = capability
            # vllm/platforms/cuda.py turns off PyTorch's cuDNN SDPA at import; this process keeps its own setting
            cudnn_sdp = torch.backends.cuda.cudnn_sdp_enabled()
            try:
                cuda = ns.import_module("vllm.platforms.cuda")
            finally:
                torch.backends.cuda.enable_cudnn_sdp(cudnn_sdp)
            interface = ns.import_module("vllm.platforms.interface")
            ns.cuda_platform = type("StandInCudaPlatform", (cuda.CudaPlatformBase,), {  # type: ignore[attr-defined]
                "get_device_capability": classmethod(lambda cls, device_id=0: interface.DeviceCapability(
                    *ns.capability))})
            # The backends' modules are imported here, once, so that what they log at import (e.g. whether this
            # machine could JIT-compile FlashInfer, which only decides a custom-op registration) is no query's answer.
            for name in DECISION_MODULES:
                ns.import_module(name)
            ns.log = []
            self._deciders[capability] = ns
        return self._deciders[capability]

    @property
    def files(self) -> dict[str, str]:
        """Every file executed, in any of the oracle's namespaces: path -> sha256."""
        out = dict(self.ns.files)
        for ns in self._deciders.values():
            out.update(ns.files)
        return out

    def attention_backend(self, q: BackendQuery) -> dict:
        """vLLM's attention backend for a decoder layer: the platform's priority list for the capability, each
        backend's `validate_configuration` reasons, and the backend `get_attn_backend_cls` returns."""
        import torch

        ns = self._decider(q.capability)
        ns.log = []
        selector = ns.import_module("vllm.v1.attention.selector")
        registry = ns.import_module("vllm.v1.attention.backends.registry")
        interface = ns.import_module("vllm.platforms.interface")
        config = selector.AttentionSelectorConfig(
            head_size=q.head_size, dtype=getattr(torch, q.dtype), kv_cache_dtype=q.kv_cache_dtype,
            block_size=q.block_size, has_sink=q.has_sink, has_sliding_window=q.has_sliding_window)
        platform = ns.cuda_platform  # type: ignore[attr-defined]
        try:
            path = platform.get_attn_backend_cls(None, config)
        except ValueError:
            path = None
        # the platform's debug line listing every refusal repeats `refused` below with the whole config: left out
        log = [ln for ln in ns.log if not ln.startswith("debug: Some attention backends are not valid")]
        valid, invalid = platform.get_valid_backends(interface.DeviceCapability(*q.capability), config)
        ranked = sorted([(c.priority, c.backend.name, []) for c in valid]
                        + [(prio, b.name, list(reasons)) for b, (prio, reasons) in invalid.items()])
        chosen = None
        if path is not None:
            chosen = next(b.name for b in registry.AttentionBackendEnum if _path_of(b) == path)
        return {"capability": cap_text(q.capability), "head_size": q.head_size, "dtype": q.dtype,
                "has_sink": q.has_sink, "has_sliding_window": q.has_sliding_window, "block_size": q.block_size,
                "kv_cache_dtype": q.kv_cache_dtype, "priorities": [n for _, n, _ in ranked],
                "refused": [[n, r] for _, n, r in ranked if r], "backend": chosen, "log": log}

    def flash_attn_version(self, q: FaQuery) -> dict:
        """get_flash_attn_version(...) with the query's properties and supports_fa4_hd256=True, as the FLASH_ATTN
        attention backend calls it (vllm/v1/attention/backends/flash_attn.py in v0.33.0: the impl passes
        alibi/sinks/softcap, the metadata builder head_size_v and the KV block size; both pass
        supports_fa4_hd256=True)."""
        self.ns.capability, self.ns.log = q.capability, []
        version = self.fa_utils.get_flash_attn_version(
            requires_alibi=q.requires_alibi, head_size=q.head_size, head_size_v=q.head_size_v,
            has_sinks=q.has_sinks, requires_softcap=q.requires_softcap,
            kv_cache_block_size=q.kv_cache_block_size, supports_fa4_hd256=True)
        return {"capability": cap_text(q.capability), "head_size": q.head_size, "head_size_v": q.head_size_v,
                "requires_alibi": q.requires_alibi, "has_sinks": q.has_sinks,
                "requires_softcap": q.requires_softcap, "kv_cache_block_size": q.kv_cache_block_size,
                "version": version, "log": list(self.ns.log)}

    def mla_prefill(self, q: MlaQuery) -> dict:
        """The automatic MLA prefill choice (Platform.get_mla_prefill_backend_cls) for these dims and dtype,
        the full priority list it walks, why each backend before the pick refused, and for FLASH_ATTN the
        FlashAttention version and V padding its constructor settles on."""
        import torch  # the release's MLA code is written against torch (CPU is enough)

        ns = self.ns
        ns.capability = q.capability
        base = ns.import_module("vllm.v1.attention.backends.mla.prefill.base")
        selector = ns.import_module("vllm.v1.attention.backends.mla.prefill.selector")
        platform = ns.import_module("vllm.platforms").current_platform
        nope, rope, v = q.dims
        config = selector.MLAPrefillSelectorConfig(
            dtype=getattr(torch, q.dtype),
            mla_dimensions=base.MLADimensions(qk_nope_head_dim=nope, qk_rope_head_dim=rope, v_head_dim=v))
        # 1. The full priority list: the real walk, with every backend refusing.
        ns.resolved, ns.refuse_all, ns.log = [], True, []
        try:
            platform.get_mla_prefill_backend_cls(config)
        except ValueError:
            pass
        finally:
            ns.refuse_all = False
        enum = ns.import_module("vllm.v1.attention.backends.mla.prefill.registry").MLAPrefillBackendEnum
        by_path = {m.value: m.name for m in enum if m.value}
        priorities = [by_path.get(p, p) for p in ns.resolved]
        # 2. The real choice.
        ns.log = []
        try:
            chosen = platform.get_mla_prefill_backend_cls(config).get_name()
        except ValueError:
            chosen = None
        cap = platform.get_device_capability()
        refused = []
        for name in priorities:
            if name == chosen:
                break
            refused.append([name, list(enum[name].get_class().validate_configuration(cap, config))])
        out = {"capability": cap_text(q.capability), "dims": list(q.dims), "dtype": q.dtype,
               "priorities": priorities, "refused": refused, "backend": chosen, "fa_version": None,
               "pads_v": None}
        if chosen == "FLASH_ATTN":
            ns.log = []
            cls = enum["FLASH_ATTN"].get_class()
            impl = cls(num_heads=16, scale=1.0, kv_lora_rank=512, qk_nope_head_dim=nope, qk_rope_head_dim=rope,
                       v_head_dim=v, vllm_config=types.SimpleNamespace(
                           kernel_config=types.SimpleNamespace(enable_jit_warmup=False)))
            out["fa_version"] = impl.vllm_flash_attn_version
            out["pads_v"] = bool(impl.requires_v_padding)
        out["log"] = list(ns.log)
        return out


# --- the query space the comparison page asks --------------------------------------------------------

def fa_queries() -> list[FaQuery]:
    """Every GPU arch x (head_dim, head_dim_v) x the distinct argument sets of the probed feature sets."""
    from attnmatrix.matrix.cases import ARCHS, BACKEND_FEATURE_SETS, FEATURE_SETS, HEAD_DIMS

    sets = [*FEATURE_SETS, *(f for fs in BACKEND_FEATURE_SETS.values() for f in fs)]
    params = {tuple(sorted(fa_params(fs).items(), key=lambda kv: kv[0])) for fs in sets}
    out = {FaQuery(capability_of(a), hd, hdv, **dict(p)) for a in ARCHS for hd, hdv in HEAD_DIMS for p in params}
    return sorted(out, key=FaQuery.key)


# The attention backends' modules of the CUDA priority lists (vllm/platforms/cuda.py _get_backend_priorities, non-MLA).
DECISION_MODULES = tuple(m for m in EXECUTED if m.startswith("vllm.v1.attention.backends.")
                         and m.rpartition(".")[2] in ("flash_attn", "flashinfer", "triton_attn", "flex_attention",
                                                      "turboquant_attn"))


def _path_of(member: Any) -> str | None:
    try:
        return member.get_path()
    except ValueError:  # CUSTOM without a registered class
        return None


def backend_queries() -> list[BackendQuery]:
    """Every GPU arch x query/key head size of the space x dtype x the distinct backend-choice inputs of the
    probed feature sets (sinks, sliding window, KV block size, fp8 KV cache). vLLM's selector config has one head
    size (the query/key one), also for a layer whose V head size differs."""
    from attnmatrix.matrix.cases import ARCHS, BACKEND_FEATURE_SETS, DTYPES, FEATURE_SETS, HEAD_DIMS

    sets = [*FEATURE_SETS, *(f for fs in BACKEND_FEATURE_SETS.values() for f in fs)]
    params = {tuple(sorted(backend_params(fs).items())) for fs in sets}
    out = {BackendQuery(capability_of(a), hd, d, **dict(p)) for a in ARCHS for hd, _ in HEAD_DIMS
           for d in DTYPES for p in params}
    return sorted(out, key=BackendQuery.key)


def mla_queries() -> list[MlaQuery]:
    from attnmatrix.matrix.cases import ARCHS, DTYPES, MLA_TRIPLES

    return sorted({MlaQuery(capability_of(a), t, d) for a in ARCHS for t in MLA_TRIPLES for d in DTYPES},
                  key=MlaQuery.key)


def run_answers(release: Release, progress: Callable[[str], None] | None = None) -> dict:
    """Run the release's selection code over the comparison's query space: the answers document."""
    ns = Namespace(release)
    oracle = Oracle(ns)
    fq, mq = sorted(set(fa_queries()), key=FaQuery.key), sorted(set(mla_queries()), key=MlaQuery.key)
    fa = []
    for i, q in enumerate(fq):
        fa.append(oracle.flash_attn_version(q))
        if progress and (i + 1) % 200 == 0:
            progress(f"get_flash_attn_version: {i + 1}/{len(fq)}")
    mla = [oracle.mla_prefill(q) for q in mq]
    bq = backend_queries()
    backends = []
    for i, q in enumerate(bq):
        backends.append(oracle.attention_backend(q))
        if progress and (i + 1) % 500 == 0:
            progress(f"attention backend: {i + 1}/{len(bq)}")
    if progress:
        progress(f"get_flash_attn_version: {len(fq)} answers; MLA prefill: {len(mq)} answers; "
                 f"attention backend: {len(bq)} answers")
    files = [{"path": p, "sha256": h, "in_record": p in release.record} for p, h in sorted(oracle.files.items())]
    return {
        "schema": ANSWERS_SCHEMA,
        "vllm": {"version": release.version, "wheel": release.wheel_name, "wheel_sha256": release.wheel_sha256},
        "command": f"attnmatrix vllm-answers --wheel {release.wheel_name or 'PATH'} -o {answers_path(release.version)}",
        "executed_files": files,
        "stand_ins": [{"module": k, "replaces": v[0]} for k, v in sorted(STAND_INS.items())]
        + [{"module": k, "replaces": f"inert: {v}"} for k, v in sorted(INERT.items())]
        + [{"module": k, "replaces": v[0]} for k, v in sorted(THIRD_PARTY_STAND_INS.items())]
        + [{"module": ", ".join(mods), "replaces": f"installed iff the release requires {dist} on Linux: "
            + ("yes" if release.requires_on_linux(dist) else "no")} for dist, mods in OPTIONAL_LIBRARIES.items()],
        "assumes": "vLLM's default configuration on CUDA: no attention backend, flash_attn_version or "
                   "mla_prefill_backend set, no --block-size unless the cell has a paged-KV block size, "
                   "kv_cache_dtype auto (fp8 for an fp8 cell), VLLM_BATCH_INVARIANT off, no model config (no "
                   "model-level softcap), a causal decoder layer; FlashInfer's TRT-LLM cubins available",
        "flash_attn_version": fa,
        "mla_prefill": mla,
        "attention_backend": backends,
    }
