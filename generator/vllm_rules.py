"""vLLM's side of the comparison page in attnmatrix's names: what vLLM answers for a matrix cell.

vLLM's answers are not re-derived here. They come from the committed answers file of a pinned vLLM release
(`matrix/data/vllm/vllm-<version>-answers.json`), written by `attnmatrix vllm-answers`, which runs the
release's own `get_flash_attn_version` and MLA prefill selection (generator/vllm_oracle.py). What this
module adds is the mapping from a matrix cell to vLLM's question and from vLLM's answer to attnmatrix's
backend names. Nothing in the matrix or the selector reads it.

Mapping to attnmatrix backend names (`VLLM_TO_BACKEND`, `backend_for`): the backend that runs exactly what
vLLM runs under that name. FLASH_ATTN with version 2/3/4 -> vLLM's own builds `vllm_fa2`/`vllm_fa3`/`vllm_fa4`
(never upstream flash-attn); TRTLLM_RAGGED -> `trtllm_ragged`; FLASHINFER -> `flashinfer_cutlass` (vLLM builds
`BatchPrefillWithRaggedKVCacheWrapper` with `backend="cutlass"`, vllm/v1/attention/backends/mla/prefill/
flashinfer.py in v0.33.0; FlashInfer's own `backend="auto"` choice, `flashinfer`, runs other kernels);
TOKENSPEED_MLA -> none (not probed). CUDNN (only in older priority lists) -> none: vLLM's CUDNN MLA prefill
calls FlashInfer's `cudnn_batch_prefill_with_kv_cache`, not PyTorch SDPA, so `sdpa_cudnn`'s numbers would
stand for a different code path.

A cell's question: prefill and decode ask `get_flash_attn_version` with the cell's head sizes, ALiBi,
sinks, softcap and paged-KV block size (vLLM 0.33.0 takes no local-attention argument; the other features do
not enter it). mla_prefill asks the MLA prefill choice for the MLA triple(s) of the cell's (qk, v) head
dims (`matrix.cases.MLA_TRIPLES`) and its dtype.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from attnmatrix.matrix.cases import mla_rope_splits

from . import vllm_oracle as O

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


def default_answers() -> O.Answers:
    """The pinned release's committed answers, next to the matrix data this package reads."""
    from attnmatrix.project import package_data_dir

    return O.load_answers(answers_file(package_data_dir()))


# --- in attnmatrix's vocabulary ---------------------------------------------------------------------

VLLM_TO_BACKEND: dict[str, str | None] = {"TRTLLM_RAGGED": "trtllm_ragged", "FLASHINFER": "flashinfer_cutlass",
                                          "TOKENSPEED_MLA": None, "CUDNN": None}
FA_VERSION_TO_BACKEND: dict[int, str] = {2: "vllm_fa2", 3: "vllm_fa3", 4: "vllm_fa4"}


def backend_for(vllm_name: str, fa_version: int | None = None) -> str | None:
    """attnmatrix's backend name for a vLLM choice (None where attnmatrix probes no such backend)."""
    if vllm_name == "FLASH_ATTN":
        return None if fa_version is None else FA_VERSION_TO_BACKEND.get(fa_version)
    return VLLM_TO_BACKEND.get(vllm_name)


@dataclass(frozen=True)
class VllmChoice:
    """What vLLM would run for one matrix cell, in attnmatrix's names."""

    backend: str | None  # attnmatrix backend, None when vLLM has no choice or attnmatrix does not probe it
    label: str  # vLLM's own words: "FLASH_ATTN FA3", "TRTLLM_RAGGED", "none"
    why: str  # what vLLM's code said on the way (its log lines, the priorities and refusals)
    pads_v: bool = False


capability_of = O.capability_of


def _log_text(lines: list[str]) -> str:
    return "; ".join(ln.partition(": ")[2] for ln in lines)


def _mla_label(r: dict) -> str:
    if r["backend"] is None:
        return "none"
    return r["backend"] if r["fa_version"] is None else f"{r['backend']} FA{r['fa_version']}"


def vllm_choice(answers: O.Answers, arch: str, op: str, dtype: str, head_dim: int, head_dim_v: int,
                features: tuple[str, ...]) -> VllmChoice:
    """vLLM's choice for a matrix cell, from the release's recorded answers (see the module docstring)."""
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
        return VllmChoice(backend_for(r["backend"], r["fa_version"]), _mla_label(r), why, bool(r["pads_v"]))
    params = O.fa_params(features)
    r = answers.fa(cap, head_dim, head_dim_v, **params)
    if r is None:
        return VllmChoice(None, "none", f"no {version} answer recorded for get_flash_attn_version on {arch} at "
                                        f"{head_dim}x{head_dim_v} {params}; regenerate with `attnmatrix vllm-answers`")
    why = f"{version} get_flash_attn_version: " + (_log_text(r["log"]) or "its default for this capability")
    if r["version"] is None:
        return VllmChoice(None, "none", why + " (no FlashAttention version)")
    return VllmChoice(backend_for("FLASH_ATTN", r["version"]), f"FLASH_ATTN FA{r['version']}", why)
