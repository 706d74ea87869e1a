"""Workload buckets (matrix/workloads.py) and benchmarks/regret.py's sweep and report, on the CPU."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from attnmatrix.matrix import workloads as W

ROOT = Path(__file__).resolve().parent.parent


def _regret():
    spec = importlib.util.spec_from_file_location("regret_bench", ROOT / "benchmarks" / "regret.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_point_has_a_bucket_and_held_out_points_are_not_buckets():
    for op, points in W.BUCKETS.items():
        for p in points:
            assert W.bucket_of(op, *p) == p
        for p in W.HELD_OUT[op]:
            assert p not in points
            assert W.bucket_of(op, *p) in points
    assert W.bucket_of("decode", 100, 900) == (128, 1024)
    assert W.bucket_of("prefill", 2, 6000) == (1, 8192)
    with pytest.raises(ValueError, match="no workload buckets"):
        W.bucket_of("encode", 1, 1)


def test_presets_are_the_models_files_layers_per_gpu_and_say_what_is_wrong(tmp_path):
    layers = {ly.name: ly for ly in W.load_presets()}
    g = layers["gemma-2-9b:local"]
    assert (g.head_dim, g.window, g.softcap) == (256, 4096, 50.0) and g.heads_q % g.heads_kv == 0
    assert g.features("prefill") == ("causal", "gqa", "sliding_window", "softcap")
    assert g.features("decode") == ("gqa", "sliding_window", "softcap")
    bad = tmp_path / "models.json"
    bad.write_text('{"schema": 1, "models": {"m": {"layers": []}}}')
    with pytest.raises(W.PresetError, match="m"):
        W.load_presets(bad)


@pytest.mark.slow
def test_sweep_and_report_on_the_cpu(tmp_path, monkeypatch):
    R = _regret()
    monkeypatch.setattr(W, "BUCKETS", {"prefill": ((1, 64), (2, 128)), "decode": ((2, 64), (4, 128))})
    monkeypatch.setattr(W, "HELD_OUT", {"prefill": ((1, 96),), "decode": ((3, 100),)})
    presets = tmp_path / "models.json"

    def model(kv: int, layer: dict) -> dict:
        config = {"hidden_size": 128, "num_attention_heads": 4, "num_key_value_heads": kv, "num_hidden_layers": 1,
                  "attn_logit_softcapping": layer.get("softcap")}
        return {"family": "test", "repo": "test/tiny", "file": "config.json", "source": "https://huggingface.co/test/tiny/blob/main/config.json",
                "config": config,
                "tp": 1, "layers": [{"count": 1, "num_heads": 4, "num_kv_heads": kv, "head_dim": 32, **layer}]}

    presets.write_text(json.dumps({"schema": 1, "models": {
        "tiny": model(2, {"type": "global"}), "tiny-capped": model(4, {"type": "capped", "softcap": 30.0})}}))
    out = tmp_path / "run.jsonl"
    assert R.main(["sweep", "--backends", "sdpa_cpu", "-o", str(out), "--presets", str(presets),
                   "--budget-ms", "1"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    checks = {(r["layer"], r["op"]): r["outcome"] for r in rows if r["set"] == "check"}
    assert checks[("tiny:global", "prefill")] == "pass"
    assert checks[("tiny-capped:capped", "decode")] == "rejected"  # SDPA has no softcap parameter
    timed = [r for r in rows if r["set"] != "check"]
    assert {r["rep"] for r in timed if r["set"] == "bucket"} == {0, 1}
    assert all(r["outcome"] == "pass" and r["ms"] > 0 for r in timed)
    result = R.analyse(rows)
    assert result["noise"]["pairs"] == 4 and result["noise"]["p90"] >= 1.0
    assert result["regret"]["queries"] == 2 and result["regret"]["max"] == 1.0  # one backend: its own best
    assert result["rankings"]["tiny:global prefill b2_s128"]["order"][0][0] == "sdpa_cpu"
    noise, orders = W.bucket_orders(rows)
    assert noise["pairs"] == 4 and len(orders) == 4  # the capped layer's check was refused: not ranked


def _engine_with_workloads():
    from attnmatrix import selector

    data = dict(selector.DATA)
    data["workloads"] = {"sm_90": {("decode", "bfloat16", 128, 128, ("causal", "gqa")): (
        (32, 8, 8, 1024, 1, (("fa2", 0.01), ("vllm_fa3", 0.02))),
        (32, 8, 128, 8192, 2, (("vllm_fa3", 0.50), ("fa4", 0.51), ("fa2", 0.90))),
        (8, 1, 8, 1024, 1, (("fa4", 0.01), ("fa2", 0.03))),
    )}}
    from attnmatrix.selector_engine import Engine

    return Engine(data)


def test_workload_hints_rank_by_the_nearest_timed_bucket_and_leave_the_plain_answer_alone():
    eng = _engine_with_workloads()
    plain = eng.select_backends((9, 0), 128, op="decode", causal=False, gqa=True)
    assert eng.select_backends((9, 0), 128, op="decode", causal=False, gqa=True, num_heads=None) == plain
    small = eng.select_backends((9, 0), 128, op="decode", causal=False, gqa=True, num_heads=32, num_kv_heads=8,
                                batch_size=4, context_len=2000)
    assert small[:2] == ["fa2", "vllm_fa3"] and sorted(small) == sorted(plain)
    # a tie within the noise keeps the order without hints between the tied backends
    big = eng.select_backends((9, 0), 128, op="decode", causal=False, gqa=True, num_heads=32, num_kv_heads=8,
                              num_tokens=100, context_len=10000)
    tied = [b for b in plain if b in ("vllm_fa3", "fa4")]
    assert big[:2] == tied and big[2] == "fa2"
    # head counts pick the layer: 8 query heads over 1 KV head is the second timed layer
    tp8 = eng.select_backends((9, 0), 128, op="decode", causal=False, gqa=True, num_heads=8, num_kv_heads=1,
                              batch_size=8, context_len=1024)
    assert tp8[:2] == ["fa4", "fa2"]
    with pytest.raises(ValueError, match="batch_size"):
        eng.select_backends((9, 0), 128, op="decode", gqa=True, batch_size=0, context_len=10)


def test_explain_says_composed_and_which_bucket_placed_a_backend():
    eng = _engine_with_workloads()
    why = eng.explain((9, 0), 128, op="decode", causal=False, gqa=True, num_heads=32, num_kv_heads=8, batch_size=8,
                      context_len=1024)
    bucket = "placed by the workload hints' bucket instead (heads 32/8, batch 8, length 1024): 0.01 ms, tied"
    assert bucket in why["fa2"]
    plain = eng.explain((9, 0), 128, op="decode", causal=True, gqa=True, sinks=True)
    assert any("composed from" in v for v in plain.values() if v.startswith("supported"))
    assert not any("workload" in v for v in plain.values())
