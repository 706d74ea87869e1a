"""Checks that the evidence says what the kernels say, beyond each record's schema.

Each check guards one class of mistake found by reading the committed evidence against upstream source; each
returns every problem it finds, and `validate_evidence` (matrix/validate.py) runs them all, so
`attnmatrix validate` fails on the committed matrix if one comes back.
"""

from __future__ import annotations

import re

from .cases import feature_name
from .evidence import Evidence
from .machine_paths import machine_paths
from .records import POSITIVE_OUTCOMES
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


def _split(where: str) -> tuple[str, int | None]:
    f, _, n = where.rpartition(":")
    if f and n.isdigit():
        return f, int(n)
    return where.split("#", 1)[0], None


def check_page_table(ev: Evidence) -> list[Problem]:
    """A backend whose entry point takes no block table (backends.json `page_table: false`) cannot be supported
    with paged KV: no record may claim it. A reader that drops the page size from such a call (the cubin ingest
    once looked trtllm_ragged's paged cells up as ragged ones) would otherwise report a call nobody can make."""
    problems = []
    for rec, where in zip(ev.records, ev.where, strict=True):
        if rec.outcome not in POSITIVE_OUTCOMES or ev.backends.get(rec.case.backend, {}).get("page_table", True):
            continue
        if any(feature_name(t) == "paged_kv" for t in rec.case.features):
            f, line = _split(where)
            problems.append(Problem(f, line, "outcome", f"{rec.case.backend} takes no block table (backends.json "
                                    f"page_table: false), yet this paged KV cell is {rec.outcome!r}", rec.key))
    return problems


def check_no_machine_paths(ev: Evidence) -> list[Problem]:
    """No reason carries a path of the machine that wrote it (a cache, a checkout, a home directory): it says
    where a probe ran, not what the kernel does (matrix/machine_paths.py; writing a record cuts them)."""
    problems = []
    for rec, where in zip(ev.records, ev.where, strict=True):
        paths = machine_paths(rec.reason)
        if paths:
            f, line = _split(where)
            problems.append(Problem(f, line, "reason", f"carries a machine path ({paths[0]}); rewrite the file "
                                    "through attnmatrix (matrix/storage.py dump_record cuts such paths)", rec.key))
    return problems


CHECKS = (check_cited_backend, check_page_table, check_no_machine_paths)


def audit(ev: Evidence) -> list[Problem]:
    """Every problem every check finds."""
    out: list[Problem] = []
    for check in CHECKS:
        out += check(ev)
    return out
