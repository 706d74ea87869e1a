"""Checks that the evidence says what the kernels say, beyond each record's schema.

Each check guards one class of mistake found by reading the committed evidence against upstream source; each
returns every problem it finds, and `validate_evidence` (matrix/validate.py) runs them all, so
`attnmatrix validate` fails on the committed matrix if one comes back.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from attnmatrix.vocabulary import MASK_FEATURES, OPS, QUALIFIERS, arch_family

from .backends import engine_name
from .cases import feature_name
from .evidence import Evidence
from .machine_paths import machine_paths
from .records import POSITIVE_OUTCOMES
from .storage import Problem, split_where

if TYPE_CHECKING:
    from .policy import ResolvedMatrix

# A citation of vLLM itself: its repository (not vllm-project/flash-attention, its kernel fork) or its wheel.
VLLM_SOURCE_RE = re.compile(r"^(vllm-project/vllm(?![-\w])|pypi:vllm(==|\())")


def is_vllm_source(source: str) -> bool:
    return bool(VLLM_SOURCE_RE.match(source))


def _vllm_name(meta: dict, op: str | None) -> str | None:
    """The vLLM name under which vLLM runs this backend for `op` (None: vLLM never runs it; op None: any op)."""
    return next((n for o in ((op,) if op else OPS) if (n := engine_name(meta, "vllm", o))), None)


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


def check_page_table(ev: Evidence) -> list[Problem]:
    """A backend whose entry point takes no block table (backends.json `page_table: false`) cannot be supported
    with paged KV: no record may claim it. A reader that drops the page size from such a call (the cubin ingest
    once looked trtllm_ragged's paged cells up as ragged ones) would otherwise report a call nobody can make."""
    problems = []
    for rec, where in zip(ev.records, ev.where, strict=True):
        if rec.outcome not in POSITIVE_OUTCOMES or ev.backends.get(rec.case.backend, {}).get("page_table", True):
            continue
        if any(feature_name(t) == "paged_kv" for t in rec.case.features):
            f, line = split_where(where)
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
            f, line = split_where(where)
            problems.append(Problem(f, line, "reason", f"carries a machine path ({paths[0]}); rewrite the file "
                                    "through attnmatrix (matrix/storage.py dump_record cuts such paths)", rec.key))
    return problems


def _mask(features) -> frozenset:
    return frozenset(t for t in features if feature_name(t) in MASK_FEATURES)


def check_refusal_covers_kernel(ev: Evidence, m: ResolvedMatrix | None = None) -> list[Problem]:
    """A declared refusal that overrules a kernel's own evidence (compiled or shipped) at a feature set speaks of
    that kernel, so it overrules every cell the kernel answers with those features and more, on the same mask:
    a fact refusing `causal` at a head size while `causal+gqa` stays supported from the very kernel it overrules
    gives contradicting answers. Widen the fact's scope, or narrow it to what the source refuses. `m`: `ev`
    resolved, where the caller has it."""
    from .policy import SUPPORTED, UNSUPPORTED, resolve  # policy imports evidence; imported here, when run

    m = m if m is not None else resolve(ev)
    fact_file = {r.provenance.get("declared_id"): w.split("#", 1)[0] for r, w in zip(ev.records, ev.where, strict=True)
                 if r.tier == "declared"}
    blocks: dict[tuple, list] = {}
    for cell in m.cells.values():
        c = cell.case
        blocks.setdefault((c.arch, c.backend, c.op, c.dtype, c.head_dim, c.head_dim_v), []).append(cell)
    problems = []
    for cells in blocks.values():
        for refused in cells:
            w = refused.winner
            if refused.status != UNSUPPORTED or w is None or w.tier != "declared":
                continue
            kernel = {r.tier for r in refused.evidence
                      if r.outcome in POSITIVE_OUTCOMES and r.tier in ("compiled", "shipped")}
            if not kernel:
                continue
            feats = set(refused.case.features)
            for other in cells:
                if (other.status == SUPPORTED and other.tier in kernel and feats < set(other.case.features)
                        and _mask(other.case.features) == _mask(refused.case.features)):
                    fid = w.provenance.get("declared_id", "?")
                    problems.append(Problem(
                        fact_file.get(fid, "declared"), None, f"facts[{fid}].feature_sets",
                        f"refuses {'+'.join(sorted(feats)) or 'no features'} over the {other.tier} kernel, but "
                        f"{'+'.join(other.case.features)} stays supported from it: the refusal must cover it too",
                        other.case.key))
    return problems


API_REFUSAL = "attnmatrix: the API cannot express this case:"  # kernels/probe.py, for an adapter's Unsupported


def check_api_refusal_covers_feature(ev: Evidence, m: ResolvedMatrix | None = None) -> list[Problem]:
    """An entry point that cannot express a feature (the adapter's "the API cannot express this case", recorded for
    one kernel version on one arch) cannot express it on any cell: the features every cell refused with that reason
    shares (the mask and MLA qualifiers aside) may not resolve supported elsewhere for that backend, version and
    arch. Evidence from an older run of the same version (FA4's fp8 MLA prefill cells, compiled before the public
    function's missing descales were refused) would otherwise keep cells the same call refuses everywhere else.
    `m`: `ev` resolved, where the caller has it."""
    from .policy import SUPPORTED, resolve

    refusals: dict[tuple, list] = {}
    for rec in ev.records:
        if rec.outcome == "rejected" and (rec.reason or "").startswith(API_REFUSAL):
            c = rec.case
            refusals.setdefault((c.arch, c.backend, rec.kernel_version, rec.reason), []).append(
                {feature_name(t) for t in c.features} - {*MASK_FEATURES, *QUALIFIERS})
    needs = {k: set.intersection(*sets) for k, sets in refusals.items()}
    needs = {k: v for k, v in needs.items() if v}
    if not needs:
        return []
    where_of = {id(r): w for r, w in zip(ev.records, ev.where, strict=True)}
    by_block: dict[tuple, list] = {}
    for cell in (m if m is not None else resolve(ev)).cells.values():
        if cell.status == SUPPORTED:
            by_block.setdefault((cell.case.arch, cell.case.backend), []).append(cell)
    problems = []
    for (arch, backend, version, reason), feats in sorted(needs.items(), key=lambda kv: str(kv[0])):
        for cell in by_block.get((arch, backend), ()):
            if cell.kernel_version == version and feats <= {feature_name(t) for t in cell.case.features}:
                f, line = split_where(where_of.get(id(cell.winner), "matrix"))
                problems.append(Problem(f, line, "outcome",
                                        f"supported ({cell.tier}) with {', '.join(sorted(feats))}, which {backend} "
                                        f"{version} refuses on {arch} as an API that cannot express it: {reason}",
                                        cell.case.key))
    return problems


def fp8_output(meta: dict, arch: str) -> str | None:
    """The dtype a backend writes for fp8 inputs on `arch` (backends.json `fp8_output`), None if not one dtype."""
    v = meta.get("fp8_output")
    if isinstance(v, dict):
        fam = arch_family(arch)
        v = v[fam] if fam in v else v.get("*")
    return v if isinstance(v, str) else None


def check_output_dtype(ev: Evidence) -> list[Problem]:
    """The output dtype is part of validation: a positive record claims the case's dtype came out. A record that
    says which dtype the kernel wrote (`extra.out_dtype`, kernels/probe.py and xcompile.py) must name the case's;
    and an fp8 cell of a backend that writes one dtype for fp8 inputs (backends.json `fp8_output`) cannot be
    supported in another: vLLM's FA3 writes bfloat16 for fp8 whatever was asked, so a float16 fp8 pass
    validated bfloat16 output under a float16 label."""
    problems = []
    for rec, where in zip(ev.records, ev.where, strict=True):
        if rec.outcome not in POSITIVE_OUTCOMES:
            continue
        c = rec.case
        wrote = rec.extra.get("out_dtype") if isinstance(rec.extra, dict) else None
        fp8 = any(feature_name(t) == "fp8" for t in c.features)
        want = fp8_output(ev.backends.get(c.backend, {}), c.arch) if fp8 else None
        why = None
        if wrote is not None and wrote != c.dtype:
            why = f"the kernel wrote {wrote} output, not the case's {c.dtype}"
        elif want is not None and want != c.dtype:
            why = f"{c.backend} writes {want} for fp8 inputs (backends.json fp8_output), not the case's {c.dtype}"
        if why:
            f, line = split_where(where)
            problems.append(Problem(f, line, "case.dtype", f"{rec.outcome!r}, but {why}", rec.key))
    return problems


def _ran_mask(rec) -> str | None:
    """The mask a record's kernel ran: `extra.mask` (probe and compile), or the cubin lookup's maskType."""
    extra = rec.extra if isinstance(rec.extra, dict) else {}
    if extra.get("mask") is not None:
        return extra["mask"]
    lookup = extra.get("lookup") or (rec.reason if rec.tier == "shipped" else "") or ""
    if "maskType=Causal" in lookup or "maskType=SlidingOrChunkedCausal" in lookup:
        return "causal"
    if "maskType=Dense" in lookup:
        return "none"
    return None


def check_mla_mask(ev: Evidence) -> list[Problem]:
    """MLA masks are what the case says: a record whose kernel ran (or was looked up) with a mask says which
    (`extra.mask`, or the cubin lookup's maskType), and it must be the case's. An MLA prefill record without
    `causal` that does not say is from before the problem builder followed the case (it made every MLA prefill
    case causal): it claims a non-causal call that was never made."""
    problems = []
    for rec, where in zip(ev.records, ev.where, strict=True):
        if rec.tier == "declared" or rec.outcome in ("unavailable", "timeout") or rec.case.op == "decode":
            continue  # one decode query token sees every key: causal and no mask are the same call
        c = rec.case
        want = "causal" if any(feature_name(t) == "causal" for t in c.features) else "none"
        ran = _ran_mask(rec)
        window = any(feature_name(t) == "sliding_window" for t in c.features)
        if ran is not None and ran != want and not (window and ran == "causal"):
            why = f"ran with mask {ran!r}, but the case's is {want!r}"
        elif ran is None and c.op == "mla_prefill" and want == "none" and rec.outcome != "crash":
            why = ("states no mask: MLA prefill records without causal from before the problem builder followed "
                   "the case ran causal")
        else:
            continue
        f, line = split_where(where)
        problems.append(Problem(f, line, "case.features", why, rec.key))
    return problems


CHECKS = (check_cited_backend, check_page_table, check_no_machine_paths, check_refusal_covers_kernel,
          check_api_refusal_covers_feature, check_output_dtype, check_mla_mask)
# The checks that read the evidence resolved: audit resolves it once for them (a resolution is seconds).
RESOLVED_CHECKS = (check_refusal_covers_kernel, check_api_refusal_covers_feature)


def audit(ev: Evidence) -> list[Problem]:
    """Every problem every check finds."""
    from .policy import resolve

    m = resolve(ev)
    out: list[Problem] = []
    for check in CHECKS:
        out += check(ev, m) if check in RESOLVED_CHECKS else check(ev)
    return out
