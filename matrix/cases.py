"""The case space: what one probe is, and the axes a sweep is built from.

The axes are plain lists and the space is their `itertools.product` (the spirit of
flash-attention's `generate_kernels.py`). A case is a small frozen dataclass with a stable
string key, so results can be matched, resumed and merged by key alone.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from attnmatrix import vocabulary as V
from attnmatrix.vocabulary import (  # noqa: F401 - the case space's names for its axes' values
    ARCH_RE,
    ARCHS,
    DTYPES,
    FEATURES,
    MAX_HEAD_DIM,
    MAX_PAGE_SIZE,
    OPS,
    feature_arg,
    feature_name,
)

# The vocabulary (ops, dtypes, features, archs, bounds) is attnmatrix/vocabulary.py; the space's axes below
# are lists of its values.
# (head_dim, head_dim_v). (192, 128) is DeepSeek's MLA prefill (qk_nope 128 + qk_rope 64, v 128).
HEAD_DIMS: list[tuple[int, int]] = [
    (32, 32), (64, 64), (80, 80), (96, 96), (128, 128), (160, 160), (192, 192),
    (224, 224), (256, 256), (512, 512), (192, 128),
]
# MLA prefill as engines ask it: (qk_nope, qk_rope, v) triples. A case keeps head_dim = qk_nope + qk_rope
# and head_dim_v = v, and carries the rope split as the feature token `qk_rope:<n>`: vLLM's MLA prefill
# backends accept or refuse triples, so (192, 64, 256) and (256, 0, 256) are different questions.
# - DeepSeek-V3/R1 (128, 64, 128);
# - GLM-5 (192, 64, 256), vllm-project/vllm PR #43525;
# - GLM-5-Next's no-rope layout (256, 0, 256), vllm-project/vllm v0.33.0
#   vllm/v1/attention/backends/mla/prefill/flash_attn.py:330-335;
# - Mistral Small 4 (64, 64, 128), vllm-project/vllm PR #48855 (flash_attn.py:325-329 in v0.33.0).
MLA_TRIPLES: list[tuple[int, int, int]] = [(128, 64, 128), (192, 64, 256), (256, 0, 256), (64, 64, 128)]
MLA_HEAD_DIMS: list[tuple[int, int]] = sorted({(n + r, v) for n, r, v in MLA_TRIPLES})
PAGE_SIZES = [16, 64, 128, 256]

# The feature sets a standard sweep probes: each feature alone on top of the two mask modes the
# kernels specialise on. Combinations beyond these are answered by composing single-feature cells.
FEATURE_SETS: list[tuple[str, ...]] = [
    (), ("causal",), ("sliding_window",), ("causal", "softcap"), ("causal", "alibi"),
    ("causal", "sinks"), ("causal", "gqa"), ("causal", "varlen"),
    *[("causal", f"paged_kv:{p}") for p in PAGE_SIZES],
    ("causal", "fp8"),
]
# Feature sets a standard sweep adds for one backend only: vLLM's own FlashAttention builds also get vLLM's
# block size 32 (vLLM's block sizes are 16, 32, 64 and 128).
BACKEND_FEATURE_SETS: dict[str, list[tuple[str, ...]]] = {
    "vllm_fa2": [("causal", "paged_kv:32")],
    "vllm_fa3": [("causal", "paged_kv:32")],
}


class CaseError(ValueError):
    """A case (or one of its fields) is not well formed; the message names the field."""


def check_head_size(value: object, name: str = "head size") -> int:
    """`value` as a head size, or CaseError naming `name`: an int in 1..MAX_HEAD_DIM (not 0, not -1, not
    1.5, not true, not a 20-digit number). The one check of head sizes: the case space and every
    command's options use it, and the query engine enforces the same bound (attnmatrix.vocabulary)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_HEAD_DIM:
        raise CaseError(f"{name}: {value!r} is not a head size (an int in 1..{MAX_HEAD_DIM})")
    return value


def check_page_size(value: object, name: str = "page size") -> int:
    """`value` as a paged-KV block size, or CaseError naming `name`: an int in 1..MAX_PAGE_SIZE. The one
    check of page sizes (paged_kv:<n> feature tokens, every command's --page-size, the query engine)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_PAGE_SIZE:
        raise CaseError(f"{name}: {value!r} is not a page size (an int in 1..{MAX_PAGE_SIZE})")
    return value


def check_duration(value: object, name: str = "duration") -> float:
    """`value` as a positive, finite time (seconds or milliseconds, as `name` says), or CaseError naming
    `name`: not 0, not -1, not nan or inf. The one check of times: every command's --timeout and --budget-ms
    and the runner's and prober's configurations use it, so `--timeout -1` is refused before a case runs."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise CaseError(f"{name}: {value!r} is not a time (a number greater than 0)")
    return float(value)


def check_count(value: object, name: str = "count", minimum: int = 1) -> int:
    """`value` as an int >= `minimum`, or CaseError naming `name`. The one check of counts and limits (workers,
    --limit, --memory-limit, --max-diff-lines), in the CLI and in the runner's configuration."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise CaseError(f"{name}: {value!r} is not a count (an int >= {minimum})")
    return value


def normalize_arch(arch: str) -> str:
    """`sm_90a`, `sm90`, `9.0` -> the matrix key `sm_90` (attnmatrix.vocabulary.normalize_arch), or CaseError."""
    try:
        return V.normalize_arch(arch)
    except V.VocabularyError as e:
        raise CaseError(str(e)) from None


def canonical_features(features: Iterable[str]) -> tuple[str, ...]:
    """Validate feature tokens and return them sorted and de-duplicated."""
    try:
        return tuple(sorted({V.check_feature_token(tok) for tok in features}))
    except V.VocabularyError as e:
        raise CaseError(str(e)) from None


def page_size(features: Iterable[str]) -> int | None:
    return feature_arg(features, "paged_kv")


def qk_rope(features: Iterable[str]) -> int | None:
    """The rope part of an MLA case's qk head dim (`qk_rope:<n>`), None where the case names no split."""
    return feature_arg(features, "qk_rope")


@dataclass(frozen=True, order=True)
class Case:
    """One probe: which kernel, on which arch, for which problem class.

    `backend` names a module in `attnmatrix.kernels` (e.g. `fa4`, `sdpa_flash`); `entry` is the
    library entry point the backend used, recorded for humans and filled in by the backend.
    """

    arch: str
    backend: str
    op: str
    dtype: str
    head_dim: int
    head_dim_v: int
    features: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        object.__setattr__(self, "arch", normalize_arch(self.arch))
        object.__setattr__(self, "features", canonical_features(self.features))
        if not isinstance(self.backend, str) or not re.fullmatch(r"[a-z0-9_]+", self.backend):
            raise CaseError(f"backend: {self.backend!r} is not a backend name")
        if self.op not in OPS:
            raise CaseError(f"op: {self.op!r} is not one of {', '.join(OPS)}")
        if self.dtype not in DTYPES:
            raise CaseError(f"dtype: {self.dtype!r} is not one of {', '.join(DTYPES)}")
        for name in ("head_dim", "head_dim_v"):
            check_head_size(getattr(self, name), name)
        rope = qk_rope(self.features)
        if rope is not None:
            if self.op != "mla_prefill":
                raise CaseError(f"features: qk_rope:{rope} describes an MLA prefill case, not op {self.op!r}")
            if rope >= self.head_dim:
                raise CaseError(f"features: qk_rope:{rope} leaves no qk_nope part of head_dim {self.head_dim}")

    @property
    def key(self) -> str:
        """Stable identity: `sm_90/fa4/prefill/bfloat16/192x128/causal+gqa`."""
        feats = "+".join(self.features) or "none"
        return f"{self.arch}/{self.backend}/{self.op}/{self.dtype}/{self.head_dim}x{self.head_dim_v}/{feats}"

    @property
    def cell(self) -> tuple:
        """The matrix cell this case is evidence for (everything but nothing: cases are cells)."""
        return (self.arch, self.backend, self.op, self.dtype, self.head_dim, self.head_dim_v, self.features)

    def has(self, feature: str) -> bool:
        return any(feature_name(t) == feature for t in self.features)

    @property
    def page_size(self) -> int | None:
        return page_size(self.features)

    @property
    def mla_triple(self) -> tuple[int, int, int] | None:
        """(qk_nope, qk_rope, v) of an MLA prefill case that names its rope split."""
        rope = qk_rope(self.features)
        return None if rope is None else (self.head_dim - rope, rope, self.head_dim_v)

    def to_dict(self) -> dict:
        return {
            "arch": self.arch, "backend": self.backend, "op": self.op, "dtype": self.dtype,
            "head_dim": self.head_dim, "head_dim_v": self.head_dim_v, "features": list(self.features),
        }

    @classmethod
    def from_dict(cls, d: dict) -> Case:
        if not isinstance(d, dict):
            raise CaseError(f"case: expected an object, got {type(d).__name__}")
        missing = [k for k in ("arch", "backend", "op", "dtype", "head_dim", "head_dim_v") if k not in d]
        if missing:
            raise CaseError(f"case: missing field(s) {', '.join(missing)}")
        for name in ("arch", "backend", "op", "dtype"):  # 9.0 must not pass for the arch "9.0"
            if not isinstance(d[name], str):
                raise CaseError(f"{name}: {d[name]!r} is not a string")
        feats = d.get("features", [])
        if not isinstance(feats, list):
            raise CaseError("features: expected a list of feature tokens")
        return cls(d["arch"], d["backend"], d["op"], d["dtype"], d["head_dim"], d["head_dim_v"], tuple(feats))

    @classmethod
    def from_key(cls, key: str) -> Case:
        try:
            arch, backend, op, dtype, dims, feats = key.split("/")
            hd, hdv = (int(x) for x in dims.split("x"))
        except ValueError as e:
            raise CaseError(f"case key {key!r} is not arch/backend/op/dtype/DxDv/features") from e
        return cls(arch, backend, op, dtype, hd, hdv, () if feats == "none" else tuple(feats.split("+")))


def ops_for(head_dims: tuple[int, int]) -> list[str]:
    """MLA prefill is probed only at the MLA dims; plain prefill and decode at every dim."""
    return ["prefill", "decode"] + (["mla_prefill"] if head_dims in MLA_HEAD_DIMS else [])


# MLA prefill in engines is ragged, causal, never paged or windowed: a feature set with one of these has no MLA
# prefill case (`case_space`), and a declared fact's "*" feature sets skip it for MLA prefill (matrix/evidence.py).
MLA_EXCLUDED_FEATURES: tuple[str, ...] = ("paged_kv", "sliding_window")


def mla_excludes(features) -> bool:
    """Whether MLA prefill is never asked with `features` (MLA_EXCLUDED_FEATURES)."""
    return any(feature_name(str(t)) in MLA_EXCLUDED_FEATURES for t in features)


def mla_rope_splits(head_dims: tuple[int, int]) -> list[int]:
    """The qk_rope parts of the MLA triples whose (qk_nope + qk_rope, v) are these head dims."""
    return sorted({r for n, r, v in MLA_TRIPLES if (n + r, v) == tuple(head_dims)}, reverse=True)


def feature_sets_for(backend: str, feature_sets: Sequence[tuple[str, ...]]) -> list[tuple[str, ...]]:
    """The standard sets plus the backend's own additions (only when the sets are the standard ones)."""
    sets = list(feature_sets)
    if [tuple(f) for f in sets] == [tuple(f) for f in FEATURE_SETS]:
        sets += [f for f in BACKEND_FEATURE_SETS.get(backend, []) if f not in sets]
    return sets


def case_space(
    archs: Sequence[str],
    backends: Sequence[str],
    *,
    head_dims: Sequence[tuple[int, int]] = tuple(HEAD_DIMS),
    dtypes: Sequence[str] = tuple(DTYPES),
    feature_sets: Sequence[tuple[str, ...]] = tuple(FEATURE_SETS),
    ops: Sequence[str] = tuple(OPS),
) -> Iterator[Case]:
    """Every case of the product of the axes, in a deterministic order.

    An MLA prefill case is one per MLA triple of its head dims (`qk_rope:<n>` added to its features).
    """
    for arch, backend in itertools.product(archs, backends):
        sets = feature_sets_for(backend, feature_sets)
        for hd, dtype, feats in itertools.product(head_dims, dtypes, sets):
            for op in ops_for(tuple(hd)):
                if op not in ops:
                    continue
                if op != "mla_prefill":
                    yield Case(arch, backend, op, dtype, hd[0], hd[1], feats)
                    continue
                if mla_excludes(feats):
                    continue
                for rope in mla_rope_splits(tuple(hd)):
                    yield Case(arch, backend, op, dtype, hd[0], hd[1], (*feats, f"qk_rope:{rope}"))


def parse_head_dims(spec: str) -> list[tuple[int, int]]:
    """`64,128,192x128` -> [(64, 64), (128, 128), (192, 128)]; errors name the bad item."""
    out = []
    for item in (s.strip() for s in spec.split(",") if s.strip()):
        parts = item.lower().split("x")
        if len(parts) not in (1, 2) or not all(p.isdigit() for p in parts):
            raise CaseError(f"head dims: {item!r} is not N or NxNv")
        hd, hdv = int(parts[0]), int(parts[-1])
        for v in (hd, hdv):
            check_head_size(v, f"head dims: {item!r}")
        out.append((hd, hdv))
    return out
