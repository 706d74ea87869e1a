"""The shared vocabulary: the names every part of attnmatrix speaks, defined once. Standard library only.

It sits at the bottom of the stack: the case space (`matrix/cases.py`), records and the resolution policy,
the query engine (`attnmatrix/selector_engine.py`), the generator, the pages, the engine oracles and the CLI
take their features, ops, dtypes, outcomes, tiers, statuses and archs from here. It ships with the vendored
selector (`selector.py` + `selector_engine.py` + `selector_vllm.py` + this module), so it imports nothing but
the standard library.

A new feature axis is one `Feature` entry here (plus whatever a kernel needs to build its inputs): the case
space's token check, the query parameters of the engine and the selector, the CLI's query options, the
docs' feature columns and the engine-name mappings all read `FEATURE_INFO`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# --- ops and dtypes ---------------------------------------------------------------------------------

OPS: tuple[str, ...] = ("prefill", "decode", "mla_prefill")
DTYPES: tuple[str, ...] = ("bfloat16", "float16")
# Other spellings a caller may use for a dtype (torch's `torch.bfloat16` is read as `bfloat16`).
DTYPE_ALIASES: dict[str, str] = {"bf16": "bfloat16", "fp16": "float16", "half": "float16"}

# --- bounds -------------------------------------------------------------------------------------------

MAX_HEAD_DIM = 1024
# A paged KV block larger than this is no engine's block size (vLLM's are 16..256; FlashInfer's up to 1024).
MAX_PAGE_SIZE = 65536

# --- features -----------------------------------------------------------------------------------------
#
# A feature token is a bare name (a flag) or `name:<int>` (a sized feature: paged KV carries its block size,
# an MLA case its rope head dim). The order of FEATURE_INFO is the display order of pages and the order of
# the query parameters; FEATURES is their names.

FLAG, SIZED = "flag", "sized"


@dataclass(frozen=True)
class Feature:
    """One attention feature axis.

    `param`: the query parameter that asks for it (select_backends/explain keyword, CLI option); None where
    no query sets it directly (qk_rope comes from the MLA triple). `arg_min`/`arg_max`: a sized feature's
    argument bounds. `mask`: a mask mode every component cell of a composed query shares. `qualifier`: the
    token narrows a cell and answers only where a cell carries it. `column`: the docs' support-table column
    label (None: no column of its own). `vllm`: the vLLM argument it corresponds to, for documentation and mappings.
    """

    name: str
    kind: str
    doc: str
    param: str | None = None
    arg_min: int | None = None
    arg_max: int | None = None
    mask: bool = False
    qualifier: bool = False
    column: str | None = None
    vllm: str | None = None
    arg_doc: str | None = None  # what a sized feature's argument is, for error messages

    def token(self, arg: int | None = None) -> str:
        return self.name if self.kind == FLAG else f"{self.name}:{arg}"


FEATURE_INFO: tuple[Feature, ...] = (
    Feature("causal", FLAG, "causal (bottom-right aligned) mask", "causal", mask=True, vllm="causal"),
    Feature("sliding_window", FLAG, "a sliding (local) attention window", "sliding_window",
            column="Sliding window", vllm="requires_local_attention"),
    Feature("softcap", FLAG, "logit soft-capping", "softcap", column="Softcap", vllm="requires_softcap"),
    Feature("alibi", FLAG, "ALiBi position bias", "alibi", column="ALiBi", vllm="requires_alibi"),
    Feature("sinks", FLAG, "attention sinks (a learned logit per head)", "sinks", column="Sinks",
            vllm="has_sinks"),
    Feature("gqa", FLAG, "grouped-query attention (fewer KV heads than query heads)", "gqa"),
    Feature("varlen", FLAG, "ragged sequence lengths in one batch", "varlen"),
    Feature("paged_kv", SIZED, "a paged KV cache", "page_size", 1, MAX_PAGE_SIZE,
            vllm="kv_cache_block_size", arg_doc="a block size"),
    Feature("fp8", FLAG, "fp8 (e4m3) q, k and v with per-tensor descales", "fp8"),
    Feature("fp8_kv", FLAG, "an fp8 (e4m3) KV cache with K and V descales, the query in the case's dtype",
            "fp8_kv", column="FP8 KV cache", vllm="kv_cache_dtype"),
    Feature("qk_rope", SIZED, "the rope part of an MLA query/key head size", None, 0, MAX_HEAD_DIM,
            qualifier=True, vllm="qk_rope_head_dim", arg_doc="the rope head dim"),
)
FEATURE_BY_NAME: dict[str, Feature] = {f.name: f for f in FEATURE_INFO}
FEATURES: tuple[str, ...] = tuple(f.name for f in FEATURE_INFO)
FLAG_FEATURES: tuple[str, ...] = tuple(f.name for f in FEATURE_INFO if f.kind == FLAG)
MASK_FEATURES: tuple[str, ...] = tuple(f.name for f in FEATURE_INFO if f.mask)
QUALIFIERS: tuple[str, ...] = tuple(f.name for f in FEATURE_INFO if f.qualifier)
# The query parameters, in order, with their defaults: flags off except the mask modes; sized ones None.
QUERY_PARAMS: dict[str, object] = {f.param: (f.mask if f.kind == FLAG else None) for f in FEATURE_INFO if f.param}


class VocabularyError(ValueError):
    """A name or token is not in the vocabulary; the message names the field and the known values."""


def feature_name(token: str) -> str:
    """`paged_kv:16` -> `paged_kv`."""
    return token.partition(":")[0]


def feature_arg(features, name: str) -> int | None:
    """The argument of the sized feature `name` among `features` (`paged_kv:16` -> 16), None when absent."""
    for tok in features:
        n, _, arg = tok.partition(":")
        if n == name:
            return int(arg)
    return None


def check_feature_token(token: str) -> str:
    """`token` if it is a well-formed feature token, else VocabularyError naming it."""
    name, _, arg = str(token).partition(":")
    f = FEATURE_BY_NAME.get(name)
    if f is None:
        raise VocabularyError(f"features: unknown feature {token!r} (known: {', '.join(FEATURES)})")
    if f.kind == FLAG:
        if arg or ":" in str(token):
            raise VocabularyError(f"features: {token!r} takes no argument")
        return str(token)
    ok = arg.isascii() and arg.isdigit() and arg == str(int(arg)) and f.arg_min <= int(arg) <= f.arg_max
    if not ok:
        raise VocabularyError(f"features: {token!r} needs {f.arg_doc} (an int in {f.arg_min}..{f.arg_max}), "
                              f"e.g. {f.name}:{16 if f.arg_min else 64}")
    return str(token)


def features_of(**params) -> tuple[str, ...]:
    """Query parameters (`causal=True, page_size=16, ...`, see QUERY_PARAMS, whose defaults fill the rest;
    `qk_rope=` for the MLA split) -> the matrix's feature tokens, sorted. Unknown parameters raise TypeError,
    bad sizes VocabularyError."""
    toks = []
    by_param = {f.param or f.name: f for f in FEATURE_INFO}
    for p, value in {**QUERY_PARAMS, **params}.items():
        f = by_param.get(p)
        if f is None:
            raise TypeError(f"unknown query parameter {p!r} (known: {', '.join(by_param)})")
        if f.kind == FLAG:
            if value:
                toks.append(f.name)
        elif value is not None:  # 0 where the size starts at 1 is refused like -1, not read as "absent"
            toks.append(check_feature_token(f"{f.name}:{_int(p, value, f.arg_min, f.arg_max)}"))
    return tuple(sorted(toks))


def query_params_of(features) -> dict[str, object]:
    """The query parameters that ask for the feature tokens `features`, the inverse of `features_of`: every flag
    parameter (False where its feature is absent) and each sized feature's argument (`page_size=16`, `qk_rope=64`).
    Malformed or unknown tokens raise VocabularyError."""
    params: dict[str, object] = {f.param: False for f in FEATURE_INFO if f.kind == FLAG and f.param}
    for tok in features:
        f = FEATURE_BY_NAME[feature_name(check_feature_token(tok))]
        params[f.param or f.name] = True if f.kind == FLAG else int(str(tok).partition(":")[2])
    return params


def _int(name: str, v: object, lo: int, hi: int | None = None) -> int:
    """An int (or an integral float: 128.0 is 128); bools, strings and values outside `lo`..`hi` are refused."""
    if isinstance(v, bool):
        raise VocabularyError(f"{name}: {v!r} is not an integer")
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    try:
        i = v.__index__()  # type: ignore[union-attr]
    except (AttributeError, TypeError):
        raise VocabularyError(f"{name}: {v!r} is not an integer") from None
    if i < lo:
        raise VocabularyError(f"{name}: {v!r} is below {lo}")
    if hi is not None and i > hi:
        raise VocabularyError(f"{name}: {v!r} is above {hi}")
    return i


check_int = _int

# --- outcomes, tiers, statuses ----------------------------------------------------------------------------

# What happened when a case was probed.
OUTCOMES: tuple[str, ...] = ("pass", "wrong", "rejected", "crash", "timeout", "unavailable", "compiled", "shipped")
POSITIVE_OUTCOMES: frozenset[str] = frozenset({"pass", "compiled", "shipped"})
# Outcomes that say nothing about the kernel's support (the package was not importable).
UNINFORMATIVE_OUTCOMES: frozenset[str] = frozenset({"unavailable"})
# How strong the evidence is, strongest first (display order; the resolution's own ranking, where a declared
# negative sits between validated and compiled, is matrix/policy.py `rank`). `shipped`: a prebuilt binary for
# that exact arch and configuration is listed in the library's own kernel table: as strong as a compile.
TIERS: tuple[str, ...] = ("validated", "compiled", "shipped", "declared")
TIER_ORDER: dict[str, int] = {t: i for i, t in enumerate(TIERS)}
# What the evidence says about a cell or a query.
SUPPORTED, UNSUPPORTED, UNKNOWN = "supported", "unsupported", "unknown"
STATUSES: tuple[str, ...] = (SUPPORTED, UNSUPPORTED, UNKNOWN)

# --- archs ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Arch:
    """A GPU arch: its matrix key (`sm_90`), compute capability, capability-major family (the key vLLM's
    defaults and `default_rank` use), generation and the products that carry it."""

    name: str
    capability: tuple[int, int]
    generation: str
    products: tuple[str, ...]

    @property
    def family(self) -> str:
        return f"sm_{self.capability[0]}x"


# The GPU archs the matrix covers (what a declared fact's "*" arch scope means).
ARCH_INFO: tuple[Arch, ...] = (
    Arch("sm_80", (8, 0), "Ampere", ("A100", "A30")),
    Arch("sm_86", (8, 6), "Ampere", ("A10", "A40", "RTX A6000", "RTX 3090")),
    Arch("sm_89", (8, 9), "Ada Lovelace", ("L4", "L40S", "RTX 4090")),
    Arch("sm_90", (9, 0), "Hopper", ("H100", "H200", "GH200")),
    Arch("sm_100", (10, 0), "Blackwell", ("B200", "GB200")),
    Arch("sm_103", (10, 3), "Blackwell Ultra", ("B300", "GB300")),
    Arch("sm_110", (11, 0), "Blackwell (Thor)", ("Jetson Thor",)),
    Arch("sm_120", (12, 0), "Blackwell (RTX)", ("RTX PRO 6000 Blackwell", "RTX 5090")),
)
ARCHS: tuple[str, ...] = tuple(a.name for a in ARCH_INFO)
ARCH_BY_NAME: dict[str, Arch] = {a.name: a for a in ARCH_INFO}
CPU = "cpu"
ARCH_RE = re.compile(r"^(cpu|sm_\d{2,3})$")
ARCH_FAMILY_RE = re.compile(r"sm_([1-9][0-9]?)x")


def arch_of(capability) -> str:
    """(9, 0) -> "sm_90"; ValueError for anything that is not a (major, minor) pair of ints."""
    try:
        major, minor = capability
    except (TypeError, ValueError):
        raise VocabularyError(f"capability: {capability!r} is not a (major, minor) tuple") from None
    # The minor is one digit: (1, 10) is not sm_110, which is (11, 0).
    return f"sm_{_int('capability major', major, 1)}{_int('capability minor', minor, 0, 9)}"


def capability_of(arch: str) -> tuple[int, int]:
    """`sm_90` -> (9, 0), `sm_120` -> (12, 0), `sm_100a` -> (10, 0); VocabularyError for `cpu` or a non-arch."""
    m = re.fullmatch(r"sm_?(\d{1,2})(\d)[af]?", str(arch).strip().lower())
    if not m:
        raise VocabularyError(f"arch: {arch!r} has no compute capability")
    return int(m.group(1)), int(m.group(2))


def capability_label(arch: str) -> str:
    """`sm_90` -> `9.0`; an arch without a capability (`cpu`) as it is."""
    try:
        return "{}.{}".format(*capability_of(arch))
    except VocabularyError:
        return arch


def normalize_arch(arch: object) -> str:
    """`sm_90a`, `sm90`, `compute_90`, `9.0` -> the matrix key `sm_90`; `cpu` stays `cpu`.

    The `a`/`f` suffixes are compile targets of one arch, not different hardware: the matrix keys on the
    hardware, and the exact target is kept in provenance.
    """
    s = str(arch).strip().lower()
    if s == CPU:
        return CPU
    m = re.fullmatch(r"sm_?(\d{2,3})[af]?", s) or re.fullmatch(r"compute_(\d{2,3})[af]?", s)
    if m:
        return f"sm_{m.group(1)}"
    m = re.fullmatch(r"(\d{1,2})\.(\d)", s)
    if m:
        return f"sm_{m.group(1)}{m.group(2)}"
    raise VocabularyError(f"arch: {arch!r} is not an arch (expected e.g. sm_90, sm_100a, 9.0 or cpu)")


def arch_family(arch: str | None) -> str | None:
    """The capability-major family key: `sm_90` -> `sm_9x`, `sm_100` -> `sm_10x`; None for `cpu` or None."""
    try:
        return f"sm_{capability_of(arch)[0]}x" if arch is not None and str(arch).startswith("sm_") else None
    except VocabularyError:
        return None


def arch_sort_key(arch: str) -> tuple:
    """GPU archs by capability, `cpu` (and anything else) after them."""
    try:
        return (0, capability_of(arch), arch)
    except VocabularyError:
        return (1, (0, 0), arch)


def products(arch: str) -> tuple[str, ...]:
    """The products that carry `arch` (B200/GB200 for sm_100), () for an arch the vocabulary does not list."""
    a = ARCH_BY_NAME.get(arch)
    return a.products if a else ()
