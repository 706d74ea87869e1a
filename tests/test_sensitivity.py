"""Validation that can say no: every feature of the case space moves the validation answer by >= 10x
the tolerance, and fakes that each ignore one feature come out `wrong` through the real runner.

The whole-space check rebuilds each validation problem exactly as `probe_case` does (same shape, seed
and recipe) and computes, with the float32 reference, what a kernel that dropped each requested
feature would return. It fails naming every (case, feature, way of ignoring it) under the bar.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from attnmatrix.kernels.fakes import IGNORES
from attnmatrix.kernels.probe import ProbeConfig
from attnmatrix.kernels.problem import RECIPE, RECIPE_V1, VALIDATION_SHAPES, make_problem
from attnmatrix.kernels.runner import RunnerConfig, run_cases
from attnmatrix.kernels.sensitivity import BAR, active_features, feature_effects, ignoring, validation_effects
from attnmatrix.matrix.cases import DTYPES, FEATURE_SETS, FEATURES, HEAD_DIMS, OPS, Case, case_space
from attnmatrix.matrix.storage import ResultStore, read_records


def _space(op: str, dtype: str) -> list[Case]:
    return list(case_space(["cpu"], ["x"], head_dims=HEAD_DIMS, dtypes=[dtype], feature_sets=FEATURE_SETS, ops=[op]))


@pytest.mark.slow
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_feature_moves_the_validation_answer(op: str, dtype: str) -> None:
    torch.manual_seed(0)
    under, seen = [], set()
    for case in _space(op, dtype):
        for e in validation_effects(case):
            seen.add(e.feature)
            if not e.discriminates:
                under.append(f"{case.key}: {e.feature} ({e.variant}) moves the answer {e.margin:.2f}x the tolerance")
    assert not under, f"{len(under)} checks under {BAR:g}x:\n" + "\n".join(under)
    # Every feature the space asks for at this op was measured (MLA prefill is causal by definition).
    wanted = {f.partition(":")[0] for fs in FEATURE_SETS for f in fs} | ({"causal"} if op == "mla_prefill" else set())
    if op == "mla_prefill":
        wanted -= {"paged_kv", "sliding_window"}
    assert seen == wanted


def test_every_feature_has_a_way_to_be_ignored() -> None:
    p = make_problem(Case("cpu", "x", "decode", "bfloat16", 64, 64, ("causal", "gqa", "varlen", "fp8", "sinks",
                                                                       "alibi", "softcap", "sliding_window")),
                     VALIDATION_SHAPES["decode"])
    # paged_kv is exercised by its own problems, fp8_kv (fp8 K/V under a 16-bit query) by its own below;
    # qk_rope names the MLA head-dim split, not an effect to ignore
    assert set(active_features(p)) == set(FEATURES) - {"paged_kv", "qk_rope", "fp8_kv"}
    for f in FEATURES:
        if f in active_features(p):
            assert ignoring(p, f), f


@pytest.mark.parametrize("op", ["prefill", "decode"])
def test_an_fp8_kv_cache_keeps_the_query_and_its_descales_bite(op: str) -> None:
    """vLLM's kv_cache_dtype="fp8": K and V are e4m3 with descales, Q stays bf16; dropping the descales is caught."""
    p = make_problem(Case("cpu", "x", op, "bfloat16", 64, 64, ("causal", "fp8_kv")), VALIDATION_SHAPES[op])
    assert p.q.dtype == torch.bfloat16 and p.k.dtype == p.v.dtype == torch.float8_e4m3fn
    assert p.descale is not None and p.descale[0] == 1.0 and p.descale[1:] != (1.0, 1.0)
    assert "fp8_kv" in active_features(p) and "fp8" not in active_features(p)
    (e,) = [x for x in feature_effects(p) if x.feature == "fp8_kv"]
    assert e.margin >= BAR, e


def test_causal_over_one_decode_token_is_exempt_and_prefill_is_not() -> None:
    decode = validation_effects(Case("cpu", "x", "decode", "bfloat16", 64, 64, ("causal",)))
    assert [(e.feature, e.exempt is not None) for e in decode] == [("causal", True)]
    assert "masks nothing" in decode[0].exempt
    prefill = validation_effects(Case("cpu", "x", "prefill", "bfloat16", 64, 64, ("causal",)))
    assert prefill[0].exempt is None and prefill[0].margin >= BAR


@pytest.mark.parametrize("op,features,feature", [
    ("prefill", ("causal", "softcap"), "softcap"),   # logits of std 1 never reach a cap of 30
    ("decode", ("causal", "sinks"), "sinks"),        # an N(0, 1) sink beside 700 keys' mass
    ("decode", ("causal", "softcap"), "softcap"),
    ("prefill", ("causal", "fp8"), "fp8"),           # unit descales: dropping them changes nothing
])
@pytest.mark.slow
def test_version_1_problems_were_blind_and_the_check_says_so(op, features, feature) -> None:
    """The check can fail: on the previous validation problem it finds the holes it was built for."""
    case = Case("cpu", "x", op, "bfloat16", 128, 128, features)
    old = {e.feature: e for e in validation_effects(case, recipe=RECIPE_V1)}
    new = {e.feature: e for e in validation_effects(case, recipe=RECIPE)}
    assert not old[feature].discriminates, old[feature]
    assert new[feature].discriminates and new[feature].margin >= BAR, new[feature]


@pytest.mark.slow
def test_the_variants_really_differ_from_the_problem() -> None:
    """Paged and varlen ignoring are not accidentally the identity (a shuffled table, ragged lengths)."""
    for ps in (16, 64, 128, 256):
        for op in ("prefill", "decode"):
            p = make_problem(Case("cpu", "x", op, "bfloat16", 64, 64, ("causal", f"paged_kv:{ps}")),
                             VALIDATION_SHAPES[op])
            (e,) = [x for x in feature_effects(p) if x.feature == "paged_kv"]
            assert e.margin >= BAR, (ps, op, e)


# --- fakes that ignore one feature, through the isolated runner ---------------------------------------------

def _fake_cases() -> list[tuple[Case, str]]:
    """(case, expected outcome): for each fake, every standard feature set with its feature, at both ops,
    and one case without it (right answer: pass)."""
    out = []
    for feature in FEATURES:
        for fs in FEATURE_SETS:
            if not any(f.partition(":")[0] == feature for f in fs):
                continue
            if feature == "paged_kv" and fs != ("causal", "paged_kv:64"):
                continue  # one block size is enough here; the whole-space test covers all of them
            for op in ("prefill", "decode"):
                case = Case("cpu", f"fake_ignores_{feature}", op, "bfloat16", 64, 64, fs)
                exempt = feature == "causal" and op == "decode"  # one query token: causal masks nothing
                out.append((case, "pass" if exempt else "wrong"))
        out.append((Case("cpu", f"fake_ignores_{feature}", "prefill", "float16", 64, 64, ()), "pass"))
    return out


def test_fakes_that_ignore_one_feature_are_recorded_wrong(tmp_path: Path) -> None:
    assert set(IGNORES) == set(FEATURES)
    expected = dict((c.key, want) for c, want in _fake_cases())
    cases = [c for c, _ in _fake_cases()]
    cfg = RunnerConfig(workers=2, timeout_s=120, device="cpu", probe=ProbeConfig(timing=False, run_id="fakes"))
    out = tmp_path / "fakes.jsonl"
    with ResultStore(out) as store:
        summary = run_cases(cases, store, cfg)
    assert summary.ran == len(cases)
    got = {r.key: r for _, r in read_records(out)}
    wrong = {k: (got[k].outcome, got[k].reason) for k, want in expected.items() if got[k].outcome != want}
    assert not wrong, wrong
    for k, want in expected.items():
        if want == "wrong":
            assert "over tolerance" in got[k].reason and got[k].extra["problem"] == RECIPE.version


def test_a_refused_call_says_which_mask_it_was_asked_with():
    """A library's refusal of a non-causal MLA prefill call is a fact about that call: the record names its mask,
    as a record of a call that ran does (matrix/audit.py check_mla_mask)."""
    from attnmatrix.kernels.fakes import RAISE
    from attnmatrix.kernels.probe import ProbeConfig, probe_case
    from attnmatrix.matrix.cases import Case

    for feats, mask in (((), "none"), (("causal",), "causal")):
        case = Case(arch="cpu", backend="fake_raise", op="mla_prefill", dtype="bfloat16", head_dim=192,
                    head_dim_v=128, features=(*feats, "qk_rope:64"))
        rec = probe_case(case, ProbeConfig(timing=False), backend=RAISE)
        assert rec.outcome == "rejected" and rec.extra["mask"] == mask
