"""vLLM's questions, answered by the query engine (`attnmatrix.selector_engine`). Standard library only.

Written once, by hand, beside the query engine and shipped with it in the vendored selector. The engine answers
"which backends, best first" in attnmatrix's names; this module asks it what vLLM asks its own code: which
FlashAttention version its FLASH_ATTN backend should run (`get_flash_attn_version`), and which MLA prefill
backends to try in which order (`get_mla_prefill_backend_priorities`). Both are one query of the engine (causal
bfloat16 prefill with the call's features; causal bfloat16 mla_prefill with the rope split) read through the
data's vLLM keys:

- `fa_version`: backend -> the FlashAttention version vLLM's FLASH_ATTN runs it as (backends.json
  `fa_version`); `fa_common_head_sizes`: the head sizes get_flash_attn_version decides over when given none.
- `engine_names["vllm"]["mla_prefill"]`: backend -> vLLM's MLA prefill name (the engine's `in_engine_names`).

`EngineProfile` narrows those answers by an engine's call profile (how it calls the kernels where the matrix has
no axis: configuration inputs a kernel refuses, the page size it feeds a kernel, the block sizes it advertises;
`matrix/data/vllm/vllm-<version>-profile.json`), for the generated vLLM-shaped module
(`attnmatrix.engines.vllm.selection`).
"""

from __future__ import annotations

try:
    from . import vocabulary as V
    from .selector_engine import CACHE_MAX, Engine
except ImportError:  # vendored as plain modules beside each other
    import vocabulary as V
    from selector_engine import CACHE_MAX, Engine

_int = V.check_int
arch_of = V.arch_of
features_of = V.features_of


class VllmEngine(Engine):
    """The query engine with vLLM's questions: the generated selector's engine (`attnmatrix.selector._ENGINE`)."""

    def __init__(self, data: dict):
        super().__init__(data)
        self._fa_cache: dict = {}
        self._mla_cache: dict = {}

    # --- per arch ----------------------------------------------------------------------------------

    def flash_attn_version_for(self, arch, requires_alibi=False, head_size=None, head_size_v=None, has_sinks=False,
                               requires_local_attention=False, requires_softcap=False, kv_cache_block_size=None, *,
                               refused=None, kernel_page=None, versions=None):
        """The version of the first FlashAttention backend in the order for prefill (bfloat16, causal, the
        features asked); with no head size, the first version for the last common head size that is also
        supported for every other one. None when no FlashAttention backend is supported.

        An engine's call profile (EngineProfile) narrows it: `refused(backend, dims)` rules a backend out for
        the caller's configuration; `kernel_page(backend, dims)` is the page size the engine feeds that backend's
        kernel for this block size (None: the block size itself); `versions`: the versions installed."""
        fa = self.data["fa_version"]
        sizes = self.data["fa_common_head_sizes"] if head_size is None else (
            (head_size, head_size if head_size_v is None else head_size_v),)
        call = dict(alibi=requires_alibi, sinks=has_sinks, sliding_window=requires_local_attention,
                    softcap=requires_softcap)
        feats = features_of(**call, page_size=kv_cache_block_size)
        per_size = []
        for dims in sizes:
            feats_for = {}
            if kernel_page is not None and kv_cache_block_size is not None:
                for b in fa:
                    page = kernel_page(b, dims)
                    if page is not None and page != kv_cache_block_size:
                        feats_for[b] = features_of(**call, page_size=page)
            ordered = self.query(arch, "prefill", "bfloat16", *dims, feats, feats_for=feats_for)[0]
            per_size.append([fa[a.backend] for a in ordered
                             if a.backend in fa and (refused is None or not refused(a.backend, dims))
                             and (versions is None or fa[a.backend] in versions)])
        return next((v for v in per_size[-1] if all(v in p for p in per_size)), None)

    def mla_prefill_priorities_for(self, arch, qk_nope_head_dim, qk_rope_head_dim, v_head_dim) -> list:
        """vLLM MLA prefill names in the order for causal bfloat16 mla_prefill of this (qk_nope, qk_rope, v)
        triple; the first occurrence of each name, backends without a name left out."""
        ordered = self.query(arch, "mla_prefill", "bfloat16", qk_nope_head_dim + qk_rope_head_dim, v_head_dim,
                             features_of(qk_rope=qk_rope_head_dim))[0]
        return self.in_engine_names("vllm", "mla_prefill", [a.backend for a in ordered])

    # --- the selector's public functions (capability tuples, argument checks, caches) ----------------

    def get_flash_attn_version(self, capability, requires_alibi=False, head_size=None, head_size_v=None,
                               has_sinks=False, requires_local_attention=False, requires_softcap=False,
                               kv_cache_block_size=None):
        """The FlashAttention version (2, 3 or 4) to use, or None if none is supported (vLLM's meaning)."""
        key = (capability, requires_alibi, head_size, head_size_v, has_sinks, requires_local_attention,
               requires_softcap, kv_cache_block_size)
        try:
            return self._fa_cache[key]
        except KeyError:
            pass
        except TypeError:
            key = None
        # The same argument checks as select_backends: head_size=-1 is an error, not "no FlashAttention".
        if head_size is not None:
            head_size = _int("head_size", head_size, 1, V.MAX_HEAD_DIM)
        if head_size_v is not None:
            head_size_v = _int("head_size_v", head_size_v, 1, V.MAX_HEAD_DIM)
        if kv_cache_block_size is not None:
            kv_cache_block_size = _int("kv_cache_block_size", kv_cache_block_size, 1, V.MAX_PAGE_SIZE)
        version = self.flash_attn_version_for(arch_of(capability), requires_alibi, head_size, head_size_v,
                                              has_sinks, requires_local_attention, requires_softcap,
                                              kv_cache_block_size)
        if key is not None:
            if len(self._fa_cache) >= CACHE_MAX:
                self._fa_cache.clear()
            self._fa_cache[key] = version
        return version

    def get_mla_prefill_backend_priorities(self, capability, qk_nope_head_dim, qk_rope_head_dim, v_head_dim):
        """vLLM MLA prefill backend names, best first, for this (qk_nope, qk_rope, v) triple; [] if none.

        MLA dims are a model's, and vLLM asks with whatever the model config holds (all zeros when it has none):
        integer dims no backend can run (zero, negative, beyond the matrix's head sizes) get the answer "none",
        as vLLM's own selector gives; only a value that is not an integer is bad input (ValueError)."""
        key = (capability, qk_nope_head_dim, qk_rope_head_dim, v_head_dim)
        try:
            return list(self._mla_cache[key])
        except KeyError:
            pass
        except TypeError:
            key = None
        arch = arch_of(capability)
        nope, rope, v = (_int(name, x, float("-inf")) for name, x in (
            ("qk_nope_head_dim", qk_nope_head_dim), ("qk_rope_head_dim", qk_rope_head_dim), ("v_head_dim", v_head_dim)))
        top = V.MAX_HEAD_DIM
        names = (self.mla_prefill_priorities_for(arch, nope, rope, v)
                 if nope >= 0 and rope >= 0 and 1 <= nope + rope <= top and 1 <= v <= top and rope <= top else [])
        if key is not None:
            if len(self._mla_cache) >= CACHE_MAX:
                self._mla_cache.clear()
            self._mla_cache[key] = tuple(names)
        return names


# --- an engine's own questions, in its names ------------------------------------------------------------


class MultipleOf:
    """A KV cache block size that may be any multiple of `base` (the shape of vLLM's own `MultipleOf`)."""

    __slots__ = ("base",)

    def __init__(self, base: int):
        self.base = base

    def __eq__(self, other) -> bool:
        return isinstance(other, MultipleOf) and other.base == self.base

    def __hash__(self) -> int:
        return hash(("MultipleOf", self.base))

    def __repr__(self) -> str:
        return f"MultipleOf({self.base})"


class EngineProfile:
    """An engine's selection questions (its function names, parameters and return types live in the generated
    engine module, e.g. `attnmatrix.engines.vllm.selection`), answered by an Engine and the engine's call
    profile: declared facts, each cited, about how the engine calls the kernels where the matrix has no axis
    (`matrix/data/<engine>/<engine>-<version>-profile.json`):

    - `config_inputs`: the names of those inputs, each with what it means.
    - `config_refusals`: inputs the engine reads from its configuration or from the calling code (not features
      of one attention call) that a backend does not take at some archs and head dims; such a backend is not
      chosen when one of them is set.
    - `kernel_pages`: the page size the engine feeds a backend's kernel when the KV cache block is a multiple
      of it; that backend is asked at that page size.
    - `block_size_multiple`: the block-size multiple advertised where no kernel page applies.
    - `mla_prefill_names`: the engine's MLA prefill names in its registry order, each with the archs whose
      capability it accepts ("*": every capability, an unknown one too).
    """

    def __init__(self, engine: VllmEngine, profile: dict):
        self.engine = engine
        self.profile = profile
        self.config_inputs = frozenset(profile["config_inputs"])
        self._names = [(n["name"], None if n["archs"] == "*" else frozenset(n["archs"]))
                       for n in profile["mla_prefill_names"]]

    @staticmethod
    def _covers(rule: dict, arch, backend, dims) -> bool:
        return (rule["backend"] == backend and arch in rule["archs"]
                and any(tuple(d) == tuple(dims) for d in rule["head_dims"]))

    def refusals(self, arch, backend, dims, inputs) -> list:
        """(refusal id, input) for each configuration input in `inputs` the profile says `backend` refuses."""
        return [(r["id"], i) for r in self.profile["config_refusals"] if self._covers(r, arch, backend, dims)
                for i in r["inputs"] if i in inputs]

    def kernel_page(self, arch, backend, dims, block_size=None):
        """The page size the engine feeds `backend`'s kernel at these head sizes for this block size (any block
        size when None), or None where no kernel page applies or the block is not a multiple of it."""
        for r in self.profile["kernel_pages"]:
            if self._covers(r, arch, backend, dims) and (block_size is None or block_size % r["page_size"] == 0):
                return r["page_size"]
        return None

    def _check_inputs(self, inputs) -> frozenset:
        inputs = frozenset(inputs)
        unknown = inputs - self.config_inputs
        if unknown:
            raise ValueError(f"config_inputs: {', '.join(sorted(unknown))} not among the profile's inputs "
                             f"({', '.join(sorted(self.config_inputs))})")
        return inputs

    def flash_attn_version(self, capability, requires_alibi=False, head_size=None, head_size_v=None, has_sinks=False,
                           requires_softcap=False, kv_cache_block_size=None, *, requires_local_attention=False,
                           config_inputs=(), versions=None):
        """The FlashAttention version for this call and configuration, or None (no capability, or no
        FlashAttention backend supported): VllmEngine.flash_attn_version_for narrowed by the profile."""
        inputs = self._check_inputs(config_inputs)
        if capability is None:
            return None
        arch = arch_of(capability)
        hd = None if head_size is None else _int("head_size", head_size, 1, V.MAX_HEAD_DIM)
        hdv = None if head_size_v is None else _int("head_size_v", head_size_v, 1, V.MAX_HEAD_DIM)
        block = (None if kv_cache_block_size is None
                 else _int("kv_cache_block_size", kv_cache_block_size, 1, V.MAX_PAGE_SIZE))
        return self.engine.flash_attn_version_for(
            arch, requires_alibi, hd, hdv, has_sinks, requires_local_attention, requires_softcap, block,
            refused=lambda b, dims: bool(self.refusals(arch, b, dims, inputs)),
            kernel_page=lambda b, dims: self.kernel_page(arch, b, dims, block),
            versions=None if versions is None else frozenset(versions))

    def kernel_block_sizes(self, capability, head_size, head_size_v=None, *, config_inputs=(), versions=None):
        """The KV cache block sizes the FlashAttention backend advertises for these head sizes: [page] where the
        version chosen runs a kernel the engine feeds fixed pages, else [MultipleOf(block_size_multiple)]."""
        version = self.flash_attn_version(capability, head_size=head_size, head_size_v=head_size_v,
                                          config_inputs=config_inputs, versions=versions)
        if version is not None:
            arch = arch_of(capability)
            dims = (head_size, head_size if head_size_v is None else head_size_v)
            for b, v in self.engine.data["fa_version"].items():
                page = self.kernel_page(arch, b, dims) if v == version else None
                if page is not None:
                    return [page]
        return [MultipleOf(self.profile["block_size_multiple"]["value"])]

    def mla_prefill_priorities(self, capability, qk_nope_head_dim, qk_rope_head_dim, v_head_dim, *, validated=True):
        """The engine's MLA prefill names for this (qk_nope, qk_rope, v) triple, best first.

        validated=True: the names evidence supports for the triple (VllmEngine.get_mla_prefill_backend_priorities),
        less those whose engine backend refuses the arch. validated=False: the list the engine tries before its
        own validation: those, then every other name the arch accepts, by default rank (names attnmatrix has no
        backend for last, in registry order). An unknown capability (None): the names that accept any."""
        arch = None if capability is None else arch_of(capability)
        allowed = [n for n, archs in self._names if archs is None or (arch is not None and arch in archs)]
        ordered = [] if capability is None else [
            n for n in self.engine.get_mla_prefill_backend_priorities(
                capability, qk_nope_head_dim, qk_rope_head_dim, v_head_dim) if n in allowed]
        if validated:
            return ordered
        ranks = {}
        for b, n in self.engine.data["engine_names"]["vllm"]["mla_prefill"].items():
            r = self.engine.default_rank(arch, b) if arch is not None else self.engine.data["default_rank_missing"]
            ranks[n] = min(r, ranks.get(n, r))
        missing = self.engine.data["default_rank_missing"] + 1
        rest = sorted((n for n in allowed if n not in ordered), key=lambda n: (ranks.get(n, missing), allowed.index(n)))
        return ordered + rest
