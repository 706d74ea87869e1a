"""Checks that the evidence says what the kernels say, beyond each record's schema.

Each check guards one class of mistake found by reading the committed evidence against upstream source; each
returns every problem it finds, and `validate_evidence` (matrix/validate.py) runs them all, so
`attnmatrix validate` fails on the committed matrix if one comes back.
"""

from __future__ import annotations

import re

from .evidence import Evidence
from .storage import Problem

# A citation of vLLM itself: its repository (not vllm-project/flash-attention, its kernel fork) or its wheel.
VLLM_SOURCE_RE = re.compile(r"^(vllm-project/vllm(?![-\w])|pypi:vllm(==|\())")


def is_vllm_source(source: str) -> bool:
    return bool(VLLM_SOURCE_RE.match(source))


def _vllm_name(meta: dict, op: str | None) -> str | None:
    """The vLLM name under which vLLM runs this backend for `op` (None: vLLM never runs it)."""
    if op == "mla_prefill":
        return meta.get("mla_prefill")
    if op is None:
        return meta.get("vllm") or meta.get("mla_prefill")
    return meta.get("vllm")


def check_cited_backend(ev: Evidence) -> list[Problem]:
    """A declared ranking or fact that cites only vLLM speaks of what vLLM runs, so it must name a backend that
    vLLM runs under one of its names (backends.json `vllm` / `mla_prefill`): vLLM's own FlashAttention builds,
    never upstream flash-attn. A ranking of vLLM's FA4 encoded on upstream `fa4` would leave `vllm_fa4` (what
    vLLM's FLASH_ATTN runs) to the default rank and invert the cited order."""
    problems = []
    for r in ev.rankings:
        if not r.sources or not all(is_vllm_source(s) for s in r.sources):
            continue
        for b in r.order:
            meta = ev.backends.get(b)
            if meta is not None and _vllm_name(meta, r.op) is None:
                problems.append(Problem(r.where or "declared", None, f"rankings[{r.id}].order",
                                        f"{b!r} is not a backend vLLM runs for {r.op} (no vLLM name in backends.json), "
                                        "but every source of this ranking is vLLM's: name the backend vLLM runs "
                                        "(e.g. vllm_fa4 for vLLM's FA4)"))
    seen: set[str] = set()
    for rec, where in zip(ev.records, ev.where, strict=True):
        fid = rec.provenance.get("declared_id") if rec.tier == "declared" else None
        if not fid or fid in seen:
            continue
        seen.add(fid)
        if not rec.sources or not all(is_vllm_source(s) for s in rec.sources):
            continue
        meta = ev.backends.get(rec.case.backend)
        if meta is not None and _vllm_name(meta, None) is None:
            problems.append(Problem(where.split("#", 1)[0], None, f"facts[{fid}].backend",
                                    f"{rec.case.backend!r} is not a backend vLLM runs, but every source of this fact "
                                    "is vLLM's: name the backend vLLM runs", rec.key))
    return problems


CHECKS = (check_cited_backend,)


def audit(ev: Evidence) -> list[Problem]:
    """Every problem every check finds."""
    out: list[Problem] = []
    for check in CHECKS:
        out += check(ev)
    return out
