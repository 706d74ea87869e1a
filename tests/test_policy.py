"""The resolution policy: versions, evidence tiers, composition of feature cells, backend ordering."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import pytest
from attnmatrix.generator import tables as T
from attnmatrix.matrix.backends import DEFAULT_RANK_MISSING, default_rank
from attnmatrix.matrix.evidence import Evidence, Ranking, load_backends
from attnmatrix.matrix.policy import (
    SUPPORTED,
    UNKNOWN,
    UNSUPPORTED,
    resolve,
    resolve_cell,
    version_key,
)
from attnmatrix.matrix.storage import InputError

from attnmatrix.selector_engine import features_of
from attnmatrix.vocabulary import arch_family

# Queries over a resolved matrix are the query engine's (attnmatrix.selector_engine), reached here the way the
# CLI and the pages reach it: generator.tables over the matrix's capability data.


def answer(m, arch, backend, op, dtype, head_dim, head_dim_v, features):
    return T.answer(m, T.Query(arch, op, dtype, head_dim, head_dim_v, tuple(features)), backend)


def order_backends(m, answers, arch, op, dtype, head_dim, head_dim_v):
    """The engine's order for the query the answers were made for, restricted to the answers' backends."""
    feats = next((a.cells[0].case.features for a in answers if len(a.cells) == 1), ("causal",))
    names = {a.backend for a in answers}
    return [a for a in T.query(m, T.Query(arch, op, dtype, head_dim, head_dim_v, feats))[0] if a.backend in names]

# --- versions ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "ordered",
    [
        ["4.0.0a1", "4.0.0b9", "4.0.0b36", "4.0.0rc1", "4.0.0", "4.0.1", "4.1.0", "10.0.0"],
        ["2.8.3", "2.8.3.post1", "2.8.3.post2", "2.8.4"],
        ["2.6.0", "2.11.0+cu130"],
        ["0.7.4", "0.7.10", "0.8.0"],
    ],
)
def test_version_key_orders_like_pep440(ordered: list[str]) -> None:
    for a, b in itertools.pairwise(ordered):
        assert version_key(a) < version_key(b), (a, b)
    assert sorted(reversed(ordered), key=version_key) == ordered


def test_version_key_ignores_local_and_case() -> None:
    assert version_key("2.11.0+cu130") == version_key("2.11.0") == version_key("2.11.0+CPU")
    assert version_key("4.0.0B36") == version_key("4.0.0b36")
    assert version_key(None) == version_key("") == ()
    assert version_key("") < version_key("0.0.1")


def test_newest_version_supersedes(make_rec) -> None:
    old_neg = make_rec(outcome="rejected", kernel_version="4.0.0b36", reason="head_dim 256 unsupported")
    new_pos = make_rec(kernel_version="4.0.0")
    orders = []
    for records in ([old_neg, new_pos], [new_pos, old_neg]):
        cell = resolve_cell(records)
        assert cell.status == SUPPORTED and cell.winner is new_pos
        assert len(cell.conflicts) == 1 and cell.conflicts[0].startswith("superseded by version 4.0.0: ")
        assert "4.0.0b36" in cell.conflicts[0]
        assert sorted(map(id, cell.evidence)) == sorted(map(id, records))  # every piece of evidence is kept
        orders.append([id(r) for r in cell.evidence])
    assert orders[0] == orders[1]  # in an order that does not depend on which file was read first

    old_pos = make_rec(kernel_version="2.8.3")
    new_neg = make_rec(outcome="crash", kernel_version="2.8.3.post2", reason="illegal memory access")
    cell = resolve_cell([old_pos, new_neg])
    assert cell.status == UNSUPPORTED and cell.reason == "illegal memory access"
    assert cell.conflicts == [c for c in cell.conflicts if c.startswith("superseded by version 2.8.3.post2")]


def test_versionless_declared_fact_always_counts(make_rec) -> None:
    declared_neg = make_rec(tier="declared", outcome="rejected", reason="not on this arch")
    compiled_new = make_rec(tier="compiled", kernel_version="4.0.1")
    cell = resolve_cell([compiled_new, declared_neg])
    assert cell.status == UNSUPPORTED and cell.winner is declared_neg


def test_same_outcome_across_versions_is_no_conflict(make_rec) -> None:
    cell = resolve_cell([make_rec(kernel_version="2.8.2"), make_rec(kernel_version="2.8.3")])
    assert cell.status == SUPPORTED and cell.conflicts == []
    assert cell.kernel_version == "2.8.3"


def test_superseded_conflicts_do_not_depend_on_input_order(make_rec) -> None:
    declared_pos = make_rec(tier="declared")
    new_neg = make_rec(outcome="rejected", kernel_version="2.8.3.post2", reason="no")
    old_pos = make_rec(kernel_version="2.8.3")
    results = {tuple(resolve_cell(list(p)).conflicts) for p in itertools.permutations([declared_pos, new_neg, old_pos])}
    assert len(results) == 1
    (conflicts,) = results
    assert any(c.startswith("superseded by version 2.8.3.post2") for c in conflicts)
    assert any(c.startswith("overruled (weaker evidence): declared pass") for c in conflicts)


# --- tiers -------------------------------------------------------------------------------------

# (kind, strength: lower wins, positive?)
KINDS = {
    "validated_pass": (0, True),
    "validated_rejected": (0, False),
    "validated_wrong": (0, False),
    "declared_rejected": (1, False),
    "compiled_compiled": (2, True),
    "compiled_rejected": (2, False),
    "declared_pass": (3, True),
}


def _rec_of(make_rec, kind: str):
    tier, outcome = kind.split("_")
    return make_rec(tier=tier, outcome=outcome, kernel_version=None if tier == "declared" else "4.0.0b36",
                    reason=None if outcome in ("pass", "compiled") else f"{kind} says no")


@pytest.mark.parametrize(("a", "b"), [p for p in itertools.product(KINDS, KINDS) if p[0] != p[1]])
def test_tier_precedence(make_rec, a: str, b: str) -> None:
    """validated > declared negative > compiled > declared positive; at equal strength negative wins."""
    ra, rb = _rec_of(make_rec, a), _rec_of(make_rec, b)
    expect = min((a, b), key=lambda k: (KINDS[k][0], KINDS[k][1]))
    cell = resolve_cell([ra, rb])
    winner = ra if expect == a else rb
    assert cell.winner is winner
    assert cell.status == (SUPPORTED if KINDS[expect][1] else UNSUPPORTED)
    assert cell.tier == winner.tier and cell.outcome == winner.outcome
    if KINDS[a][1] != KINDS[b][1]:
        (conflict,) = cell.conflicts
        same = KINDS[a][0] == KINDS[b][0]
        assert conflict.startswith("overruled (same tier, negative wins)" if same else "overruled (weaker evidence)")
    else:
        assert cell.conflicts == []


def test_same_tier_negative_wins_with_conflict(make_rec) -> None:
    passed = make_rec(device="NVIDIA H200", run_id="r1")
    crashed = make_rec(outcome="crash", device="NVIDIA H100", run_id="r2", reason="worker killed by signal SIGSEGV")
    for records in ([passed, crashed], [crashed, passed]):
        cell = resolve_cell(records)
        assert cell.status == UNSUPPORTED and cell.winner is crashed
        assert cell.reason == "worker killed by signal SIGSEGV"
        assert cell.conflicts == ["overruled (same tier, negative wins): validated pass on NVIDIA H200 with "
                                  "flash-attn 2.8.3.post2, 2026-11-30"]


def test_unavailable_only_is_unknown(make_rec) -> None:
    un = make_rec(outcome="unavailable", reason="cannot import flash_attn: ModuleNotFoundError")
    cell = resolve_cell([un])
    assert cell.status == UNKNOWN and cell.reason.startswith("cannot import flash_attn")
    assert cell.latency_ms is None


def test_unavailable_never_beats_informative(make_rec) -> None:
    un = make_rec(outcome="unavailable", reason="cannot import", kernel_version="9.9.9")
    declared = make_rec(tier="declared")
    cell = resolve_cell([un, declared])
    assert cell.status == SUPPORTED and cell.winner is declared and cell.conflicts == []


def test_latency_only_for_supported(make_rec) -> None:
    cell = resolve_cell([make_rec(latency_ms=[1.0, 3.0, 2.0])])
    assert cell.latency_ms == 2.0 and cell.tflops == 100.0
    assert cell.sources and cell.sources[0].startswith("validated: NVIDIA H200")


# --- answering queries -------------------------------------------------------------------------

BACKENDS = {"fa4": {"default_rank": 10}, "fa2": {"default_rank": 12}, "trtllm_ragged": {"default_rank": 20},
            "sdpa_cudnn": {"default_rank": 30}, "fake_nan": {"default_rank": 99, "test_only": True}}


def _matrix(records, rankings=()):
    return resolve(Evidence(records=list(records), where=[f"t.jsonl:{i + 1}" for i in range(len(records))],
                            rankings=list(rankings), backends=BACKENDS))


def test_exact_cell_is_preferred(make_rec) -> None:
    causal = make_rec(features=("causal",))
    softcap = make_rec(features=("causal", "softcap"), outcome="rejected", reason="softcap alone fails")
    exact = make_rec(features=("causal", "softcap", "sliding_window"))
    m = _matrix([causal, softcap, exact])
    a = answer(m, "sm_90", "fa2", "prefill", "bfloat16", 128, 128, ("causal", "sliding_window", "softcap"))
    assert a.status == SUPPORTED and [c.winner for c in a.cells] == [exact] and a.reasons == []


def test_composed_features_report_every_failing_reason(make_rec) -> None:
    m = _matrix([
        make_rec(features=("causal",), latency_ms=1.0),
        make_rec(features=("causal", "softcap"), outcome="rejected", reason="softcap: not compiled in"),
        make_rec(features=("causal", "alibi"), tier="declared", outcome="rejected", reason="no alibi argument"),
        make_rec(features=("causal", "gqa"), latency_ms=2.0),
    ])
    a = answer(m, "sm_90", "fa2", "prefill", "bfloat16", 128, 128, ("causal", "softcap", "alibi", "gqa"))
    assert a.status == UNSUPPORTED and a.latency_ms is None
    assert sorted(a.reasons) == sorted([
        "causal+softcap: rejected (validated): softcap: not compiled in",
        "alibi+causal: rejected (declared): no alibi argument",
    ])
    assert a.tier == "validated"  # the strongest evidence among the failures
    ok = answer(m, "sm_90", "fa2", "prefill", "bfloat16", 128, 128, ("causal", "gqa"))
    assert ok.status == SUPPORTED and ok.latency_ms == 2.0  # exact (causal, gqa) cell


def test_composed_supported_uses_slowest_component_and_weakest_tier(make_rec) -> None:
    m = _matrix([
        make_rec(features=(), latency_ms=1.0),
        make_rec(features=("causal", "softcap"), latency_ms=3.0),
        make_rec(features=("causal", "gqa"), tier="declared"),
    ])
    a = answer(m, "sm_90", "fa2", "prefill", "bfloat16", 128, 128, ("softcap",))
    # non-causal query: the () base cell, and softcap found on top of causal
    assert a.status == SUPPORTED and a.latency_ms == 3.0 and a.tier == "validated"
    assert [c.case.features for c in a.cells] == [(), ("causal", "softcap")]
    b = answer(m, "sm_90", "fa2", "prefill", "bfloat16", 128, 128, ("gqa", "softcap"))
    assert b.status == SUPPORTED and b.tier == "declared" and b.latency_ms is None


def test_missing_feature_is_unknown(make_rec) -> None:
    m = _matrix([make_rec(features=("causal",))])
    a = answer(m, "sm_90", "fa2", "prefill", "bfloat16", 128, 128, ("causal", "sinks", "softcap"))
    assert a.status == UNKNOWN and sorted(a.reasons) == ["sinks: no evidence", "softcap: no evidence"]
    b = answer(m, "sm_90", "fa2", "prefill", "bfloat16", 128, 128, ())
    assert b.status == UNKNOWN and b.reasons == ["no mask: no evidence"]
    c = answer(m, "sm_90", "fa2", "decode", "bfloat16", 128, 128, ("causal",))
    assert c.status == UNKNOWN and c.cells == []
    d = answer(m, "sm_100", "fa2", "prefill", "bfloat16", 128, 128, ("causal",))
    assert d.status == UNKNOWN


def test_unsupported_beats_missing(make_rec) -> None:
    m = _matrix([make_rec(features=("causal", "softcap"), outcome="rejected", reason="no")])
    a = answer(m, "sm_90", "fa2", "prefill", "bfloat16", 128, 128, ("causal", "softcap", "sinks"))
    assert a.status == UNSUPPORTED and a.reasons == ["causal+softcap: rejected (validated): no"]


def test_test_only_backends_are_left_out(make_rec) -> None:
    m = _matrix([make_rec(backend="fake_nan"), make_rec(backend="fa2")])
    assert {c.case.backend for c in m.cells.values()} == {"fa2"}


def test_features_of() -> None:
    assert features_of(causal=True, softcap=True, page_size=16) == ("causal", "paged_kv:16", "softcap")
    assert features_of(causal=False) == ()


# --- ordering ----------------------------------------------------------------------------------


def _answers(m, backends, feats=("causal",), head_dim=128):
    return [answer(m, "sm_90", b, "prefill", "bfloat16", head_dim, head_dim, feats) for b in backends]


def test_measured_latency_orders_first(make_rec) -> None:
    m = _matrix([
        make_rec(backend="fa4", latency_ms=2.0),
        make_rec(backend="fa2", latency_ms=1.0),
        make_rec(backend="sdpa_cudnn", latency_ms=1.5),
        make_rec(backend="trtllm_ragged", tier="declared"),  # supported, unmeasured: after every measured one
    ])
    ordered = order_backends(m, _answers(m, ["fa4", "fa2", "sdpa_cudnn", "trtllm_ragged"]), "sm_90", "prefill",
                             "bfloat16", 128, 128)
    assert [a.backend for a in ordered] == ["fa2", "sdpa_cudnn", "fa4", "trtllm_ragged"]


def test_declared_ranking_only_for_unmeasured(make_rec) -> None:
    ranking = Ranking(id="r", archs=("sm_90",), op="prefill", dtype="bfloat16", head_dims=((128, 128),),
                      order=("sdpa_cudnn", "trtllm_ragged", "fa4"), sources=("PR x/y#1",), statement="")
    records = [make_rec(backend=b, tier="declared") for b in ("fa4", "trtllm_ragged", "sdpa_cudnn")]
    records.append(make_rec(backend="fa2", tier="declared"))
    m = _matrix(records, [ranking])
    names = ["fa4", "fa2", "trtllm_ragged", "sdpa_cudnn"]
    got = [a.backend for a in order_backends(m, _answers(m, names), "sm_90", "prefill", "bfloat16", 128, 128)]
    # ranked backends in the declared order, then the unranked one by default_rank
    assert got == ["sdpa_cudnn", "trtllm_ragged", "fa4", "fa2"]

    # a measurement outranks the declared claim
    m2 = _matrix(records + [make_rec(backend="fa4", latency_ms=5.0, kernel_version="4.0.0b36")], [ranking])
    got = [a.backend for a in order_backends(m2, _answers(m2, names), "sm_90", "prefill", "bfloat16", 128, 128)]
    assert got == ["fa4", "sdpa_cudnn", "trtllm_ragged", "fa2"]

    # the ranking does not apply to other head dims: default_rank decides
    records64 = [make_rec(backend=b, tier="declared", head_dim=64) for b in names]
    m3 = _matrix(records64, [ranking])
    got = [a.backend for a in order_backends(m3, _answers(m3, names, head_dim=64), "sm_90", "prefill", "bfloat16",
                                             64, 64)]
    assert got == ["fa4", "fa2", "trtllm_ragged", "sdpa_cudnn"]


def test_order_drops_unsupported_and_unknown(make_rec) -> None:
    m = _matrix([
        make_rec(backend="fa4", outcome="rejected", reason="no"),
        make_rec(backend="fa2", tier="declared"),
        make_rec(backend="sdpa_cudnn", outcome="unavailable", reason="cannot import"),
    ])
    got = order_backends(m, _answers(m, ["fa4", "fa2", "sdpa_cudnn", "trtllm_ragged"]), "sm_90", "prefill",
                         "bfloat16", 128, 128)
    assert [a.backend for a in got] == ["fa2"]


# --- default rank per arch -----------------------------------------------------------------------

FA = ("fa2", "fa3", "fa4")
# What the unmeasured order must be on each arch with the embedded backends.json: vLLM's default FlashAttention
# version first (get_flash_attn_version: FA3 on capability major 9, FA4 on major 10, FA2 on every other major).
EMBEDDED_FA_ORDER = {
    "sm_80": ["fa2", "fa4", "fa3"], "sm_86": ["fa2", "fa4", "fa3"], "sm_89": ["fa2", "fa4", "fa3"],
    "sm_90": ["fa3", "fa4", "fa2"],
    "sm_100": ["fa4", "fa2", "fa3"], "sm_103": ["fa4", "fa2", "fa3"],
    "sm_110": ["fa2", "fa4", "fa3"], "sm_120": ["fa2", "fa4", "fa3"], "sm_121": ["fa2", "fa4", "fa3"],
}


def _order_on(m, arch, backends, head_dim=128):
    answers = [answer(m, arch, b, "prefill", "bfloat16", head_dim, head_dim, ("causal",)) for b in backends]
    return [a.backend for a in order_backends(m, answers, arch, "prefill", "bfloat16", head_dim, head_dim)]


def test_arch_family() -> None:
    assert [arch_family(a) for a in ("sm_80", "sm_89", "sm_90", "sm_100", "sm_103", "sm_120", "cpu", None)] == \
        ["sm_8x", "sm_8x", "sm_9x", "sm_10x", "sm_10x", "sm_12x", None, None]


def test_default_rank_int_family_and_fallback() -> None:
    backends = {"per": {"default_rank": {"*": 5, "sm_9x": 1, "sm_12x": 7}}, "flat": {"default_rank": 3}, "none": {}}
    assert [default_rank(backends, "per", a) for a in ("sm_80", "sm_90", "sm_100", "sm_120", "cpu", None)] == \
        [5, 1, 5, 7, 5, 5]
    assert {default_rank(backends, "flat", a) for a in ("sm_80", "sm_90", "cpu", None)} == {3}
    assert default_rank(backends, "none", "sm_90") == DEFAULT_RANK_MISSING
    assert default_rank(backends, "not_listed", "sm_90") == DEFAULT_RANK_MISSING


@pytest.mark.parametrize("arch", sorted(EMBEDDED_FA_ORDER))
def test_embedded_default_rank_follows_vllm_per_arch(make_rec, arch: str) -> None:
    """Nothing measured: the embedded backends.json puts FA2 first on sm_8x/sm_11x/sm_12x, FA3 on sm_90, FA4 on
    sm_10x, as vLLM's get_flash_attn_version does."""
    records = [make_rec(arch=arch, backend=b, tier="declared") for b in FA]
    m = resolve(Evidence(records=records, where=["t"] * len(records), backends=load_backends()))
    assert _order_on(m, arch, FA) == EMBEDDED_FA_ORDER[arch]


def test_measured_latency_beats_default_rank(make_rec) -> None:
    backends = load_backends()
    # sm_90: fa3 ranks first by default, but a measured fa2 (however slow) comes before every unmeasured one
    records = [make_rec(arch="sm_90", backend="fa2", latency_ms=9.0),
               make_rec(arch="sm_90", backend="fa3", tier="declared"),
               make_rec(arch="sm_90", backend="fa4", tier="declared")]
    m = resolve(Evidence(records=records, where=["t"] * 3, backends=backends))
    assert _order_on(m, "sm_90", FA) == ["fa2", "fa3", "fa4"]
    # sm_80: fa2 ranks first by default; measured fa4 wins, and among measured ones latency decides
    records = [make_rec(arch="sm_80", backend="fa4", latency_ms=2.0),
               make_rec(arch="sm_80", backend="fa3", latency_ms=1.0),
               make_rec(arch="sm_80", backend="fa2", tier="declared")]
    m = resolve(Evidence(records=records, where=["t"] * 3, backends=backends))
    assert _order_on(m, "sm_80", FA) == ["fa3", "fa4", "fa2"]


def _write_backends(tmp_path, entries: dict) -> Path:
    path = tmp_path / "backends.json"
    path.write_text(json.dumps({"schema": 1, "backends": entries}), encoding="utf-8")
    return path


@pytest.mark.parametrize(("value", "says"), [
    ("10", "neither an int nor an object"),
    (1.5, "neither an int nor an object"),
    (True, "neither an int nor an object"),
    (None, "neither an int nor an object"),
    ([10, 11], "neither an int nor an object"),
    ({"*": 1, "sm_90": 2}, "unknown key 'sm_90'"),
    ({"*": 1, "sm_9X": 2}, "unknown key 'sm_9X'"),
    ({"*": 1, "9x": 2}, "unknown key '9x'"),
    ({"*": 1, "any": 2}, "unknown key 'any'"),
    ({"*": "1"}, "the rank for '*' is '1', not an int"),
    ({"*": 1, "sm_10x": False}, "the rank for 'sm_10x' is False, not an int"),
    ({"sm_9x": 1}, "missing the \"*\" key"),
    ({}, "missing the \"*\" key"),
])
def test_malformed_default_rank_is_rejected(tmp_path, value, says: str) -> None:
    path = _write_backends(tmp_path, {"fa4": {"default_rank": 10}, "fa2": {"default_rank": value}})
    with pytest.raises(InputError) as e:
        load_backends(path)
    assert [(p.file, p.field) for p in e.value.problems] == [(str(path), "backends.fa2.default_rank")]
    assert says in e.value.problems[0].message
    # the one reader refuses it too, naming the backend and the field
    with pytest.raises(ValueError, match=r"backend 'fa2': default_rank: .*" + re.escape(says)):
        default_rank({"fa2": {"default_rank": value}}, "fa2", "sm_90")


def test_every_malformed_backend_is_reported(tmp_path) -> None:
    path = _write_backends(tmp_path, {"a": {"default_rank": "x"}, "b": {"default_rank": 1},
                                      "c": {"default_rank": {"sm_9x": 1}}, "d": "not an object"})
    with pytest.raises(InputError) as e:
        load_backends(path)
    assert [p.field for p in e.value.problems] == ["backends.a.default_rank", "backends.c.default_rank", "backends.d"]
    assert str(path) in str(e.value)


def test_well_formed_default_ranks_load(tmp_path) -> None:
    entries = {"a": {"default_rank": 3}, "b": {"default_rank": {"*": 1, "sm_8x": 2, "sm_10x": 0}}, "c": {}}
    assert load_backends(_write_backends(tmp_path, entries)) == entries



def test_an_untimed_recheck_keeps_the_cells_latency_from_the_newest_timed_record(make_rec):
    """A newer pass that could time no shape (out of memory beside other jobs) still decides the cell, but
    its latency comes from the newest timed pass of the same kernel version; not from another version."""
    old = make_rec(date="2026-11-01", latency_ms=9.0, run_id="a")
    timed = make_rec(date="2026-11-20", latency_ms=[2.0, 3.0], run_id="b")
    untimed = make_rec(date="2026-12-01", run_id="c")
    cell = resolve_cell([old, timed, untimed])
    assert cell.winner is untimed and cell.timed_by is timed
    assert cell.latency_ms == timed.latency_ms and [t.latency_ms for t in cell.timings] == [2.0, 3.0]
    newer_version = make_rec(date="2026-12-02", kernel_version="2.9.0")
    assert resolve_cell([timed, newer_version]).latency_ms is None  # another version's timing does not speak
    refused = make_rec(date="2026-12-03", outcome="rejected", reason="no")
    assert resolve_cell([timed, refused]).timings == ()  # an unsupported cell has no latency


def test_evidence_from_the_engines_call_decides_and_another_call_is_kept_as_a_conflict():
    from attnmatrix.matrix.cases import Case
    from attnmatrix.matrix.policy import resolve_cell
    from attnmatrix.matrix.records import Record

    case = Case("sm_100", "vllm_fa4", "prefill", "bfloat16", 256, 256, ("sliding_window",))
    prov = {"kernel_version": "0.33.0", "library": "vllm"}
    own_api = Record(case=case, outcome="rejected", tier="compiled", reason="needs seqused_k",
                     provenance={**prov, "date": "2026-12-01"})
    engine_call = Record(case=case, outcome="compiled", tier="compiled", provenance={**prov, "date": "2026-12-02"},
                         extra={"profile": "vllm"})
    cell = resolve_cell([own_api, engine_call])
    assert cell.status == "supported" and cell.winner is engine_call
    assert any(c.startswith("another call (not vllm's)") for c in cell.conflicts)
    # without evidence from the engine's call, the other call still answers (negative wins as before)
    assert resolve_cell([own_api]).status == "unsupported"
    # a declared refusal is the library's word on the kernel, not another call: it outranks the engine call's compile
    declared = Record(case=case, outcome="rejected", tier="declared", reason="no local attention at head dim 256",
                      provenance={"date": "2026-11-30", "source": "flash_attn/cute/interface.py"})
    cell = resolve_cell([own_api, engine_call, declared])
    assert cell.status == "unsupported" and cell.winner is declared
    assert not any(c.startswith("another call") and "no local attention" in c for c in cell.conflicts)
