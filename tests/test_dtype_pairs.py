"""One kernel's bfloat16 and float16 timings on one shape agree within matrix/validate.py DTYPE_TIMING_FACTOR, or the
pair was re-timed together (scripts/reprobe.py retime --dtype-pairs)."""

from __future__ import annotations

from attnmatrix.matrix.cases import Case
from attnmatrix.matrix.evidence import load_evidence
from attnmatrix.matrix.records import Record, Timing
from attnmatrix.matrix.validate import DTYPE_PAIR_RUN, DTYPE_TIMING_FACTOR, dtype_timing_disagreements

# Pairs whose backend the GPU re-time could not install (FlashInfer's JIT and trtllm-gen kernels were not staged):
# re-time them with `python scripts/reprobe.py retime --dtype-pairs --backends flashinfer,trtllm_decode -o OUT`
# on an H200 that has FlashInfer 0.7.4, then merge OUT and empty this set.
AWAITING_RETIME = {
    "sm_90/flashinfer/mla_prefill/256/256/causal+varlen",
    "sm_90/trtllm_decode/decode/192/192/causal+gqa",
}


def _rec(dtype: str, ms: float, run: str, date: str = "2026-12-01") -> Record:
    case = Case("sm_90", "fa2", "prefill", dtype, 128, 128, ("causal",))
    return Record(case=case, outcome="pass", tier="validated", provenance={"date": date}, run_id=run,
                  error={"max_abs_err": 0.0}, timings=(Timing("b1_s8192", ms),))


def test_a_pair_apart_is_flagged_until_retimed_together():
    apart = [_rec("bfloat16", 1.0, "a"), _rec("float16", 2.0, "b")]
    (d,) = dtype_timing_disagreements(apart)
    assert d["ratio"] == 2.0 and d["shape"] == "b1_s8192"
    within = [_rec("bfloat16", 1.0, "a"), _rec("float16", DTYPE_TIMING_FACTOR, "b")]
    assert dtype_timing_disagreements(within) == []
    # one sweep's run id is not enough: the 70 vllm_fa3 pairs of issue #26 came from one sweep
    assert dtype_timing_disagreements([_rec("bfloat16", 1.0, "s"), _rec("float16", 2.0, "s")])
    together = f"{DTYPE_PAIR_RUN}-20261202"
    newer = [_rec("bfloat16", 1.0, together, "2026-12-02"), _rec("float16", 2.1, together, "2026-12-02")]
    assert dtype_timing_disagreements(apart + newer) == []  # a measured difference, re-timed as a pair


def test_committed_matrix_has_no_pair_apart_that_was_not_retimed():
    found = {d["cell"] for d in dtype_timing_disagreements(load_evidence([]).records)}
    assert found == AWAITING_RETIME
