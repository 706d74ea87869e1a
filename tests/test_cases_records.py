"""The case space and result records: normalization, keys, and schema checks that report every problem."""

from __future__ import annotations

import json

import pytest
from attnmatrix.matrix.cases import (
    FEATURES,
    MLA_HEAD_DIMS,
    MLA_TRIPLES,
    Case,
    CaseError,
    canonical_features,
    case_space,
    normalize_arch,
    parse_head_dims,
)
from attnmatrix.matrix.records import Record, RecordError, parse_record
from attnmatrix.matrix.storage import dump_record
from conftest import DROP
from hypothesis import given
from hypothesis import strategies as st

# --- cases -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spelling", "key"),
    [("sm_90", "sm_90"), ("sm_90a", "sm_90"), ("SM90", "sm_90"), ("9.0", "sm_90"), ("sm_100a", "sm_100"),
     ("sm_100f", "sm_100"), ("10.0", "sm_100"), ("12.0", "sm_120"), ("compute_90a", "sm_90"), (" cpu ", "cpu"),
     ("8.6", "sm_86")],
)
def test_normalize_arch(spelling: str, key: str) -> None:
    assert normalize_arch(spelling) == key
    assert Case(spelling, "fa4", "prefill", "bfloat16", 128, 128).arch == key


@pytest.mark.parametrize("bad", ["hopper", "sm_9", "90", "sm_90b", "9", "9.0.1", ""])
def test_normalize_arch_rejects(bad: str) -> None:
    with pytest.raises(CaseError, match=r"^arch: "):
        normalize_arch(bad)


def test_case_features_are_canonical() -> None:
    c = Case("sm_90", "fa4", "prefill", "bfloat16", 128, 128, ("softcap", "causal", "causal"))
    assert c.features == ("causal", "softcap")
    assert c == Case("sm_90a", "fa4", "prefill", "bfloat16", 128, 128, ("causal", "softcap"))
    assert c.key == "sm_90/fa4/prefill/bfloat16/128x128/causal+softcap"
    assert Case("9.0", "fa4", "decode", "float16", 64, 64).key == "sm_90/fa4/decode/float16/64x64/none"


CASES = [
    Case("sm_90a", "fa4", "prefill", "bfloat16", 192, 128, ("gqa", "causal")),
    Case("sm_100", "trtllm_ragged", "mla_prefill", "float16", 256, 256, ("causal",)),
    Case("cpu", "sdpa_cpu", "decode", "bfloat16", 64, 64, ("paged_kv:16", "causal", "fp8")),
    Case("sm_80", "fa2", "prefill", "float16", 32, 32, ()),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.key)
def test_key_and_dict_round_trip(case: Case) -> None:
    assert Case.from_key(case.key) == case
    assert Case.from_key(case.key).key == case.key
    assert Case.from_dict(json.loads(json.dumps(case.to_dict()))) == case


_feature_tokens = st.sampled_from([f for f in FEATURES if f not in ("paged_kv", "qk_rope")]) | st.integers(1, 4096).map(
    lambda n: f"paged_kv:{n}")


@given(
    arch=st.sampled_from(["cpu", "sm_80", "sm_86a", "9.0", "sm_100f", "12.0"]),
    backend=st.from_regex(r"[a-z0-9_]{1,12}", fullmatch=True),
    op=st.sampled_from(["prefill", "decode", "mla_prefill"]),
    dtype=st.sampled_from(["bfloat16", "float16"]),
    hd=st.integers(1, 1024),
    hdv=st.integers(1, 1024),
    feats=st.lists(_feature_tokens, max_size=4),
)
def test_key_round_trip_property(arch, backend, op, dtype, hd, hdv, feats) -> None:
    c = Case(arch, backend, op, dtype, hd, hdv, tuple(feats))
    assert Case.from_key(c.key) == c


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"arch": "volta"}, "arch"),
        ({"backend": "Fa-4"}, "backend"),
        ({"backend": ""}, "backend"),
        ({"op": "train"}, "op"),
        ({"dtype": "float32"}, "dtype"),
        ({"head_dim": 0}, "head_dim"),
        ({"head_dim": 2048}, "head_dim"),
        ({"head_dim": True}, "head_dim"),
        ({"head_dim_v": 128.0}, "head_dim_v"),
        ({"features": ("causal", "flash")}, "features"),
        ({"features": ("paged_kv",)}, "features"),
        ({"features": ("paged_kv:0",)}, "features"),
        ({"features": ("causal:1",)}, "features"),
    ],
)
def test_bad_case_field_names_the_field(kwargs: dict, field: str) -> None:
    base = {"arch": "sm_90", "backend": "fa4", "op": "prefill", "dtype": "bfloat16", "head_dim": 128,
            "head_dim_v": 128, "features": ()}
    with pytest.raises(CaseError, match=rf"^{field}: "):
        Case(**{**base, **kwargs})


@pytest.mark.parametrize("key", ["sm_90/fa4/prefill/bfloat16/128/none", "sm_90/fa4/prefill/bfloat16/axb/none",
                                 "sm_90/fa4/prefill/128x128/none", ""])
def test_from_key_rejects_malformed(key: str) -> None:
    with pytest.raises(CaseError):
        Case.from_key(key)


def test_canonical_features_and_page_size() -> None:
    assert canonical_features(["paged_kv:64", "causal"]) == ("causal", "paged_kv:64")
    c = Case("sm_90", "fa2", "decode", "bfloat16", 128, 128, ("causal", "paged_kv:64"))
    assert c.page_size == 64 and c.has("paged_kv") and not c.has("softcap")


def test_parse_head_dims() -> None:
    assert parse_head_dims("64, 128,192x128") == [(64, 64), (128, 128), (192, 128)]
    for bad in ("0", "64,abc", "2048", "64x", "1x2x3"):
        with pytest.raises(CaseError, match="head dims"):
            parse_head_dims(bad)


def test_case_space_is_deterministic_and_respects_mla_rules() -> None:
    a = list(case_space(["sm_90"], ["fa4", "fa2"]))
    assert a == list(case_space(["sm_90"], ["fa4", "fa2"]))
    assert len({c.key for c in a}) == len(a)
    mla = [c for c in a if c.op == "mla_prefill"]
    assert mla and all((c.head_dim, c.head_dim_v) in MLA_HEAD_DIMS for c in mla)
    assert not any(c.has("paged_kv") or c.has("sliding_window") for c in mla)
    assert all(c.mla_triple in MLA_TRIPLES for c in mla)  # MLA prefill is asked per (qk_nope, qk_rope, v)
    assert {c.op for c in a if (c.head_dim, c.head_dim_v) == (64, 64)} == {"prefill", "decode"}


# --- records -----------------------------------------------------------------------------------


@pytest.mark.parametrize("tier", ["validated", "compiled", "declared"])
def test_valid_records_parse_and_round_trip(make_record, tier: str) -> None:
    d = make_record(tier=tier)
    rec = parse_record(d)
    assert rec.tier == tier and rec.case.key == "sm_90/fa2/prefill/bfloat16/128x128/causal"
    again = parse_record(json.loads(dump_record(rec)))
    assert again == rec
    assert dump_record(again) == dump_record(rec)


def test_record_latency_is_median(make_rec) -> None:
    assert make_rec(latency_ms=[3.0, 1.0, 2.0]).latency_ms == 2.0
    assert make_rec(latency_ms=[4.0, 1.0, 2.0, 3.0]).latency_ms == 2.5
    assert make_rec().latency_ms is None


def _problem_fields(d: dict) -> list[str]:
    with pytest.raises(RecordError) as ei:
        parse_record(d)
    return [f for f, _ in ei.value.problems]


def test_every_bad_field_is_reported_at_once(make_record) -> None:
    d = make_record(outcome="nope", schema=7, sources="not-a-list")
    d["case"]["head_dim"] = -3
    fields = _problem_fields(d)
    assert sorted(fields) == ["case.head_dim", "outcome", "schema", "sources"]


def test_three_bad_fields_three_problems(make_record) -> None:
    d = make_record(run_id=5, extra=[1])
    d["tier"] = "bogus"
    with pytest.raises(RecordError) as ei:
        parse_record(d)
    assert len(ei.value.problems) == 3, ei.value.problems
    assert {f for f, _ in ei.value.problems} == {"tier", "run_id", "extra"}
    # the message names every field too
    for f in ("tier", "run_id", "extra"):
        assert f"{f}: " in str(ei.value)


def test_declared_needs_sources(make_record) -> None:
    assert _problem_fields(make_record(tier="declared", sources=[])) == ["sources"]
    assert "sources" in _problem_fields(make_record(tier="declared", sources=[""]))


def test_non_pass_cannot_have_timings(make_record) -> None:
    d = make_record(outcome="wrong", latency_ms=1.0)
    assert _problem_fields(d) == ["timings"]
    parse_record(make_record(outcome="pass", latency_ms=1.0))


@pytest.mark.parametrize("outcome", ["wrong", "rejected", "crash", "timeout", "unavailable"])
def test_negative_outcome_needs_reason(make_record, outcome: str) -> None:
    assert _problem_fields(make_record(outcome=outcome, reason="")) == ["reason"]
    assert _problem_fields(make_record(outcome=outcome, reason=DROP)) == ["reason"]
    assert parse_record(make_record(outcome=outcome, reason="kernel: no")).reason == "kernel: no"


@pytest.mark.parametrize(
    ("tier", "outcome"),
    [("declared", "crash"), ("declared", "compiled"), ("validated", "compiled"), ("compiled", "pass"),
     ("compiled", "wrong")],
)
def test_outcome_must_fit_tier(make_record, tier: str, outcome: str) -> None:
    assert _problem_fields(make_record(tier=tier, outcome=outcome, reason="r")) == ["outcome"]


@pytest.mark.parametrize(
    ("tier", "missing"),
    [("validated", "device"), ("validated", "kernel_version"), ("validated", "torch"), ("validated", "date"),
     ("compiled", "kernel_version"), ("declared", "date")],
)
def test_required_provenance(make_record, tier: str, missing: str) -> None:
    d = make_record(tier=tier, provenance={missing: DROP})
    assert _problem_fields(d) == [f"provenance.{missing}"]


@pytest.mark.parametrize(
    ("timing", "field"),
    [({"latency_ms": 1.0}, "timings[0].shape"), ({"shape": "s", "latency_ms": 0}, "timings[0].latency_ms"),
     ({"shape": "s", "latency_ms": float("nan")}, "timings[0].latency_ms"),
     ({"shape": "s", "latency_ms": True}, "timings[0].latency_ms"),
     ({"shape": "s", "latency_ms": 1.0, "tflops": -1}, "timings[0].tflops")],
)
def test_bad_timings(make_record, timing: dict, field: str) -> None:
    assert _problem_fields(make_record(timings=[timing])) == [field]


def test_not_an_object_and_unknown_field(make_record) -> None:
    assert _problem_fields([1, 2]) == ["(record)"]
    assert _problem_fields(make_record(colour="blue")) == ["colour"]
    d = make_record()
    del d["case"]["op"]
    with pytest.raises(RecordError) as ei:
        parse_record(d)
    assert ei.value.problems[0][0] == "case" and "op" in ei.value.problems[0][1]


def test_record_from_dict_is_parse_record(make_record) -> None:
    d = make_record(tier="compiled", outcome="rejected", reason="head_dim 512 unsupported")
    assert Record.from_dict(d) == parse_record(d)
