"""vLLM's names in attnmatrix's vocabulary, and vLLM's recorded answer for a matrix cell in those names.

vLLM's answers are not re-derived here. They come from the committed answers file of a pinned vLLM release
(`matrix/data/vllm/vllm-<version>-answers.json`), written by `attnmatrix vllm-answers`, which runs the
release's own `get_flash_attn_version` and MLA prefill selection (`oracle.py`). What this module adds is the
mapping from a matrix cell to vLLM's question and from vLLM's answer to attnmatrix's backend names. Nothing in
the matrix or the selector reads it.

The mapping is derived from `matrix/data/backends.json`, where each backend says which vLLM names run exactly
its entry point (`fa_version`: the FlashAttention version vLLM's FLASH_ATTN runs it as; `mla_prefill`: the
vLLM MLA prefill backend name that runs it). Today that gives FLASH_ATTN with version 2/3/4 -> vLLM's own
builds `vllm_fa2`/`vllm_fa3`/`vllm_fa4` (never upstream flash-attn); TRTLLM_RAGGED -> `trtllm_ragged`;
FLASHINFER -> `flashinfer_cutlass` (vLLM builds `BatchPrefillWithRaggedKVCacheWrapper` with
`backend="cutlass"`, vllm/v1/attention/backends/mla/prefill/flashinfer.py in v0.33.0; FlashInfer's own
`backend="auto"` choice, `flashinfer`, runs other kernels). vLLM names no backend carries answer None;
`UNPROBED` says why for the ones vLLM's lists name: TOKENSPEED_MLA (not probed) and CUDNN (only in older
priority lists; vLLM's CUDNN MLA prefill calls FlashInfer's `cudnn_batch_prefill_with_kv_cache`, not PyTorch
SDPA, so `sdpa_cudnn`'s numbers would stand for a different code path).

A cell's question is vLLM's whole decision. Prefill and decode (equal head sizes) first ask the attention
backend choice of vLLM's CUDA platform (its priority list for the capability, each backend's
`validate_configuration` with the cell's head size, dtype, sinks, sliding window, paged-KV block size and fp8 KV
cache); where that is FLASH_ATTN they ask `get_flash_attn_version` with the cell's head sizes, ALiBi, sinks,
softcap and block size (vLLM 0.33.0 takes no local-attention argument), and where it is another backend the cell
is *routed* (`VllmChoice.routed`): the FA version is then not what vLLM runs. The backend choice takes one head
size (vLLM's selector config has no V head size): a cell whose V head size differs asks it at the query/key head
size, and the version helper with both. mla_prefill asks the MLA prefill choice
(priority walk and validate_configuration) for the MLA triple(s) of the cell's (qk, v) head dims
(`matrix.cases.MLA_TRIPLES`) and its dtype.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from attnmatrix.matrix.cases import mla_rope_splits
from attnmatrix.matrix.evidence import BACKENDS_FILE, DATA_DIR, load_backends
from attnmatrix.vocabulary import capability_of

from . import answers as A

# --- sources --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    what: str
    repo: str
    path: str  # path in the repository (or the release), with :line where the line was read
    ref: str  # a full commit, or "pypi:<name>==<version>" for a file that exists only in a released wheel
    note: str = ""


PINNED_VLLM = "0.33.0"  # the release whose answers the comparison page uses (matrix/data/vllm/)

VLLM_SOURCES: tuple[Source, ...] = (
    Source("FLASHINFER MLA prefill builds BatchPrefillWithRaggedKVCacheWrapper with backend=\"cutlass\" "
           "(the mapping to flashinfer_cutlass)", "vllm-project/vllm (wheel)",
           "vllm/v1/attention/backends/mla/prefill/flashinfer.py", f"pypi:vllm=={PINNED_VLLM}"),
    Source("CUDNN MLA prefill calls FlashInfer's cudnn_batch_prefill_with_kv_cache (not mapped to sdpa_cudnn; "
           "only in older priority lists)", "vllm-project/vllm", "vllm/v1/attention/backends/mla/prefill/cudnn.py",
           "9402beec2ecf4d5efd71ab0e191a2e57e94a72a8"),
)


def answers_file(data_dir: str | Path) -> Path:
    """The pinned release's answers file under a matrix data folder (matrix/data)."""
    return Path(data_dir) / "vllm" / f"vllm-{PINNED_VLLM}-answers.json"


def default_answers() -> A.Answers:
    """The pinned release's committed answers, next to the matrix data this package reads."""
    return A.load_answers(answers_file(DATA_DIR))


# --- in attnmatrix's vocabulary ---------------------------------------------------------------------

FA_VERSION_FIELD, MLA_PREFILL_FIELD = "fa_version", "mla_prefill"  # backends.json fields naming vLLM's names
FLASH_ATTN = "FLASH_ATTN"  # vLLM's FlashAttention backend: which build runs is the FA version it picks
UNPROBED: dict[str, str] = {
    "TOKENSPEED_MLA": "not probed",
    "CUDNN": "FlashInfer's cudnn_batch_prefill_with_kv_cache, not PyTorch SDPA's cuDNN kernels (not probed)",
}


class MappingError(ValueError):
    """backends.json gives one vLLM name to two backends: the mapping would have to guess."""


@dataclass(frozen=True)
class VllmNames:
    """vLLM's names -> attnmatrix backends, read off the backends' own declarations."""

    fa_version: dict[int, str]  # FLASH_ATTN's FlashAttention version -> backend
    mla_prefill: dict[str, str]  # MLA prefill backend name other than FLASH_ATTN -> backend

    @classmethod
    def from_backends(cls, backends: dict[str, dict]) -> VllmNames:
        """Invert backends.json's `fa_version` and `mla_prefill` fields; MappingError when two backends claim
        the same vLLM name (naming both)."""
        fa: dict[int, str] = {}
        mla: dict[str, str] = {}
        for b in sorted(backends):
            meta = backends[b]
            if meta.get(FA_VERSION_FIELD) is not None:
                version = int(meta[FA_VERSION_FIELD])
                _claim(fa, version, f"{FLASH_ATTN} FA{version}", b, FA_VERSION_FIELD)
            name = meta.get(MLA_PREFILL_FIELD)
            if name and name != FLASH_ATTN:
                _claim(mla, str(name), str(name), b, MLA_PREFILL_FIELD)
        return cls(fa, mla)

    def backend_for(self, vllm_name: str, fa_version: int | None = None) -> str | None:
        """attnmatrix's backend name for a vLLM choice (None where attnmatrix probes no such backend)."""
        if vllm_name == FLASH_ATTN:
            return None if fa_version is None else self.fa_version.get(fa_version)
        return self.mla_prefill.get(vllm_name)

    def rows(self) -> list[tuple[str, str]]:
        """(vLLM's name, attnmatrix's backend or why none), for the comparison page."""
        rows = [(f"{FLASH_ATTN}, FA{v}", b) for v, b in sorted(self.fa_version.items())]
        named = {**self.mla_prefill, **dict.fromkeys(UNPROBED)}
        return rows + [(n, b or "none (not probed)") for n, b in sorted(named.items())]


def _claim(table: dict, key: object, label: str, backend: str, field: str) -> None:
    if key in table:
        raise MappingError(f"matrix/data/backends.json: backends.{backend}.{field}: vLLM's {label} is already "
                           f"declared by {table[key]}; one vLLM name runs one backend")
    table[key] = backend


@functools.cache
def package_names() -> VllmNames:
    """The mapping from the package's own backends.json."""
    return VllmNames.from_backends(load_backends(BACKENDS_FILE))


def backend_for(vllm_name: str, fa_version: int | None = None) -> str | None:
    """attnmatrix's backend name for a vLLM choice, from the package's backends.json."""
    return package_names().backend_for(vllm_name, fa_version)


@dataclass(frozen=True)
class VllmChoice:
    """What vLLM would run for one matrix cell, in attnmatrix's names."""

    backend: str | None  # attnmatrix backend, None when vLLM has no choice or attnmatrix does not probe it
    label: str  # vLLM's own words: "FLASH_ATTN FA3", "TRTLLM_RAGGED", "none"
    why: str  # what vLLM's code said on the way (its log lines, the priorities and refusals)
    pads_v: bool = False
    routed: bool = False  # vLLM's attention backend choice is not FLASH_ATTN: its FA version is not what it runs


def _log_text(lines: list[str]) -> str:
    return "; ".join(ln.partition(": ")[2] for ln in lines)


def _mla_label(r: dict) -> str:
    if r["backend"] is None:
        return "none"
    return r["backend"] if r["fa_version"] is None else f"{r['backend']} FA{r['fa_version']}"


def vllm_choice(answers: A.Answers, arch: str, op: str, dtype: str, head_dim: int, head_dim_v: int,
                features: tuple[str, ...], names: VllmNames | None = None) -> VllmChoice:
    """vLLM's choice for a matrix cell, from the release's recorded answers (see the module docstring), in the
    names of `names` (default: the package's backends.json)."""
    names = names or package_names()
    cap = capability_of(arch)
    version = f"vLLM {answers.version}"
    if op == "mla_prefill":
        rope = next((int(t.partition(":")[2]) for t in features if t.startswith("qk_rope:")), None)
        splits = [rope] if rope is not None else mla_rope_splits((head_dim, head_dim_v))
        triples = [(head_dim - r, r, head_dim_v) for r in splits]
        rows = [(t, answers.mla(cap, t, dtype)) for t in triples]
        rows = [(t, r) for t, r in rows if r is not None]
        if not rows:
            return VllmChoice(None, "none", f"no {version} answer recorded for MLA dims {head_dim}x{head_dim_v} on "
                                            f"{arch} ({dtype}); regenerate with `attnmatrix vllm-answers`")
        t, r = rows[0]
        order = " > ".join(r["priorities"]) or "none"
        refused = "; ".join(f"{n} refused ({', '.join(why)})" for n, why in r["refused"])
        why = f"{version} at MLA dims {'x'.join(map(str, t))}: priorities {order}" + (f"; {refused}" if refused else "")
        if r["log"]:
            why += f"; {_log_text(r['log'])}"
        if r["pads_v"]:
            why += f"; V padded to {head_dim}"
        others = [f"{'x'.join(map(str, t2))}: {_mla_label(r2)}" for t2, r2 in rows[1:]
                  if _mla_label(r2) != _mla_label(r)]
        if others:
            why += f"; the same (qk, v) dims as another triple answer otherwise ({'; '.join(others)})"
        if r["backend"] is None:
            return VllmChoice(None, "none", why)
        return VllmChoice(names.backend_for(r["backend"], r["fa_version"]), _mla_label(r), why, bool(r["pads_v"]))
    # The whole decision: the attention backend (priority list, each backend's validate_configuration, asked
    # with the query/key head size: vLLM's selector config has no V head size), then, for FLASH_ATTN, the
    # FlashAttention version (which takes both head sizes).
    decision, chosen = "", FLASH_ATTN
    d = answers.backend(cap, head_dim, dtype, **A.backend_params(features))
    if d is not None:
        refused = "; ".join(f"{n} refused ({', '.join(why)})" for n, why in d["refused"]
                            if d["backend"] is None or d["priorities"].index(n) < d["priorities"].index(d["backend"]))
        decision = (f"{version} attention backend: priorities {' > '.join(d['priorities'])}"
                    + (f"; {refused}" if refused else "") + f"; picks {d['backend'] or 'none'}")
        chosen = d["backend"]
        if chosen is None:
            return VllmChoice(None, "none", decision + " (no valid backend)")
        if chosen != FLASH_ATTN:
            return VllmChoice(None, chosen, decision, routed=True)
    params = A.fa_params(features)
    r = answers.fa(cap, head_dim, head_dim_v, **params)
    if r is None:
        return VllmChoice(None, "none", f"no {version} answer recorded for get_flash_attn_version on {arch} at "
                                        f"{head_dim}x{head_dim_v} {params}; regenerate with `attnmatrix vllm-answers`")
    why = f"{version} get_flash_attn_version: " + (_log_text(r["log"]) or "its default for this capability")
    if decision:
        why = f"{decision}; {why}"
    if r["version"] is None:
        return VllmChoice(None, "none", why + " (no FlashAttention version)")
    return VllmChoice(names.backend_for(FLASH_ATTN, r["version"]), f"FLASH_ATTN FA{r['version']}", why)
