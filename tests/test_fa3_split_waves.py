"""benchmarks/fa3_split_waves.py: FA3's split rule read against vllm_fa3's decode timings, on the CPU."""

from __future__ import annotations

import json

from conftest import load_script


def _waves():
    return load_script("benchmarks/fa3_split_waves.py")


def test_the_split_rule_takes_the_fewest_splits_85_percent_as_full_as_the_fullest():
    s = _waves()
    # 32 blocks: 4 splits make 128 of 132 SMs (97%); 28 blocks: 4 splits are 84.8%, just short, so 9 (95%, 2 waves)
    assert s.splits(32, 200) == 4 and s.splits(28, 200) == 9
    assert s.splits(110, 200) == 1  # blocks that nearly fill the SMs run unsplit
    assert s.splits(28, 4) == 1  # a cache of four blocks or fewer is never split
    # gemma-2-2b's global layer (4 KV heads, head dim 256): 7 sequences take two waves, 6 and 8 one
    assert [s.waves(b, 4, 13017, 256, None) for b in (6, 7, 8, 9, 10)] == [1, 2, 1, 2, 1]
    assert s.waves(7, 4, 13017, 256, 4096) == 2  # a window bounds the cache the rule splits


def test_the_summary_pairs_batches_by_the_waves_the_rule_adds_and_lists_the_slow_batches(tmp_path, monkeypatch):
    s = _waves()

    class Layer:
        name, heads_kv, head_dim, window = "m:l", 4, 256, None

    monkeypatch.setattr(s.W, "load_presets", lambda: [Layer])
    call = {"layer": "m:l", "op": "decode", "heads_q": 8, "heads_kv": 4, "case": "c", "profile": "p"}
    fa3 = {6: 80.0, 7: 150.0, 8: 95.0}  # slow where the rule needs two waves
    rows = [{**call, "backend": b, "set": "check", "outcome": "pass"} for b in ("vllm_fa3", "fa2")]
    rows += [{**call, "backend": "vllm_fa3", "set": "scan", "outcome": "pass", "batch": b, "length": 13017, "ms": t}
             for b, t in fa3.items()]
    rows += [{**call, "backend": "fa2", "set": "scan", "outcome": "pass", "batch": b, "length": 13017, "ms": 90.0}
             for b in fa3]
    scan = tmp_path / "scan.jsonl"
    scan.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "w.json"
    assert s.main([str(scan), "-o", str(out)]) == 0
    summary = json.loads(out.read_text())
    assert summary["by_wave_change"] == {"-1": {"pairs": 1, "median": 0.633}, "1": {"pairs": 1, "median": 1.875}}
    assert summary["lines"] == [{"layer": "m:l", "context": 13017, "batches": 3, "slow_batches": [7],
                                 "over_one_wave": [7]}]
