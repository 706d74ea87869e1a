"""The query page's data: the query engine's own answers, precomputed, for the browser.

The query page (site/query.md, site/javascripts/query.js) runs with no server. It does not evaluate queries
itself: every answer it shows is `Engine.explain_query`'s, computed here by the one query engine
(`attnmatrix.selector_engine`) and published per (arch, op) as `site/data/query/<arch>-<op>.json`. The page
only looks an answer up and lays it out, so it answers exactly what `select_backends`/`explain` answer.

Which queries: every (dtype, head size, feature set) probed on that arch and op by any backend, plus the
queries of the arch pages' decision tables and of the model presets (composed queries the engine answers
from several cells). All feature combinations would be 2^8 x block sizes per head size (about 40,000
queries per arch and op, megabytes of answers); the page says so for a combination outside the published
set and gives the `attnmatrix explain` command that answers it.

Size: a supported answer's text differs between queries mostly by its position, so the position is left out
("#{} of {}") and filled in by the page from the order; every text is stored once per file, as a list of
fragments (the pieces between its separators, each stored once) that join back into it.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import defaultdict
from collections.abc import Iterable

from attnmatrix.matrix.cases import OPS
from attnmatrix.matrix.policy import ResolvedMatrix, arch_sort_key

from attnmatrix.vocabulary import features_of

from . import tables as T
from .capabilities import engine_for, evidence_id, is_test_only
from .gpus import load_gpus
from .links import source_url

QUERY_DIR = "site/data/query"
SCHEMA = "attnmatrix.query/1"
_POSITION = re.compile(r"^supported \(#(\d+) of (\d+), ")

Key = tuple[str, int, int, tuple[str, ...]]  # dtype, head_dim, head_dim_v, features (sorted tokens)


def key_text(dtype: str, head_dim: int, head_dim_v: int, features: Iterable[str]) -> str:
    """`bfloat16|256|256|causal+sliding_window` (`none` for no features): the page builds the same string."""
    return f"{dtype}|{head_dim}|{head_dim_v}|{'+'.join(sorted(features)) or 'none'}"


def strip_position(text: str) -> str:
    """A supported explanation with its position left out: "supported (#{} of {}, ..."."""
    return _POSITION.sub("supported (#{} of {}, ", text, count=1)


def query_space(m: ResolvedMatrix, extra: Iterable[tuple[str, str, str, int, int, tuple[str, ...]]] = ()
                ) -> dict[tuple[str, str], set[Key]]:
    """(arch, op) -> the queries published: every probed cell's, and `extra` (arch, op, dtype, hd, hdv, feats)."""
    eng = engine_for(m)
    out: dict[tuple[str, str], set[Key]] = defaultdict(set)
    for c in T.public_cells(m):
        k = c.case
        if k.arch in eng.archs:
            out[(k.arch, k.op)].add((k.dtype, k.head_dim, k.head_dim_v, tuple(sorted(k.features))))
    for arch, op, dtype, hd, hdv, feats in extra:
        if arch in eng.archs:
            out[(arch, op)].add((dtype, hd, hdv, tuple(sorted(feats))))
    return out


def _evidence_sources(m: ResolvedMatrix, arch: str) -> dict[str, list[list[str | None]]]:
    """evidence id -> [[source text, link or null], ...] for every cell's deciding record on `arch`."""
    out: dict[str, list[list[str | None]]] = {}
    for c in T.public_cells(m):
        if c.case.arch == arch and c.winner is not None:
            eid = evidence_id(c.winner)
            if eid not in out:
                out[eid] = [[s, source_url(s)] for s in c.sources]
    return out


def query_files(m: ResolvedMatrix, extra: Iterable[tuple[str, str, str, int, int, tuple[str, ...]]] = (),
                presets: list[dict] | None = None) -> dict[str, str]:
    """{site path: JSON text}: one answers file per (arch, op) and the index the page starts from."""
    eng = engine_for(m)
    gpus = load_gpus()
    space = query_space(m, extra)
    # The product's backends only: a test plugin loaded in the process is no part of the published pages.
    labels = {b: str(m.backends.get(b, {}).get("label", b)) for b in m.backends if not is_test_only(m, b)}
    out: dict[str, str] = {}
    index_archs = []
    for arch in sorted({a for a, _ in space}, key=arch_sort_key):
        evidence = _evidence_sources(m, arch)
        ops = []
        for op in [o for o in OPS if (arch, o) in space]:
            keys = sorted(space[(arch, op)], key=lambda k: (k[0], k[1] != k[2], k[1], k[2], len(k[3]), k[3]))
            files = {}
            for dtype in sorted({k[0] for k in keys}):
                path = f"{QUERY_DIR}/{arch}-{op}-{dtype}.json"
                out[path] = _answers_file(eng, arch, op, dtype, [k for k in keys if k[0] == dtype], evidence)
                files[dtype] = path.removeprefix(QUERY_DIR + "/")
            dims = sorted({(hd, hdv) for _, hd, hdv, _ in keys}, key=lambda d: (d[0] != d[1], d))
            ops.append({"op": op, "files": files,
                        "head_sizes": [list(d) for d in dims],
                        "features": sorted({t for k in keys for t in k[3]}, key=_token_key)})
        index_archs.append({"arch": arch, "title": gpus.title(arch), "products": list(gpus.products(arch)),
                            "ops": ops})
    index = _headed("the query page's index of published answers",
                    {"archs": index_archs, "labels": dict(sorted(labels.items())), "presets": presets or []}, {})
    out[f"{QUERY_DIR}/index.json"] = _dump(index)
    return out


def _answers_file(eng, arch: str, op: str, dtype: str, keys: list[Key], evidence: dict) -> str:
    """One (arch, op, dtype)'s answers: per query, the backends in explain's order, each as [backend index,
    text index] pairs flattened; texts, backends and the evidence's sources stored once."""
    texts: dict[str, int] = {}
    backends: dict[str, int] = {}
    answers = {}
    used: set[str] = set()
    for _, hd, hdv, feats in keys:
        ex = eng.explain_query(arch, op, dtype, hd, hdv, feats)
        flat = []
        for b, t in ex.items():
            flat += [backends.setdefault(b, len(backends)), texts.setdefault(strip_position(t), len(texts))]
            used.update(_EVIDENCE.findall(t))
        answers[key_text(dtype, hd, hdv, feats)] = flat
    fragments: dict[str, int] = {}
    encoded = [[fragments.setdefault(f, len(fragments)) for f in _SEPARATORS.split(t)] for t in texts]
    body = {"backends": list(backends), "fragments": list(fragments), "texts": encoded,
            "evidence": {e: evidence[e] for e in sorted(used) if e in evidence}, "answers": answers}
    return _dump(_headed(f"the query engine's answers for {arch} {op} {dtype}", body,
                         {"arch": arch, "op": op, "dtype": dtype}))


def _headed(what: str, body: dict, extra: dict) -> dict:
    """A header naming the file's own content (a hash of it), not the whole matrix: a fact about one arch
    changes that arch's answers, not every file."""
    content_id = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:12]
    return {"generated": f"Generated by attnmatrix: {what}. Do not edit by hand; run `attnmatrix generate`.",
            "schema": SCHEMA, "content_id": content_id, **extra, **body}


# A text is stored as the fragments between (and including) its separators: reasons, evidence ids and feature
# sets recur across texts in other combinations, so each is stored once; a text is its fragments joined.
_SEPARATORS = re.compile(r"(; | \| |: )")
# evidence ids in explain's texts: "evidence: causal: ID | sliding_window: ID" and "[evidence: ID]"
_EVIDENCE = re.compile(r"(?:: |\[evidence: )([^\s|\];]+)(?= \||\]|$)")


def _token_key(t: str) -> tuple:
    name, _, arg = t.partition(":")
    return (name, int(arg) if arg.isdigit() else -1)


def _dump(d: dict) -> str:
    """One top-level key a line, answers one query a line: small, readable diffs."""
    lines = ["{"]
    items = list(d.items())
    for i, (k, v) in enumerate(items):
        end = "," if i < len(items) - 1 else ""
        if isinstance(v, dict) and k in ("answers", "evidence", "labels") and v:
            inner = [f"    {json.dumps(a)}: {json.dumps(b, ensure_ascii=False)}" for a, b in v.items()]
            lines.append(f"  {json.dumps(k)}: {{\n" + ",\n".join(inner) + f"\n  }}{end}")
        elif isinstance(v, list) and k in ("texts", "archs", "presets") and v:
            inner = [f"    {json.dumps(x, ensure_ascii=False)}" for x in v]
            lines.append(f"  {json.dumps(k)}: [\n" + ",\n".join(inner) + f"\n  ]{end}")
        else:
            lines.append(f"  {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}{end}")
    return "\n".join(lines) + "\n}\n"


# --- model presets -----------------------------------------------------------------------------------

def load_presets(path: str | None) -> list[dict]:
    """The model presets the query page offers (matrix/data/models.json, read by `attnmatrix.matrix.models`;
    None or a missing file: none): per model, one bfloat16 query per layer type and op, each the call the layer
    makes on one GPU at the model's typical tensor-parallel split (`LayerType.query_params`)."""
    if not path:
        return []
    from pathlib import Path

    from attnmatrix.matrix.models import load_models

    if not Path(path).exists():
        return []
    out = []
    for name, mdl in load_models(path).items():
        queries = []
        for ly in mdl.layers:
            for op in ly.ops():
                params = ly.query_params(op, mdl.tp)
                hd, hdv = ly.head_dim, ly.head_dim_v
                queries.append({"label": f"{ly.type} layers ({ly.describe(mdl.tp)}), {op}", "op": op,
                                "dtype": "bfloat16", "head_dim": hd, "head_dim_v": hdv,
                                "features": list(features_of(**params))})
        out.append({"name": name, "family": mdl.family, "tp": mdl.tp, "source": mdl.source, "queries": queries})
    return out


def preset_queries(m: ResolvedMatrix, presets: list[dict]) -> list[tuple[str, str, str, int, int, tuple[str, ...]]]:
    """Every preset's queries on every arch, for the query page to publish."""
    archs = engine_for(m).archs
    return [(a, q["op"], q["dtype"], q["head_dim"], q["head_dim_v"], tuple(q["features"]))
            for p in presets for q in p["queries"] for a in archs]


def mla_models(presets: list[dict]) -> dict[tuple[int, int, int], list[str]]:
    """(qk_nope, qk_rope, v) -> the preset families with an MLA layer of that triple."""
    out: dict[tuple[int, int, int], list[str]] = defaultdict(list)
    for p in presets:
        for q in p["queries"]:
            rope = next((int(t.split(":")[1]) for t in q["features"] if t.startswith("qk_rope:")), None)
            if q["op"] == "mla_prefill" and rope is not None:
                key = (q["head_dim"] - rope, rope, q["head_dim_v"])
                if p["family"] not in out[key]:
                    out[key].append(p["family"])
    return dict(out)
