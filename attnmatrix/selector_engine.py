"""The query engine: answers questions about a resolved compatibility matrix. Standard library only.

Written once, by hand. Everything that asks "which backend, and why" goes through it: the generated
selector (`attnmatrix.selector` = generated capability data + this module + `attnmatrix.selector_vllm`, which
asks it vLLM's questions), `attnmatrix explain`, the docs tables and the vLLM comparison. Resolution (evidence
-> one answer per cell) is not here: it lives in `attnmatrix.matrix.policy`; this module only reads its result,
as plain data (`Engine(data)`; built by `attnmatrix.generator.capabilities.engine_data`, written out readably
as the selector's `DATA`).

The vocabulary (ops, dtypes, feature tokens and query parameters, outcomes, tiers, statuses, archs) is
`attnmatrix.vocabulary`, which ships beside this module: outcomes in `POSITIVE_OUTCOMES` mean supported, in
`UNINFORMATIVE_OUTCOMES` say nothing (a cell with only such evidence is unknown), any other unsupported;
`MASK_FEATURES` (causal) are shared by every component cell of a composed query; `QUALIFIERS` (qk_rope, the
rope split of an MLA head size) narrow a cell and are dropped where no cell carries them.

The data (every key required):

- `archs`; `backends`: arch -> the backends a query on that arch considers.
- `rules`: backend -> rules. A rule is (archs, ops, dtypes, head sizes, feature sets, verdict), each a tuple:
  archs and ops and dtypes are names, a head size is an int or a (head_dim, head_dim_v) pair, a feature set
  a tuple of feature tokens (`()`: none), and the verdict (outcome, tier, evidence id[, short reason]). The
  product of the tuples is the cells the rule covers. On one arch rules do not overlap; a cell no rule covers
  has no evidence.
- `measured`: arch -> (op, dtype, head_dim, head_dim_v, feature set) -> ((backend, latency_ms), ...) fastest
  first, or (backend, latency_ms, shapes completed, shapes the most complete backend completed) for a
  backend that completed fewer timing shapes. Like for like (`measured_latencies`): the median over the
  shapes the most complete backends all completed; a backend with fewer, its ratio to them on the shapes
  it completed, scaled to theirs.
- `declared_rankings`: (id, archs, op, dtype or None, ((head_dim, head_dim_v), ...), order, sources).
- `default_rank`: arch -> backend -> rank (lower first); `default_rank_missing` for the others.
- `engine_names`: engine -> op -> backend -> the name under which that inference engine runs the backend for
  that op (vLLM: FLASH_ATTN, ...), derived from matrix/data/backends.json; a backend it does not run has none.
  (`fa_version` and `fa_common_head_sizes` are vLLM's: `attnmatrix.selector_vllm` reads them.)

A query is (arch, op, dtype, head_dim, head_dim_v, feature tokens). The exact feature set answers when a
cell has it. Otherwise the query is composed: its mask cell, then one cell per other feature, looked up on
top of the same mask, then on top of causal, then alone. A backend is supported when every component
cell is; any unsupported component makes it unsupported (every reason is kept); a feature nothing
answers makes it unknown. Supported backends are ordered by measured latency (a composed query: its
slowest component), then by the first declared ranking that applies, then by default rank.
"""

from __future__ import annotations

from statistics import median

try:
    from . import vocabulary as V
    from .selector_workloads import WORKLOAD_HINTS, place, workload_features
except ImportError:  # vendored as plain modules beside each other
    import vocabulary as V
    from selector_workloads import WORKLOAD_HINTS, place, workload_features

SUPPORTED, UNSUPPORTED, UNKNOWN = V.SUPPORTED, V.UNSUPPORTED, V.UNKNOWN
CACHE_MAX = 1 << 16
_int = V.check_int
arch_of = V.arch_of
features_of = V.features_of


def fset_label(features) -> str:
    return "+".join(features) or "none"


def measured_latencies(timings: dict) -> dict:
    """Like-for-like latencies for one query class: backend -> {timing shape: ms} in, backend ->
    (latency, shapes it completed, most shapes any completed) out.

    The backends that completed the most shapes are compared on the shapes they all completed (each its
    median there). A backend that completed fewer is compared with them only on the shapes it completed:
    its latency is its median ratio to theirs on those shapes, times their median over all of theirs, so a
    backend that ran out of memory on the large shapes neither wins on its small ones nor changes how the
    others rank. Where nothing is shared, each is its own median (and is marked by its count)."""
    if not timings:
        return {}
    most = max(len(t) for t in timings.values())
    full = [t for t in timings.values() if len(t) == most]
    common = set.intersection(*(set(t) for t in full))
    ref = {s: median(t[s] for t in full) for s in common}
    ref_all = median(ref.values()) if ref else None
    out = {}
    for b, t in timings.items():
        shared = [s for s in t if s in ref]
        if len(t) == most and common:
            ms = median(t[s] for s in common)
        elif shared and ref_all:
            ms = median(t[s] / ref[s] for s in shared) * ref_all
        else:
            ms = median(t.values())
        out[b] = (ms, len(t), most)
    return out


class Verdict:
    """One rule's verdict: what the evidence says about the cells it covers."""

    __slots__ = ("status", "outcome", "tier", "evidence", "reason", "rank")

    def __init__(self, verdict: tuple, positive, uninformative):
        self.outcome, self.tier, self.evidence = verdict[:3]
        self.reason = verdict[3] if len(verdict) > 3 else None
        self.status = (SUPPORTED if self.outcome in positive else UNKNOWN if self.outcome in uninformative
                       else UNSUPPORTED)


class Answer:
    """What the evidence says about one backend for one query. `cells`: (feature set, Verdict) per component."""

    __slots__ = ("backend", "status", "tier", "reasons", "cells", "missing", "latency_ms", "shapes")

    def __init__(self, backend, status, tier, reasons, cells, missing, latency_ms, shapes):
        self.backend, self.status, self.tier, self.reasons = backend, status, tier, reasons
        self.cells, self.missing, self.latency_ms, self.shapes = cells, missing, latency_ms, shapes

    @property
    def marked(self) -> bool:
        """Ranked on fewer timing shapes than another backend of its class completed."""
        return self.shapes is not None and self.shapes[0] < self.shapes[1]


def _dtype(dtype) -> str:
    """A dtype name (`bfloat16`, `bf16`, `torch.bfloat16`) as the vocabulary spells it; ValueError otherwise."""
    s = str(dtype)
    if s.startswith("torch."):
        s = s[len("torch."):]
    s = V.DTYPE_ALIASES.get(s, s)
    if s not in V.DTYPES:
        raise ValueError(f"dtype: {dtype!r} is not one of {', '.join(V.DTYPES)}")
    return s


class Engine:
    """Queries over one matrix's capability data (see the module docstring for its shape)."""

    def __init__(self, data: dict):
        self.data = data
        self.archs = tuple(data["archs"])
        self.tier_order = V.TIER_ORDER
        self.mask = V.MASK_FEATURES
        self.qualifiers = V.QUALIFIERS
        self._rules: dict = {}
        self._blocks: dict = {}
        self._verdicts: dict = {}
        self._plans: dict = {}
        self._latencies: dict = {}
        self._select_cache: dict = {}

    # --- cells ------------------------------------------------------------------------------------

    def _verdict(self, verdict: tuple):
        v = self._verdicts.get(verdict)
        if v is None:
            v = self._verdicts[verdict] = Verdict(verdict, V.POSITIVE_OUTCOMES, V.UNINFORMATIVE_OUTCOMES)
            v.rank = self.tier_order.get(v.tier, len(self.tier_order))
        return v

    def cells(self, arch, backend, op, dtype, dims) -> dict:
        """{feature set: Verdict} of one (arch, backend, op, dtype, head sizes), built from the rules on first use."""
        key = (arch, backend, op, dtype, dims)
        got = self._blocks.get(key)
        if got is None:
            index = self._rules.get((arch, backend))
            if index is None:  # the backend's rules on this arch by (op, dtype), head sizes as (qk, v) pairs
                index = self._rules[(arch, backend)] = {}
                for archs, ops, dtypes, sizes, fsets, verdict in self.data["rules"].get(backend, ()):
                    if arch not in archs:
                        continue
                    pairs = frozenset(s if isinstance(s, tuple) else (s, s) for s in sizes)
                    for o in ops:
                        for dt in dtypes:
                            index.setdefault((o, dt), []).append((pairs, fsets, verdict))
            got = self._blocks[key] = {}
            for pairs, fsets, verdict in index.get((op, dtype), ()):
                if dims in pairs:
                    v = self._verdict(verdict)
                    for f in fsets:
                        got[f] = v
        return got

    def components(self, block, feats):
        """([(feature set, Verdict)] answering a query, [features nothing answers]) from one backend's cells.

        Qualified evidence (a cell carrying a qualifier token such as qk_rope:<n>) decides where it exists;
        otherwise the query is answered without the qualifier."""
        plans = self._plans.get(feats)
        if plans is None:
            quals = tuple(t for t in feats if t.partition(":")[0] in self.qualifiers)
            plain = tuple(t for t in feats if t not in quals)
            plans = self._plans[feats] = ([(feats, *self._plan(feats, quals))] if quals else []) + [
                (plain, *self._plan(plain, ()))]
        for i, (fs, mask, extra) in enumerate(plans):
            v = block.get(fs)
            if v is not None:
                return [(fs, v)], []
            cells, missing = [], []
            v = block.get(mask)
            if v is not None:
                cells.append((mask, v))
            else:  # evidence for the other mask mode must not answer this one
                missing.append("+".join(mask) or "no mask")
            for f, cands in extra:
                for cand in cands:
                    v = block.get(cand)
                    if v is not None:
                        cells.append((cand, v))
                        break
                else:
                    missing.append(f)
            if not missing or i == len(plans) - 1:
                return cells, missing
        raise AssertionError("unreachable: the last plan always answers")

    def _plan(self, feats, quals):
        """(mask, [(feature, cells to try in order)]) for composing `feats`; the same for every backend."""
        mask = tuple(f for f in feats if f in self.mask or f in quals)
        extra = [(f, tuple(dict.fromkeys(tuple(sorted(c)) for c in ({*mask, f}, {*self.mask, *quals, f},
                                                                       {f, *quals}))))
                 for f in feats if f not in mask]
        return mask, extra

    # --- answers and order ------------------------------------------------------------------------

    def _measured(self, arch, op, dtype, dims) -> dict:
        """{feature set: {backend: (latency_ms, shapes or None)}} of one (arch, op, dtype, head sizes)."""
        per_class = self._latencies.get(arch)
        if per_class is None:  # the arch's rankings grouped by (op, dtype, head sizes), on first use
            per_class = self._latencies[arch] = {}
            for (o, dt, hd, hdv, f), row in self.data["measured"].get(arch, {}).items():
                per_class.setdefault((o, dt, (hd, hdv)), {})[f] = {m[0]: (m[1], tuple(m[2:]) or None) for m in row}
        return per_class.get((op, dtype, dims), {})

    def answer(self, arch, backend, op, dtype, head_dim, head_dim_v, feats) -> Answer:
        dims = (head_dim, head_dim_v)
        block = self.cells(arch, backend, op, dtype, dims)
        v = block.get(feats)
        if v is not None:  # the common case: the exact cell answers
            cells, missing, status, tier = [(feats, v)], [], v.status, v.tier
            reasons = [] if status == SUPPORTED else [
                f"{fset_label(feats) if feats else 'no features'}: "
                + (f"{v.outcome} ({v.tier}): {v.reason}" if status == UNSUPPORTED else f"unknown: {v.reason}")]
        else:
            cells, missing = self.components(block, feats)
            status, reasons, tier = self._judge(cells, missing)
        latency = shapes = None
        if status == SUPPORTED:
            classes = self._measured(arch, op, dtype, dims)
            for f, _ in cells:
                hit = classes.get(f, {}).get(backend)
                if hit is None:
                    latency = shapes = None
                    break
                if latency is None or hit[0] > latency:
                    latency, shapes = hit
        return Answer(backend, status, tier, reasons, cells, missing, latency, shapes)

    @staticmethod
    def _judge(cells, missing):
        """(status, reasons, tier) of component cells: supported only if all are; the tier it rests on."""
        if not missing and cells:
            weakest = None
            for _, v in cells:
                if v.status != SUPPORTED:
                    break
                if weakest is None or v.rank > weakest.rank:
                    weakest = v
            else:  # every component supported: the weakest tier it rests on
                return SUPPORTED, [], weakest.tier
        bad = [(f, v) for f, v in cells if v.status == UNSUPPORTED]
        if bad:
            status = UNSUPPORTED
            reasons = [f"{fset_label(f) if f else 'no features'}: {v.outcome} ({v.tier}): {v.reason}"
                       for f, v in bad]
        elif missing or not cells or any(v.status == UNKNOWN for _, v in cells):
            status = UNKNOWN
            reasons = [f"{f}: no evidence" for f in missing]
            reasons += [f"{fset_label(f) if f else 'no features'}: unknown: {v.reason}" for f, v in cells
                        if v.status == UNKNOWN]
        else:
            status, reasons = SUPPORTED, []
        judged = bad or cells
        tier = None
        if judged:  # supported: the weakest tier it rests on; otherwise the strongest against it
            pick = max if status == SUPPORTED else min
            tier = pick(judged, key=lambda fv: fv[1].rank)[1].tier
        return status, reasons, tier

    def declared_ranking(self, arch, op, dtype, head_dim, head_dim_v):
        for r in self.data["declared_rankings"]:
            if arch in r[1] and op == r[2] and r[3] in (None, dtype) and (head_dim, head_dim_v) in r[4]:
                return r
        return None

    def default_rank(self, arch, backend) -> int:
        return self.data["default_rank"].get(arch, {}).get(backend, self.data["default_rank_missing"])

    def workload_order(self, arch, op, dtype, head_dim, head_dim_v, feats, hints):
        """Where the timings near the hinted shape place the cell's backends (selector_workloads.Placement), or
        None where no workload was timed for the cell or no shape is hinted."""
        feats = workload_features(op, feats)
        rows = self.data.get("workloads", {}).get(arch, {}).get((op, dtype, head_dim, head_dim_v, feats))
        if not rows or not hints:
            return None
        return place(rows, op, hints, self.data.get("workload_band", 1.0),
                     self.data.get("workload_interpolation_band", 1.0), graphs=self.data.get("graph_batches"),
                     paths=self.data.get("power_of_two_paths", ()), whole_tiles=self.data.get("whole_tiles", ()))

    def query(self, arch, op, dtype, head_dim, head_dim_v, feats, hints=None, feats_for=None):
        """(supported answers best first, every answer, the declared ranking consulted or None).

        `feats_for`: backend -> the feature tokens that backend is asked with instead of `feats` (an engine
        that calls one kernel differently, e.g. with another page size: EngineProfile).

        With workload `hints` (WORKLOAD_HINTS) and a timed workload for the cell, the supported backends are
        ordered by the timings near the hinted shape (`workload_order`): those tied with the fastest first, in
        the order without hints, then the rest of that order, then backends not timed there."""
        feats_for = feats_for or {}
        answers = [self.answer(arch, b, op, dtype, head_dim, head_dim_v, feats_for.get(b, feats))
                   for b in self.data["backends"].get(arch, ())]
        ranking = self.declared_ranking(arch, op, dtype, head_dim, head_dim_v)

        def key(a):
            default = self.default_rank(arch, a.backend)
            if a.latency_ms is not None:
                return (0, a.latency_ms, default, a.backend)
            if ranking is not None and a.backend in ranking[5]:
                return (1, ranking[5].index(a.backend), default, a.backend)
            return (2, 0, default, a.backend)

        ordered = sorted((a for a in answers if a.status == SUPPORTED), key=key)
        placed = self.workload_order(arch, op, dtype, head_dim, head_dim_v, feats, hints)
        if placed is not None:
            timed = [b for b, _ in placed.order]
            tied, plain = set(timed[:placed.ties]), {a.backend: i for i, a in enumerate(ordered)}

            def by_bucket(a):
                if a.backend in tied:
                    return (0, plain[a.backend])
                return (1, timed.index(a.backend)) if a.backend in timed else (2, plain[a.backend])

            ordered.sort(key=by_bucket)
        return ordered, answers, ranking

    def basis(self, arch, a: Answer, ranking) -> str:
        """Why a supported answer sits where it does."""
        if a.latency_ms is not None:
            mark = ""
            if a.marked:
                mark = (f", completed {a.shapes[0]} of {a.shapes[1]} timing shapes: placed by its latency relative to "
                        "the backends that completed more, on the shapes it completed (the figure is scaled to theirs)")
            return f"latency {a.latency_ms:.6g} ms, by measured latency{mark}"
        if ranking is not None and a.backend in ranking[5]:
            return f"unmeasured, by declared ranking {ranking[0]} ({'; '.join(ranking[6])})"
        return f"unmeasured, by default rank {self.default_rank(arch, a.backend)}"

    def explain_answer(self, arch, a: Answer, position, n, ranking) -> str:
        if a.status == SUPPORTED:
            ev = " | ".join(f"{fset_label(f) if f else 'no features'}: {v.evidence}" for f, v in a.cells)
            # An answer no single probe gave: each feature was probed on its own and the answers combined.
            composed = f", composed from {len(a.cells)} separately probed cells" if len(a.cells) > 1 else ""
            return (f"supported (#{position} of {n}, {a.tier}{composed}, {self.basis(arch, a, ranking)}); "
                    f"evidence: {ev}")
        if a.status == UNSUPPORTED:
            bad = [v for _, v in a.cells if v.status == UNSUPPORTED]
            items = zip(a.reasons, bad, strict=True)
            return "unsupported: " + "; ".join(f"{r} [evidence: {v.evidence}]" for r, v in items)
        return "unknown: " + "; ".join(a.reasons)

    def explain_query(self, arch, op, dtype, head_dim, head_dim_v, feats, hints=None) -> dict:
        """backend -> why it is in or out: supported ones first in selection order, then the rest by name."""
        ordered, answers, ranking = self.query(arch, op, dtype, head_dim, head_dim_v, feats, hints=hints)
        out = {a.backend: self.explain_answer(arch, a, i + 1, len(ordered), ranking) for i, a in enumerate(ordered)}
        placed = self.workload_order(arch, op, dtype, head_dim, head_dim_v, feats, hints)
        if placed is not None:
            # the fastest alone is tied with nobody
            timed, tied = dict(placed.order), dict(placed.order[:placed.ties] if placed.ties > 1 else ())
            guess = dict(placed.order[:placed.uncertain]) if placed.uncertain > 1 and not placed.exact else {}
            spread = self.data.get("workload_interpolation_band", 1.0)
            for a in ordered:
                where = (f"{timed[a.backend]:.6g} ms" if a.backend in timed else "not timed there")
                tie = ", tied with the fastest within the measurement noise" if a.backend in tied else ""
                if a.backend in guess:
                    tie = (f"{tie}, within the interpolation error ({spread:.3g}x) of the fastest: between timed "
                           f"points the timings cannot tell {', '.join(guess)} apart (timing them at the shape "
                           f"settles it: attnmatrix's benchmarks/shape_scan.py)")
                out[a.backend] += f"; placed by the workload hints' timings instead ({placed.basis()}): {where}{tie}"
        for a in sorted(answers, key=lambda a: a.backend):
            if a.backend not in out:
                out[a.backend] = self.explain_answer(arch, a, None, len(ordered), ranking)
        return out

    # --- the selector's public functions (capability tuples, argument checks, caches) ----------------

    def names_of(self, engine, op) -> dict:
        """backend -> `engine`'s name for `op`, from the data's engine_names (ValueError for an engine it lacks)."""
        table = self.data["engine_names"]
        if engine not in table:
            raise ValueError(f"names: {engine!r} is not one of {', '.join(sorted(table))} "
                             "(None: attnmatrix's backend names)")
        return table[engine].get(op, {})

    def in_engine_names(self, engine, op, backends) -> list:
        """`backends` (in order) as `engine` names them for `op`: each name where its first backend stands,
        backends the engine does not run left out."""
        names = self.names_of(engine, op)
        return list(dict.fromkeys(names[b] for b in backends if b in names))

    def _query_args(self, capability, head_size, head_size_v, op, dtype, features: dict):
        arch = arch_of(capability)
        hd = _int("head_size", head_size, 1, V.MAX_HEAD_DIM)
        hdv = hd if head_size_v is None else _int("head_size_v", head_size_v, 1, V.MAX_HEAD_DIM)
        if op not in V.OPS:
            raise ValueError(f"op: {op!r} is not one of {', '.join(V.OPS)}")
        return arch, op, _dtype(dtype), hd, hdv, features_of(**features)

    @staticmethod
    def _hints(features: dict) -> dict:
        """Take the workload hints out of `features` (checked: positive integers); None is no hint."""
        hints = {}
        for name in WORKLOAD_HINTS:
            v = features.pop(name, None)
            if v is not None:
                hints[name] = _int(name, v, 1)
        return hints

    def select_backends(self, capability, head_size, head_size_v=None, *, op="prefill", dtype="bfloat16",
                        names=None, **features):
        """Supported backends for this query on this GPU, best first (attnmatrix backend names, e.g. "fa4"; with
        `names="vllm"`, the engine's names: `in_engine_names`).

        capability is (major, minor), e.g. (9, 0); `features` are the vocabulary's query parameters
        (attnmatrix.vocabulary.QUERY_PARAMS: causal=True, sliding_window=False, ..., page_size=None), and
        optional workload hints (WORKLOAD_HINTS: num_heads, num_kv_heads, num_tokens or batch_size, seq_len or
        context_len) that order the backends by the timings of the nearest timed layer at or around that shape
        (selector_workloads) where the cell was timed; without hints the order is the matrix's. [] when nothing
        is known to work.
        """
        try:
            key = (capability, head_size, head_size_v, op, dtype, names, *sorted(features.items()))
            return [*self._select_cache[key]]
        except KeyError:
            pass
        except TypeError:  # an unhashable argument (e.g. capability as a list): answer without caching
            key = None
        hints = self._hints(features)
        hit = tuple(a.backend for a in self.query(*self._query_args(capability, head_size, head_size_v, op, dtype,
                                                                    features), hints=hints)[0])
        if names is not None:
            hit = tuple(self.in_engine_names(names, op, hit))
        if key is not None:
            if len(self._select_cache) >= CACHE_MAX:
                self._select_cache.clear()
            self._select_cache[key] = hit
        return list(hit)

    def explain(self, capability, head_size, head_size_v=None, *, op="prefill", dtype="bfloat16", names=None,
                **features):
        """Every backend known for that arch -> why it is in or out: "supported (#position of n, tier, basis);
        evidence: <evidence ids>", "unsupported: <every failing reason> [evidence: <id>]" or
        "unknown: <what nothing answers>"; "composed from N separately probed cells" where no single probe gave the
        answer; with workload hints, each one's timing at that shape. {} for an arch with no evidence. Same arguments
        as select_backends. With `names="vllm"`: each engine name -> "<backend>: <why>" for each backend it
        runs, one line each, in the same order (names with a supported backend first, in selection order)."""
        table = None if names is None else self.names_of(names, op)
        hints = self._hints(features)
        out = self.explain_query(*self._query_args(capability, head_size, head_size_v, op, dtype, features),
                                 hints=hints)
        return out if table is None else {n: "\n".join(f"{b}: {why}" for b, why in out.items() if table.get(b) == n)
                                          for n in self.in_engine_names(names, op, out)}
