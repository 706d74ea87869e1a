"""What vLLM would choose: its FlashAttention-version and MLA-prefill rules, written down as data.

This is the *other side* of the comparison page (`site/vllm-comparison.md`): vLLM's hand-written
conditions, re-expressed (not copied) as small tables, so the generator can put vLLM's choice next to
attnmatrix's evidence-ranked one, cell by cell. Nothing here reads the matrix; nothing in the matrix or
the selector reads this module. The rules are pure Python, no imports beyond the standard library.

Sources read (`VLLM_SOURCES`, each as repository@commit path:line, a PR number, or a PyPI release and the
path inside it; `matrix/data/DECLARED_SOURCES.md` § "vLLM rules" has more):

- `get_flash_attn_version` in `vllm/v1/attention/backends/fa_utils.py` as vLLM PR #42669 ("Integrate
  FlashAttention 4 SM100 headdim 256 support", merge commit bf2b45b5d6a991f47702d4d87c81bb0ef8619a65) left
  it: signature `requires_alibi, head_size, head_size_v, has_sinks, requires_local_attention`. The
  release before it, v0.26.0 (vllm-project/vllm@ffd46bfab2128bb84146050e98b51a617c6575ab, fa_utils.py:132),
  has the same steps without `requires_local_attention` and without FA4 head size 256 on Blackwell; the
  earlier states at @00bd1493b3e82d6c13c68ee8a0e1c5a96707e190 and @7283494f0d92c85072c48d8c3895beb8110b488e
  were read too. The rules below are PR #42669's state.
- `is_fa_version_supported` in `vllm/vllm_flash_attn/flash_attn_interface.py:89` of the vllm 0.26.0 wheel
  (a file vLLM's build copies from its flash-attention fork): FA2 needs capability major >= 8, FA3 major 9,
  FA4 major 9, 10 or 11 (`_is_fa4_supported`, line 72).
- `_get_mla_prefill_backend_priorities` in `vllm/v1/attention/backends/mla/prefill/selector.py`: v0.26.0's
  lists at line 48 (FLASH_ATTN first everywhere; on capability 10 then TRTLLM_RAGGED, FLASHINFER,
  TOKENSPEED_MLA), plus PR #42669's GLM-5 dims case (TRTLLM_RAGGED first); the history at
  vllm-project/vllm@97c9aa737d404d916ca6c68cd5fab1db04fb173d and @04331387fd1f734cf116cdb059714dcdf8f01d18.
- The per-backend checks of `validate_configuration` (`mla/prefill/base.py` at
  vllm-project/vllm@b80db7e198929d63893227274b0dee51a587b7d5; `trtllm_ragged.py`, `flashinfer.py`,
  `cudnn.py`, `flash_attn.py` at vllm-project/vllm@9402beec2ecf4d5efd71ab0e191a2e57e94a72a8), with GLM-5
  dims added to TRTLLM_RAGGED by PR #43525; the FLASH_ATTN MLA prefill caller passing
  `head_size=qk_nope+qk_rope, head_size_v=v` (v0.26.0 `mla/prefill/flash_attn.py:105`) and padding V only
  for FA2 (line 119).

What is modelled: vLLM's *default* decision on CUDA with the standard wheel, every FlashAttention build
and every MLA prefill backend importable (the `is_available()` checks pass). Not modelled, on purpose:
an explicit `attention_config.flash_attn_version` or `mla_prefill_backend`, `VLLM_BATCH_INVARIANT`,
diffusion models (per-sequence causal), the Hopper FA4 FP8 server resolver, ROCm and XPU, and vLLM's
top-level attention-backend choice (FLASH_ATTN vs FLASHINFER vs others), which is a different selector.
vLLM runs its own fork (`vllm-flash-attn`), which can differ from upstream (e.g. the fork's FA3 takes
attention sinks, upstream FA3 does not): its names are answered by the fork's builds, below.

Mapping to attnmatrix backend names (`VLLM_TO_BACKEND`, `backend_for`): the backend that runs exactly what
vLLM runs under that name. FLASH_ATTN with version 2/3/4 -> vLLM's own builds `vllm_fa2`/`vllm_fa3`/`vllm_fa4`
(never upstream flash-attn); TRTLLM_RAGGED -> `trtllm_ragged`; FLASHINFER -> `flashinfer_cutlass` (vLLM builds
`BatchPrefillWithRaggedKVCacheWrapper` with `backend="cutlass"`; FlashInfer's own `backend="auto"` choice,
`flashinfer`, runs other kernels); TOKENSPEED_MLA -> none (not probed). CUDNN (only in older
priority lists) -> none: vLLM's CUDNN MLA prefill calls FlashInfer's `cudnn_batch_prefill_with_kv_cache`,
not PyTorch SDPA, so `sdpa_cudnn`'s numbers would stand for a different code path; we do not substitute.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# --- sources --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    what: str
    repo: str
    path: str  # path in the repository (or the release), with :line where the line was read
    ref: str  # a full commit, or "pypi:<name>==<version>" for a file that exists only in a released wheel
    note: str = ""


V0_26_0 = "ffd46bfab2128bb84146050e98b51a617c6575ab"  # vllm-project/vllm v0.26.0, as its wheel's _version.py says
PR_42669 = "bf2b45b5d6a991f47702d4d87c81bb0ef8619a65"  # merge commit of vllm-project/vllm PR #42669

VLLM_SOURCES: tuple[Source, ...] = (
    Source("get_flash_attn_version as PR #42669 left it (requires_local_attention; FA4 head size 256 on "
           "Blackwell)", "vllm-project/vllm", "vllm/v1/attention/backends/fa_utils.py", PR_42669,
           "Merge commit of PR #42669 (2026-07-27); the rules model this state"),
    Source("get_flash_attn_version in v0.26.0 (before PR #42669)", "vllm-project/vllm",
           "vllm/v1/attention/backends/fa_utils.py:132", V0_26_0),
    Source("get_flash_attn_version (earlier state: head_size > 128 -> FA2, default FA4 on major 10)",
           "vllm-project/vllm", "vllm/v1/attention/backends/fa_utils.py", "00bd1493b3e82d6c13c68ee8a0e1c5a96707e190"),
    Source("get_flash_attn_version (earlier state: FA4 for major >= 10, 192 exempt)", "vllm-project/vllm",
           "vllm/v1/attention/backends/fa_utils.py", "7283494f0d92c85072c48d8c3895beb8110b488e"),
    Source("is_fa_version_supported: FA2 major >= 8, FA3 major 9, FA4 majors 9/10/11 (_is_fa4_supported, line 72)",
           "vllm-project/vllm (wheel; the file comes from vLLM's flash-attention fork at build time)",
           "vllm/vllm_flash_attn/flash_attn_interface.py:89", "pypi:vllm==0.26.0"),
    Source("_get_mla_prefill_backend_priorities in v0.26.0: FLASH_ATTN first; on capability 10 then "
           "TRTLLM_RAGGED, FLASHINFER, TOKENSPEED_MLA", "vllm-project/vllm",
           "vllm/v1/attention/backends/mla/prefill/selector.py:48", V0_26_0),
    Source("_get_mla_prefill_backend_priorities: the GLM-5 dims case (TRTLLM_RAGGED first)", "vllm-project/vllm",
           "vllm/v1/attention/backends/mla/prefill/selector.py", PR_42669, "Merge commit of PR #42669"),
    Source("_get_mla_prefill_backend_priorities (history: TRTLLM_RAGGED, FLASHINFER, CUDNN, FLASH_ATTN)",
           "vllm-project/vllm", "vllm/v1/attention/backends/mla/prefill/selector.py",
           "97c9aa737d404d916ca6c68cd5fab1db04fb173d"),
    Source("_get_mla_prefill_backend_priorities (history: after PR #34732, FLASH_ATTN first on Blackwell)",
           "vllm-project/vllm", "vllm/v1/attention/backends/mla/prefill/selector.py",
           "04331387fd1f734cf116cdb059714dcdf8f01d18"),
    Source("MLAPrefillBackend.validate_configuration (capability, dtype, availability, dims)",
           "vllm-project/vllm", "vllm/v1/attention/backends/mla/prefill/base.py",
           "b80db7e198929d63893227274b0dee51a587b7d5"),
    Source("TRTLLM_RAGGED / FLASHINFER / CUDNN MLA prefill: capability major == 10, DeepSeek-R1 dims",
           "vllm-project/vllm", "vllm/v1/attention/backends/mla/prefill/{trtllm_ragged,flashinfer,cudnn}.py",
           "9402beec2ecf4d5efd71ab0e191a2e57e94a72a8", "GLM-5 dims added to TRTLLM_RAGGED later by PR #43525"),
    Source("FLASH_ATTN MLA prefill: get_flash_attn_version(head_size=qk, head_size_v=v); V padded only for FA2 "
           "(line 119)", "vllm-project/vllm", "vllm/v1/attention/backends/mla/prefill/flash_attn.py:105", V0_26_0),
)


# --- FlashAttention version (get_flash_attn_version) ----------------------------------------------

# is_fa_version_supported, per version: (lowest capability major, highest or None for no bound).
FA_BUILT: dict[int, tuple[int, int | None]] = {2: (8, None), 3: (9, 9), 4: (9, 11)}
# Step 1, the default by capability major (used when that version is built), else FA2.
FA_DEFAULT: dict[int, int] = {9: 3, 10: 4}
FA_FALLBACK_DEFAULT = 2


@dataclass(frozen=True)
class FaRule:
    """One fallback step of get_flash_attn_version, applied in order after the default.

    It applies when the version chosen so far is `version`, the capability major is within `majors`
    (inclusive; None = no bound) and every condition that is not None holds. It then switches to the first
    of `to` that is built for this capability; if none is, the version stays.
    """

    id: str
    version: int
    to: tuple[int, ...]
    says: str  # what vLLM logs or means, in short
    majors: tuple[int | None, int | None] = (None, None)
    alibi: bool | None = None
    sinks: bool | None = None
    local: bool | None = None
    head_size_gt: int | None = None  # head_size is not None and head_size > this
    head_size_eq: int | None = None  # head_size == this
    diff_v: bool | None = None  # head_size and head_size_v both given and different
    exempt: tuple[tuple[int, int | None], ...] = ()  # (head_size, head_size_v or None for any) left alone

    def applies(self, major: int, version: int, *, alibi: bool, sinks: bool, local: bool, head_size: int | None,
                head_size_v: int | None) -> bool:
        lo, hi = self.majors
        if version != self.version or (lo is not None and major < lo) or (hi is not None and major > hi):
            return False
        if self.alibi is not None and alibi != self.alibi:
            return False
        if self.sinks is not None and sinks != self.sinks:
            return False
        if self.local is not None and local != self.local:
            return False
        if self.head_size_gt is not None and not (head_size is not None and head_size > self.head_size_gt):
            return False
        if self.head_size_eq is not None and head_size != self.head_size_eq:
            return False
        if self.diff_v is not None:
            differs = head_size is not None and head_size_v is not None and head_size != head_size_v
            if differs != self.diff_v:
                return False
        return not any(head_size == hs and (hsv is None or head_size_v == hsv) for hs, hsv in self.exempt)


FA_RULES: tuple[FaRule, ...] = (
    FaRule("fa3-on-blackwell", 3, (4, 2), "FA3 cannot run on Blackwell: FA4 if built, else FA2 (reachable only "
           "through an explicit flash_attn_version)", majors=(10, None)),
    FaRule("alibi-fa3", 3, (2,), "FA3 has no ALiBi: FA2", alibi=True),
    FaRule("alibi-fa4", 4, (2,), "FA4 has no ALiBi: FA2", alibi=True),
    FaRule("hopper-headdim-gt-256", 3, (4,), "FA3 does not take head size > 256 on SM90: upgrade to FA4",
           majors=(9, 9), head_size_gt=256),
    FaRule("hopper-diffkv-sinks", 3, (4,), "sinks with head_size != head_size_v on SM90: upgrade to FA4",
           majors=(9, 9), sinks=True, diff_v=True),
    FaRule("blackwell-hd256-local", 4, (2,), "FA4 on Blackwell has no local attention at head size 256: FA2",
           majors=(10, None), head_size_eq=256, local=True),
    FaRule("blackwell-tmem", 4, (2,), "FA4 on Blackwell: head size > 128 only as 256 or (192, 128) (TMEM "
           "capacity): FA2", majors=(10, None), head_size_gt=128, exempt=((256, None), (192, 128))),
)


def fa_built(version: int, major: int) -> bool:
    lo, hi = FA_BUILT.get(version, (1000, None))
    return major >= lo and (hi is None or major <= hi)


@dataclass(frozen=True)
class FaDecision:
    version: int | None
    steps: tuple[str, ...]  # how it got there: the default, then each rule that switched it

    @property
    def explanation(self) -> str:
        return "; ".join(self.steps)


def flash_attn_version(capability: tuple[int, int], requires_alibi: bool = False, head_size: int | None = None,
                       head_size_v: int | None = None, has_sinks: bool = False,
                       requires_local_attention: bool = False) -> FaDecision:
    """vLLM's get_flash_attn_version on CUDA with the default config, from the tables above."""
    major = int(capability[0])
    default = FA_DEFAULT.get(major)
    if default is not None and fa_built(default, major):
        v = default
        steps = [f"default FA{v} on capability major {major}"]
    else:
        v = FA_FALLBACK_DEFAULT
        steps = [f"default FA{v} (no preferred version for capability major {major})"]
    for rule in FA_RULES:
        if rule.applies(major, v, alibi=requires_alibi, sinks=has_sinks, local=requires_local_attention,
                        head_size=head_size, head_size_v=head_size_v):
            new = next((t for t in rule.to if fa_built(t, major)), None)
            if new is not None and new != v:
                steps.append(f"{rule.id}: {rule.says} (FA{v} -> FA{new})")
                v = new
    if not fa_built(v, major):
        steps.append(f"FA{v} is not supported on capability major {major}: None")
        return FaDecision(None, tuple(steps))
    return FaDecision(v, tuple(steps))


# --- MLA prefill (get_mla_prefill_backend) ---------------------------------------------------------

R1_DIMS = (128, 64, 128)  # DeepSeek-V3/R1: qk_nope, qk_rope, v
GLM5_DIMS = (192, 64, 256)  # GLM-5


@dataclass(frozen=True)
class MlaPriority:
    """A priority list: the first row whose capability majors and dims match gives vLLM's order."""

    order: tuple[str, ...]
    majors: tuple[int, int] | None = None  # inclusive; None = any
    dims: tuple[int, int, int] | None = None  # (qk_nope, qk_rope, v); None = any


MLA_PRIORITIES: tuple[MlaPriority, ...] = (
    MlaPriority(("TRTLLM_RAGGED", "FLASH_ATTN", "FLASHINFER", "TOKENSPEED_MLA"), (10, 10), GLM5_DIMS),
    MlaPriority(("FLASH_ATTN", "TRTLLM_RAGGED", "FLASHINFER", "TOKENSPEED_MLA"), (10, 10)),
    MlaPriority(("FLASH_ATTN",)),
)


@dataclass(frozen=True)
class MlaLimits:
    """The static part of a backend's validate_configuration (availability is assumed)."""

    majors: tuple[int, int] | None = None  # inclusive; None = any
    dims: tuple[tuple[int, int, int], ...] | None = None  # None = any
    needs_fa_version: bool = False  # FLASH_ATTN: get_flash_attn_version(qk, v) must not be None


MLA_LIMITS: dict[str, MlaLimits] = {
    "TRTLLM_RAGGED": MlaLimits((10, 10), (R1_DIMS, GLM5_DIMS)),
    "FLASHINFER": MlaLimits((10, 10), (R1_DIMS,)),
    "TOKENSPEED_MLA": MlaLimits((10, 10), (R1_DIMS,)),
    "CUDNN": MlaLimits((10, 10), (R1_DIMS,)),
    "FLASH_ATTN": MlaLimits(needs_fa_version=True),
}


def _in(major: int, majors: tuple[int, int] | None) -> bool:
    return majors is None or majors[0] <= major <= majors[1]


def mla_prefill_priorities(capability: tuple[int, int], qk_nope_head_dim: int, qk_rope_head_dim: int,
                           v_head_dim: int) -> tuple[str, ...]:
    """vLLM's priority list (before validation) for this capability and these MLA dims."""
    major, dims = int(capability[0]), (qk_nope_head_dim, qk_rope_head_dim, v_head_dim)
    for p in MLA_PRIORITIES:
        if _in(major, p.majors) and (p.dims is None or p.dims == dims):
            return p.order
    return ()


def mla_backend_rejects(name: str, capability: tuple[int, int], qk_nope_head_dim: int, qk_rope_head_dim: int,
                        v_head_dim: int) -> list[str]:
    """Why vLLM's validate_configuration would refuse this MLA prefill backend here ([] = accepted)."""
    major, dims = int(capability[0]), (qk_nope_head_dim, qk_rope_head_dim, v_head_dim)
    lim = MLA_LIMITS.get(name)
    if lim is None:
        return [f"{name}: not in the rule table"]
    out = []
    if not _in(major, lim.majors):
        out.append(f"compute capability major {major} not supported")
    if lim.dims is not None and dims not in lim.dims:
        out.append(f"MLA dims {dims} not supported")
    if lim.needs_fa_version and flash_attn_version(capability, head_size=qk_nope_head_dim + qk_rope_head_dim,
                                                   head_size_v=v_head_dim).version is None:
        out.append("no FlashAttention version")
    return out


@dataclass(frozen=True)
class MlaDecision:
    name: str | None  # vLLM's MLA prefill backend name, None if every one is refused
    fa: FaDecision | None  # for FLASH_ATTN: the FlashAttention version it runs
    priorities: tuple[str, ...]
    refused: tuple[tuple[str, tuple[str, ...]], ...] = field(default=())  # (name, reasons) walked past

    @property
    def pads_v(self) -> bool:
        """FLASH_ATTN pads V up to the QK head size unless it runs FA3 on SM90 or FA4 (FA2 needs equal dims)."""
        return self.name == "FLASH_ATTN" and self.fa is not None and self.fa.version == 2


def mla_prefill_backend(capability: tuple[int, int], qk_nope_head_dim: int, qk_rope_head_dim: int,
                        v_head_dim: int) -> MlaDecision:
    """vLLM's automatic MLA prefill choice: the first backend of the priority list that validates."""
    pr = mla_prefill_priorities(capability, qk_nope_head_dim, qk_rope_head_dim, v_head_dim)
    refused = []
    for name in pr:
        why = mla_backend_rejects(name, capability, qk_nope_head_dim, qk_rope_head_dim, v_head_dim)
        if not why:
            fa = flash_attn_version(capability, head_size=qk_nope_head_dim + qk_rope_head_dim,
                                    head_size_v=v_head_dim) if name == "FLASH_ATTN" else None
            return MlaDecision(name, fa, pr, tuple(refused))
        refused.append((name, tuple(why)))
    return MlaDecision(None, None, pr, tuple(refused))


# --- in attnmatrix's vocabulary ---------------------------------------------------------------------

VLLM_TO_BACKEND: dict[str, str | None] = {"TRTLLM_RAGGED": "trtllm_ragged", "FLASHINFER": "flashinfer_cutlass",
                                          "TOKENSPEED_MLA": None, "CUDNN": None}
FA_VERSION_TO_BACKEND: dict[int, str] = {2: "vllm_fa2", 3: "vllm_fa3", 4: "vllm_fa4"}
# The MLA dims attnmatrix's (head_dim, head_dim_v) stand for: vLLM decides on the split, the kernels on the sum.
MLA_ROPE_HEAD_DIM = 64


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
    why: str  # the rules that led there
    pads_v: bool = False


def capability_of(arch: str) -> tuple[int, int]:
    """`sm_90` -> (9, 0), `sm_120` -> (12, 0)."""
    n = arch[3:]
    return int(n[:-1]), int(n[-1])


def vllm_choice(arch: str, op: str, head_dim: int, head_dim_v: int, features: tuple[str, ...]) -> VllmChoice:
    """vLLM's choice for a matrix cell. prefill/decode: FLASH_ATTN at get_flash_attn_version(...) (ALiBi,
    sinks and sliding window from the features; the other features do not enter vLLM's version choice).
    mla_prefill: get_mla_prefill_backend at qk_nope = head_dim - 64, qk_rope = 64, v = head_dim_v."""
    cap = capability_of(arch)
    names = {f.partition(":")[0] for f in features}
    if op == "mla_prefill":
        d = mla_prefill_backend(cap, head_dim - MLA_ROPE_HEAD_DIM, MLA_ROPE_HEAD_DIM, head_dim_v)
        refused = "; ".join(f"{n} refused ({', '.join(r)})" for n, r in d.refused)
        order = " > ".join(d.priorities) or "none"
        if d.name is None:
            return VllmChoice(None, "none", f"priorities {order}; {refused}")
        label = d.name if d.fa is None else f"{d.name} FA{d.fa.version}"
        why = f"priorities {order}" + (f"; {refused}" if refused else "")
        if d.fa is not None:
            why += f"; {d.fa.explanation}"
        if d.pads_v:
            why += f"; V padded to {head_dim}"
        return VllmChoice(backend_for(d.name, d.fa.version if d.fa else None), label, why, d.pads_v)
    fa = flash_attn_version(cap, requires_alibi="alibi" in names, head_size=head_dim, head_size_v=head_dim_v,
                            has_sinks="sinks" in names, requires_local_attention="sliding_window" in names)
    if fa.version is None:
        return VllmChoice(None, "none", fa.explanation)
    return VllmChoice(backend_for("FLASH_ATTN", fa.version), f"FLASH_ATTN FA{fa.version}", fa.explanation)
